"""What happens on a spot notice: the preemption sequence, one module per step.

::

    notice (notices/)                    SIGTERM, AWS IMDS, GCP metadata -> a Notice
      -> boundary.py                     at each step boundary every rank asks for ...
      -> agreement.py                    ... the most urgent notice any rank holds (one all_reduce)
      -> sequence.py                     a terminal one: every rank leaves the loop at that step
      -> emergency.py                    blocking save of the step, committed; uploads until
                                         shortly before the deadline
      -> marker.py                       this node's commit marker (fast tier, then bucket)
      -> release.py                      AWS: the node's termination lifecycle action completed;
                                         this node's torchrun agent stopped (trainer/agent.py)
      -> exit 75                         ``contract.EXIT_PREEMPTED``; the process ends through
                                         ``trainer.__main__.exit_quickly``

An advisory notice (a rebalance recommendation, a live migration) takes an early
checkpoint at the boundary and training carries on. :class:`Preemption`
(``sequence.py``) runs the whole sequence in any training loop; each step's module
stands alone as well.
"""

from ftfleet.trainer.resilience.preemption.boundary import AgreedNotice, Interruptions
from ftfleet.trainer.resilience.preemption.emergency import DEADLINE_MARGIN_S, emergency_checkpoint
from ftfleet.trainer.resilience.preemption.marker import (
    MarkerWrite,
    publish_marker,
    read_local_marker,
    write_local_marker,
)
from ftfleet.trainer.resilience.preemption.release import LifecycleRelease
from ftfleet.trainer.resilience.preemption.sequence import Preemption

__all__ = [
    "DEADLINE_MARGIN_S",
    "AgreedNotice",
    "Interruptions",
    "LifecycleRelease",
    "MarkerWrite",
    "Preemption",
    "emergency_checkpoint",
    "publish_marker",
    "read_local_marker",
    "write_local_marker",
]
