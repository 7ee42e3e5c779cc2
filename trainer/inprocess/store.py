"""The in-process wrapper's store, whose two endless waits no longer time out over and over.

nvidia-resiliency-ext's wrapper waits in its TCPStore for a key, one wait of a fixed
length after another, for as long as the run lasts: every process's monitor thread
for "a rank was interrupted" (``monitor_thread_interval``, 1 s here), and each warm
spare for "the run completed" (``progress_watchdog_interval``, 0.25 s). Each wait that
times out, the normal case, makes c10d's socket code log two warnings on stderr
("waitForInput: poll ... returned 0, likely a timeout"): in the drill's node log
(2 ranks and a spare, 2026-11-27) 34 timed-out waits and 68 of its 144 lines in 16 s,
some 370,000 lines a day. The only switch for them, ``TORCH_CPP_LOG_LEVEL``, silences
every other C++ warning too.

:class:`QuietPrefixStore` answers the same two calls without a store wait that times out:

* "interrupted": a thread of its own (one per iteration, on a connection of its own)
  waits for the key without a deadline, in the store server, and sets an event; the
  monitor thread's waits of 1 s wait on that event. A set key is seen as soon as the
  store's own wait would see it, and nothing polls: asking the store every 20 ms
  instead (``check``) cost 1.2 % of a core in each process and 0.5 % in the store's
  server (measured here, 2026-11-27), about 2.5 % of this 2-core machine for 3
  processes. A run that ends leaves the thread waiting, a daemon, until the process
  exits; each restart ends the previous iteration's thread (its key is set).
* "completed": the spare looks once at the start and once at the end of each wait
  (``check``), the same cadence as its waits; the end of the run is seen up to one
  wait (0.25 s) late.

Both raise the same ``DistStoreError`` as the store at the deadline, so the wrapper's
loops are unchanged. If the waiting thread fails (its connection refused or lost), the
waits are the store's own again, warnings and all. Every other wait (the restart's
barriers) is the store's own. The wrapper builds each iteration's ``PrefixStore`` from
the class its module names; :func:`install` names this one there (the wrapper takes no
factory for it). nvidia-resiliency-ext is pinned (0.4.1); a version whose module no
longer names the class is left as it is, with its warnings.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time

import torch.distributed as dist
from nvidia_resiliency_ext.inprocess import wrap
from nvidia_resiliency_ext.inprocess.store import PrefixStore

log = logging.getLogger("ftfleet.inprocess")

#: How long the waiting thread's one store wait lasts (far beyond any run's iteration;
#: under c10d's limit of 2^31 ms); at its end it waits again.
WAIT_FOREVER = datetime.timedelta(days=7)


class QuietPrefixStore(PrefixStore):
    """The wrapper's per-iteration store, whose waits for "interrupted" and "completed"
    time out without a store wait that times out (see the module)."""

    def __init__(self, iteration: int, store: object) -> None:
        super().__init__(iteration, store)
        self._prefix = self.STORE_PREFIX.format(iteration=iteration)
        self._interrupted = threading.Event()
        self._waiter: threading.Thread | None = None
        self._waiter_failed = False
        self._lock = threading.Lock()

    def _wait_in_server(self) -> None:
        try:
            base = self.base_store
            client = dist.TCPStore(base.host, base.port, is_master=False, timeout=datetime.timedelta(seconds=60))
            own = dist.PrefixStore(self._prefix, client)
            while True:
                try:
                    own.wait([self.ANY_RANK_INTERRUPTED], WAIT_FOREVER)
                    break
                except dist.DistStoreError:  # a week without a failure: wait again
                    continue
        except Exception as exc:  # noqa: BLE001 - the store's own waits take over
            log.warning(
                "in-process store: waiting for interruptions on a connection of its own failed (%s): "
                "the wrapper's timed waits take over",
                exc,
            )
            self._waiter_failed = True
        self._interrupted.set()

    def wait_for_interrupted(self, timeout: datetime.timedelta) -> None:
        with self._lock:
            if self._waiter is None:
                self._waiter = threading.Thread(target=self._wait_in_server, name="ftfleet-store-waiter", daemon=True)
                self._waiter.start()
        if not self._interrupted.wait(timeout.total_seconds()):
            raise dist.DistStoreError(f"{self.ANY_RANK_INTERRUPTED!r} not set within {timeout.total_seconds():g}s")
        if self._waiter_failed:
            super().wait_for_interrupted(timeout)

    def wait_for_completed(self, timeout: datetime.timedelta) -> None:
        key = [self.ANY_RANK_COMPLETED]
        if self.check(key):
            return
        time.sleep(timeout.total_seconds())
        if not self.check(key):
            raise dist.DistStoreError(f"{self.ANY_RANK_COMPLETED!r} not set within {timeout.total_seconds():g}s")


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
