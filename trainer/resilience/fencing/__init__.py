"""One generation of a run writes: a process that no longer belongs to the newest
generation of its run commits nothing more and leaves.

* ``launcher.py``: a process whose launcher (the torchrun agent, the in-process
  launcher) is gone leaves within a second, taking its child processes with it;
* ``fence.py``: each attempt of the run registers a generation in the run's store;
  a commit of an older generation, or of one that cannot reach the store to tell, is
  refused;
* ``lease.py``: one region trains a run: a lease in an object store, written with
  conditional requests, names the holder that may commit; a process whose lease ran
  out or was taken over commits nothing more;
* ``leave.py``: how a process leaves: one log line, a ``fenced`` event, exit
  :data:`~ftfleet.contract.EXIT_FENCED`.

Every commit (the manifest of a disk checkpoint and of its durable copy, of an
in-memory snapshot, the commit marker) calls :func:`check` right before it writes,
with the fence of the attempt that made the writer (:func:`current` when it was made).
"""

from __future__ import annotations

from ftfleet.trainer.resilience.fencing.fence import (
    Fence,
    Fenced,
    adopt,
    check,
    current,
    problem_of,
    refuse,
    register,
    retire,
)
from ftfleet.trainer.resilience.fencing.launcher import bind_to_launcher, bound_launcher, launcher_alive
from ftfleet.trainer.resilience.fencing.leave import leave, report_to

__all__ = [
    "Fence",
    "Fenced",
    "adopt",
    "bind_to_launcher",
    "bound_launcher",
    "check",
    "current",
    "launcher_alive",
    "leave",
    "problem_of",
    "refuse",
    "register",
    "report_to",
    "retire",
]
