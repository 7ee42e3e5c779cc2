"""Steps that go wrong without a notice: bad losses and gradients, and hangs.

* ``detector.py``: the anomaly rule (non-finite or spiking loss or gradient norm) and
  its policy, skip or roll back, bounded so that it never loops;
* ``guard.py``: the rule applied in the reference loop, agreed across ranks, on the
  device where the optimizer can skip there;
* ``device_check.py``: the rule evaluated in device tensors;
* ``watchdog.py``: no step progress for too long: dump every thread's stack and exit.
"""

from ftfleet.trainer.resilience.anomaly.detector import (
    Action,
    AnomalyConfig,
    AnomalyDetector,
    Decision,
    RepeatedAnomalyError,
)
from ftfleet.trainer.resilience.anomaly.watchdog import Watchdog, WatchdogConfig

__all__ = [
    "Action",
    "AnomalyConfig",
    "AnomalyDetector",
    "Decision",
    "RepeatedAnomalyError",
    "Watchdog",
    "WatchdogConfig",
]
