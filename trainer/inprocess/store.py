"""The in-process wrapper's store, with its two endless waits polled instead of timed out.

nvidia-resiliency-ext's wrapper waits in its TCPStore for a key, one wait of a fixed
length after another, for as long as the run lasts: every process's monitor thread
for "a rank was interrupted" (``monitor_thread_interval``, 1 s here), and each warm
spare for "the run completed" (``progress_watchdog_interval``, 0.25 s). Each wait that
times out, the normal case, makes c10d's socket code log two warnings on stderr
("waitForInput: poll ... returned 0, likely a timeout"; measured in the drill's node
log, 2026-11-27: about 10 lines a second for 2 ranks and a spare, some 850,000 a day)
and raises a ``DistStoreError`` that the wrapper catches and waits again. The only
switch for those warnings, ``TORCH_CPP_LOG_LEVEL``, silences every other C++ warning
too.

:class:`QuietPrefixStore` answers the same two calls by asking the store whether the
key is set (``check``, which neither waits in the socket nor logs) every
:data:`POLL_S` seconds until the same deadline, and raises the same ``DistStoreError``
at it: the wrapper's loops, and when they see a key set, are unchanged (up to one poll
later). Every other wait (the restart's barriers) is the store's own. The wrapper
makes those calls on the store of each iteration, a ``PrefixStore`` it builds itself
from the class its module names; :func:`install` names this one there instead (the
wrapper takes no factory for it). nvidia-resiliency-ext is pinned (0.4.1); a version
whose module no longer names the class is left as it is, with its warnings.
"""

from __future__ import annotations

import datetime
import logging
import time

import torch.distributed as dist
from nvidia_resiliency_ext.inprocess import wrap
from nvidia_resiliency_ext.inprocess.store import PrefixStore

log = logging.getLogger("ftfleet.inprocess")

#: Seconds between two looks at the key: the most a set key is seen late.
POLL_S = 0.02


class QuietPrefixStore(PrefixStore):
    """The wrapper's per-iteration store, whose waits for "interrupted" and "completed"
    poll (see the module)."""

    def _poll(self, key: str, timeout: datetime.timedelta) -> None:
        deadline = time.monotonic() + timeout.total_seconds()
        while not self.check([key]):
            left = deadline - time.monotonic()
            if left <= 0:
                raise dist.DistStoreError(f"{key!r} not set within {timeout.total_seconds():g}s")
            time.sleep(min(POLL_S, left))

    def wait_for_interrupted(self, timeout: datetime.timedelta) -> None:
        self._poll(self.ANY_RANK_INTERRUPTED, timeout)

    def wait_for_completed(self, timeout: datetime.timedelta) -> None:
        self._poll(self.ANY_RANK_COMPLETED, timeout)


def install() -> bool:
    """Make the wrapper build :class:`QuietPrefixStore` for each iteration. True when it
    does (again: idempotent); False, logged, when its module does not name the class it
    was written against."""
    current = getattr(wrap, "PrefixStore", None)
    if current is QuietPrefixStore:
        return True
    if current is not PrefixStore:
        log.warning("nvidia-resiliency-ext's wrapper builds %r, not its PrefixStore: store waits unchanged", current)
        return False
    wrap.PrefixStore = QuietPrefixStore
    return True
