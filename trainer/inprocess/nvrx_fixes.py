"""Corrections to the pinned nvidia-resiliency-ext (0.4.1) that the fleet path needs,
applied by the worker before it builds the wrapper (the wrapper's monitor process is
forked from it afterwards, and inherits them).

* ``StoreMixin.get_initial_ranks`` returns the store's raw bytes. The sibling monitor
  (``sibling_monitor.py``), which marks ranks whose heartbeats stopped as terminated
  (a whole node lost: its processes and their monitor processes gone at once), passes
  them to the termination barrier, which records ``b'1'`` for rank 1; every process then
  fails at the job's end parsing it (``int("b'1'")``). Here the method returns ints,
  which is what its annotation says.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The release these corrections are for; another one is left as it is.
FOR_VERSION = "0.4.1"


def apply() -> bool:
    """Apply the corrections when the installed release is :data:`FOR_VERSION`; True if applied."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        if version("nvidia-resiliency-ext") != FOR_VERSION:
            return False
    except PackageNotFoundError:
        return False
    from nvidia_resiliency_ext.inprocess.store import StoreMixin

    def get_initial_ranks(self, ranks: Iterable[int]) -> list[int]:
        return [int(value) for value in self.multi_get([self.INITIAL_RANK.format(rank=rank) for rank in ranks])]

    StoreMixin.get_initial_ranks = get_initial_ranks
    return True
