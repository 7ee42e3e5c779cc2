"""How often to checkpoint.

* ``adaptive.py``: Young's and Daly's optimum, fed with the measured cost of a save
  and the interruption rate;
* ``prior.py``: the fleet's observed interruption rate as the optimum's prior;
* ``schedule.py``: the reference loop's save schedule, the interval applied.
"""

from ftfleet.trainer.resilience.interval.adaptive import (
    AdaptiveInterval,
    IntervalConfig,
    daly_interval,
    young_interval,
)

__all__ = ["AdaptiveInterval", "IntervalConfig", "daly_interval", "young_interval"]
