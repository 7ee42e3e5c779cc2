"""One generation of a run writes: a process that no longer belongs to its run commits
nothing more and leaves.

* ``launcher.py``: a process whose launcher (the torchrun agent, the in-process
  launcher) is gone leaves within a second, taking its child processes with it;
* ``leave.py``: how it leaves: one log line, a ``fenced`` event, exit
  :data:`~ftfleet.contract.EXIT_FENCED`.

Every commit (the manifest of a disk checkpoint, of an in-memory snapshot, the commit
marker) calls :func:`check_launcher` right before it writes.
"""

from __future__ import annotations

from ftfleet.trainer.resilience.fencing.launcher import bind_to_launcher, bound_launcher, launcher_alive
from ftfleet.trainer.resilience.fencing.leave import leave, report_to

__all__ = ["bind_to_launcher", "bound_launcher", "check_launcher", "launcher_alive", "leave", "report_to"]


def check_launcher(what: str) -> None:
    """Right before a commit of ``what``: leave instead (exit EXIT_FENCED) when this
    process's launcher is gone."""
    if not launcher_alive():
        leave(f"{what} refused: the launcher (pid {bound_launcher()}) is gone", refused=what)
