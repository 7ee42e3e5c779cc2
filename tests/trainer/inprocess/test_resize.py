"""A world that shrank grows back (trainer/inprocess/resize.py): rank 0 of a smaller
world turns a node waiting for the next round into a resize notice; the notice ends the
round with a committed checkpoint and no node leaving; rank 0 stops the round before
any process exits. With a real store in this process; the run across nodes is
tests/multinode/test_inprocess_nodes.py's shrink-and-grow case."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from ftfleet.contract import EXIT_PREEMPTED
from ftfleet.trainer.inprocess import ranks, resize, stores
from ftfleet.trainer.inprocess.launch import free_port_pair
from ftfleet.trainer.inprocess.ranks import Layout, NodeFill
from ftfleet.trainer.resilience.notices.notice import Notice, NoticeKind, NoticeSource
from ftfleet.trainer.resilience.notices.watcher import NoticeWatcher
from ftfleet.trainer.resilience.preemption.boundary import Interruptions
from ftfleet.trainer.resilience.preemption.sequence import Preemption

KEY = stores.round_key(3, "stop")


def _fill(active: int, present: tuple[int, ...] = (0, 1, 2)) -> NodeFill:
    """Four training nodes of one rank (HSDP groups of two), ``active`` of them training;
    in a smaller world only the ``present`` nodes still have a process."""
    fill = NodeFill(Layout(4, 0, 1), min_active=2, group=2)
    fill.active = active
    if active < 4:  # the lost nodes' ranks are gone from the numbering
        fill.nodes = list(present)
    return fill


class Waiter:
    """A node waiting for the next round as :func:`stores.join` does: counted, then
    beating until stopped."""

    def __init__(self, client):
        self.index = int(client.add(stores.sibling_key(KEY, "waiting"), 1)) - 1
        self.client, self.done = client, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat(self):
        while not self.done.wait(0.02):
            self.client.add(f"{stores.sibling_key(KEY, 'waiting')}/{self.index}", 1)

    def stop(self):
        """Stop beating, before the store goes (a beat in flight would find it closed)."""
        self.done.set()
        self.thread.join(5)


@pytest.fixture
def store():
    port = free_port_pair()
    host = stores.StoreHost(port)
    yield host.trainer, port


def _poll(store, monkeypatch, active: int, rank: str = "0", present: tuple[int, ...] = (0, 1, 2)):
    client, port = store
    monkeypatch.setattr(ranks, "CURRENT", _fill(active, present))
    reported: list[Notice] = []
    stop = threading.Event()
    env = {"RANK": rank, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    poller = resize.RoundPoller(KEY, reported.append, stop, poll_s=0.02, environ=env)
    poller.start()
    return poller, reported, stop


def test_a_waiting_node_makes_rank_0_of_a_smaller_world_report_a_resize(store, monkeypatch):
    client, _ = store
    poller, reported, stop = _poll(store, monkeypatch, active=2)
    time.sleep(0.2)
    assert reported == [], "nobody waits yet"
    waiter = Waiter(client)
    poller.join(5)
    waiter.stop()
    stop.set()
    assert not poller.is_alive(), "the poller reports once, then ends"
    [notice] = reported
    assert (notice.kind, notice.source, notice.terminal, notice.node_stays) == (
        NoticeKind.RESIZE,
        NoticeSource.ROUND,
        True,
        True,
    )


@pytest.mark.parametrize(
    ("active", "rank", "present"),
    [(4, "0", (0, 1, 2)), (2, "1", (0, 1, 2)), (2, "0", (0, 1))],
    ids=["whole-world", "not-rank-0", "two-nodes-missing"],
)
def test_a_whole_world_another_rank_or_too_few_waiting_reports_nothing(store, monkeypatch, active, rank, present):
    """Two nodes lost and one waiting: the next round could not form (4 training nodes
    needed, 3 would come), so the smaller world trains on."""
    client, _ = store
    waiter = Waiter(client)
    poller, reported, stop = _poll(store, monkeypatch, active=active, rank=rank, present=present)
    time.sleep(0.3)
    stop.set()
    poller.join(5)
    waiter.stop()
    assert reported == []


def test_a_waiting_node_that_stopped_beating_is_not_counted(store, monkeypatch):
    """A node that died while it waited (or a launcher started again) left its count."""
    client, _ = store
    Waiter(client).stop()  # counted, then no beat
    poller, reported, stop = _poll(store, monkeypatch, active=2)
    time.sleep(0.3)
    assert reported == []
    waiter = Waiter(client)  # a live one: enough
    poller.join(5)
    stop.set()
    waiter.stop()
    assert [n.kind for n in reported] == [NoticeKind.RESIZE]


def test_a_store_out_of_reach_is_retried_not_fatal(monkeypatch):
    monkeypatch.setattr(ranks, "CURRENT", _fill(2))
    calls = []

    def connect():
        calls.append(1)
        raise RuntimeError("connection refused")

    stop = threading.Event()
    poller = resize.RoundPoller(KEY, lambda n: None, stop, poll_s=0.02, environ={"RANK": "0"}, connect=connect)
    poller.start()
    time.sleep(0.2)
    stop.set()
    poller.join(5)
    assert len(calls) >= 2 and not poller.is_alive()


def _resized(step: int = 40) -> dict:
    return {"exit_code": EXIT_PREEMPTED, "emergency": {"kind": "resize", "step": step}}


def test_rank_0_stops_the_round_after_a_resize_counting_the_nodes_lost_whole(store, monkeypatch):
    client, port = store
    monkeypatch.setattr(ranks, "CURRENT", _fill(2))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    assert resize.end_round(_resized(), KEY, environ={"RANK": "0"})
    assert "the round ends at step 40" in stores.stop_reason(client, 3)
    assert int(client.get(stores.sibling_key(KEY, "lost"))) == 1  # node 3: none of its ranks left


@pytest.mark.parametrize(
    ("result", "rank"),
    [(_resized(), "1"), ({"exit_code": EXIT_PREEMPTED, "emergency": {"kind": "termination"}}, "0"), ({}, "0")],
    ids=["another-rank", "a-preemption", "a-finished-run"],
)
def test_only_rank_0_and_only_a_resize_stop_the_round(monkeypatch, result, rank):
    called = []
    monkeypatch.setattr(stores, "request_stop", lambda *a, **k: called.append(a))
    assert not resize.end_round(result, KEY, environ={"RANK": rank})
    assert called == []


class _Ckpt:
    """What the preemption sequence touches of a checkpoint manager; the marker's tier
    and the stores are absent, so writing a marker fails the test."""

    def __init__(self):
        self.cfg = SimpleNamespace(enabled=True, memory=True, memory_peer_every=1)
        self.on_commit: list = []
        self.committed: set[int] = set()
        self.restored_step = None
        self.last_saved_step = None
        self.saves: list[tuple] = []
        self.closed: list[dict] = []

    def wait(self):
        pass

    def close(self, **kwargs):
        self.closed.append(kwargs)
        return True


class _NoHandoff:
    def leaving(self, noticed):
        raise AssertionError("a resize is not handed to a spare node")


class _NoLifecycle:
    outcome = None

    def complete(self):
        raise AssertionError("a resize completes no lifecycle action")


def test_a_resize_commits_the_step_and_exits_75_with_no_marker_upload_wait_or_release(monkeypatch):
    from ftfleet.trainer.resilience.preemption import sequence

    monkeypatch.setattr(sequence, "stop_agent", lambda *a: pytest.fail("a resize stops no agent"))
    ckpt = _Ckpt()
    watcher = NoticeWatcher("none")
    preemption = Preemption(
        ckpt,
        Interruptions(watcher),
        save=lambda step, reason, blocking=False, **fields: ckpt.saves.append((step, reason, blocking)),
        local_rank=0,
        environ={},
        lifecycle=_NoLifecycle(),
        handoff=_NoHandoff(),
    )
    watcher.inject(Notice.create(NoticeKind.RESIZE, NoticeSource.ROUND, resize.RESIZE_BUDGET_S))
    assert preemption.should_stop(40)
    assert not preemption.stopping.local, "no node is going away"
    assert preemption.finish(40) == EXIT_PREEMPTED
    assert ckpt.saves == [(40, "emergency", True)]
    assert ckpt.closed == [{"wait_for_upload": False, "upload_deadline": None}]
    assert preemption.summary()["kind"] == "resize"


def test_a_real_deadline_outranks_a_resize():
    resizing = Notice.create(NoticeKind.RESIZE, NoticeSource.ROUND, resize.RESIZE_BUDGET_S)
    spot = Notice.create(NoticeKind.TERMINATION, NoticeSource.AWS_SPOT, 120.0)
    from ftfleet.trainer.resilience.notices.notice import most_urgent

    assert most_urgent([resizing, spot]) is spot and not spot.node_stays


@pytest.mark.integration
@pytest.mark.parametrize(
    ("reason", "codes", "code"),
    [
        ("resize: a node waits to join the world of 2 ranks", [75, 75], 1),  # left on their own, not killed
        ("2 of 4 ranks lost and no spare to take them", [-15, -15], 1),  # stopped at once
    ],
    ids=["resize", "stop"],
)
def test_a_resizes_ranks_leave_on_their_own_and_the_launcher_exits_1(store, reason, codes, code):
    """A resize's ranks exit 75 once their checkpoint is committed: the launcher does not
    SIGTERM them (which would make the others restart in the round), and a launcher that
    does not rejoin exits 1, not 75 (no node goes away: the fleet may start it again)."""
    import signal
    import subprocess
    import sys

    from ftfleet.trainer.inprocess.launch import supervise

    client, _ = store
    client.set(stores.round_key(3, "stop"), reason)
    leave = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_DFL); time.sleep(1.0); raise SystemExit(75)"
    procs = [subprocess.Popen([sys.executable, "-c", leave]) for _ in range(2)]
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:  # supervise forwards this process's SIGTERM and SIGINT to its workers
        end = supervise(procs, client, 3, None)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert (end.stopped, end.codes, end.code) == (True, codes, code)
