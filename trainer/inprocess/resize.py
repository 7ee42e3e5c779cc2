"""A world that shrank grows back when capacity returns.

With ``--min-ranks`` (and HSDP's ``--group-size``) a lost node whose ranks no spare can
take drops its block of ranks: the others train on as a smaller world
(:func:`~ftfleet.trainer.inprocess.ranks.reassign`). A round's wrapper world cannot
grow, so a node that registers while the round runs (a replacement booted, a
partitioned node back and fenced) waits for the next round, and its launcher counts
itself in the round's ``waiting`` key (:func:`~ftfleet.trainer.inprocess.stores.join`).
Growing back is a planned end of the round:

1. rank 0 of a world that shrank polls that key once a second (:class:`RoundPoller`,
   a notice source of its watcher, :func:`watch_round`) and, once enough nodes wait,
   alive, for the next round to form, reports a
   :attr:`~ftfleet.trainer.resilience.notices.notice.NoticeKind.RESIZE` notice;
2. the ranks agree on it at the next step boundary, as on any notice, and commit a
   checkpoint of that step to the fast tier (blocking; no commit marker, no wait for
   the durable upload, no hand-off: every node stays);
3. each rank leaves the run with exit 75, rank 0 having set the round's stop key first
   (:func:`end_round`, which also counts the nodes lost whole): every launcher joins
   the next round, also one whose processes only waited (a dropped group's survivors,
   a spare node's), since the stop precedes their exit;
4. the next round forms with the waiting node at the full world shape and restores
   from that checkpoint, resharded (the snapshots in memory are of the smaller world):
   nothing is computed again, and the data position, kept in global samples, goes on
   at the next sample.

A waiting node counts itself once its warm processes are ready (torch imported, the
trainer loaded), so the job pauses for the round change, not for the node's start, and
beats while it waits: one that died or whose launcher started again is not counted.
Without a smaller world there is nothing to grow: a node that waits while the world is
whole joins the next round (as a spare node) when one opens for another reason. Nor
without checkpoints, or a run that does not load the newest (``checkpoint.load``,
``load_step``): nothing would carry the state across rounds. The next round forms once
the layout's training nodes are there: a waiting node that dies between the resize and
the round leaves the job waiting for another.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ftfleet.trainer.inprocess import ranks, stores
from ftfleet.trainer.resilience.notices.notice import Notice, NoticeKind, NoticeSource

log = logging.getLogger("ftfleet.inprocess")

#: Seconds between two looks at the round's ``waiting`` key (rank 0 of a smaller world
#: alone looks: one store read per second for the job).
POLL_S = 1.0
#: How the round's stop reason of a resize begins (the launchers let its ranks leave on
#: their own).
RESIZE_REASON = "resize:"
#: The resize notice's budget. It has no deadline of its own; a long one keeps any
#: notice with a real deadline more urgent than it.
RESIZE_BUDGET_S = 3600.0


def shrunk(fill: ranks.NodeFill | None) -> bool:
    """The job trains on fewer ranks than its layout's training ranks now."""
    return fill is not None and 0 < fill.active < fill.layout.active


class RoundPoller(threading.Thread):
    """Reports a resize notice once enough nodes wait for the next round for it to
    form (with the nodes that have a process in this one: the layout's training nodes),
    each alive (its beat goes on), while this process, rank 0, trains a world that
    shrank (a notice source,
    :data:`~ftfleet.trainer.resilience.notices.watcher.SourceFactory`'s shape). Ends at
    once on any other rank, and after its one report."""

    def __init__(
        self,
        stop_key: str,
        report: Callable[[Notice], None],
        stop: threading.Event,
        *,
        poll_s: float = POLL_S,
        environ: Mapping[str, str] | None = None,
        connect: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(name="ftfleet-round", daemon=True)
        self.key = stores.sibling_key(stop_key, "waiting")
        self.report = report
        self.stop_event = stop
        self.poll_s = poll_s
        env = os.environ if environ is None else environ
        self.rank0 = env.get("RANK") == "0"
        self._beats: dict[int, int] = {}
        self._connect = connect or (lambda: stores.connect(env["MASTER_ADDR"], int(env["MASTER_PORT"]), wait_s=10))

    def abort(self) -> None:
        """Nothing to cut: the thread wakes within a poll of its stop event."""

    def run(self) -> None:
        if not self.rank0:
            return
        store, warned = None, False
        while not self.stop_event.wait(self.poll_s):
            if not shrunk(ranks.CURRENT):
                continue
            fill = ranks.CURRENT
            try:
                store = store or self._connect()
                live = self.live_waiting(store)
            except (RuntimeError, OSError, KeyError, ValueError) as exc:
                if not warned:
                    log.warning("cannot read the round's waiting nodes (%s): the world grows back once it can", exc)
                    warned = True
                store = None
                continue
            present = len(set(fill.nodes))  # nodes with a process in the round: they join the next
            if live and present + live >= fill.layout.training_nodes:
                self.report(Notice.create(NoticeKind.RESIZE, NoticeSource.ROUND, RESIZE_BUDGET_S))
                return

    def live_waiting(self, store: Any) -> int:
        """Waiting nodes whose beat (``waiting/<i>``, :func:`~ftfleet.trainer.inprocess.stores.join`)
        went on since the previous look: a node that died, or a launcher started again
        while it waited, is not counted. None count at the first look."""
        live = 0
        for i in range(int(store.add(self.key, 0))):
            beat = int(store.add(f"{self.key}/{i}", 0))
            live += beat > self._beats.get(i, beat)
            self._beats[i] = beat
        return live


def watch_round(stop_key: str | None) -> None:
    """Make every notice watcher of this process (one per attempt) poll the round whose
    stop key is ``stop_key`` (None: none, e.g. a run whose state would not carry over to
    the next round: without checkpoints, or not loading the newest)."""
    if stop_key is None:
        return
    from ftfleet.trainer.resilience.notices.watcher import add_process_source

    add_process_source(lambda report, clear, stop: RoundPoller(stop_key, report, stop))


def end_round(result: Mapping[str, Any], stop_key: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """After a run ended for a resize notice (``result``: what ``train`` returned), rank 0
    stops the round (``stop_key``) before any process exits, counting the nodes none of
    whose processes is left. Returns whether it did."""
    env = os.environ if environ is None else environ
    emergency = result.get("emergency") or {}
    if emergency.get("kind") != NoticeKind.RESIZE or stop_key is None or env.get("RANK") != "0":
        return False
    fill = ranks.CURRENT
    lost = len(set(range(fill.layout.nodes)) - set(fill.nodes)) if fill is not None else 0
    active = fill.active if fill is not None else "?"
    step = emergency.get("step")
    stores.request_stop(
        stop_key,
        f"{RESIZE_REASON} a node waits to join the world of {active} ranks; the round ends at step {step}, committed",
        lost_nodes=lost,
    )
    return True
