"""The job's stores and its rounds: where the nodes of an in-process job meet.

Two TCP stores, hosted by one process that must outlive every rank (the coordinator's
``--nproc 0 --host-stores`` launcher on the fleet; on one machine, the launcher itself):

* the trainer's, on ``MASTER_PORT``: the ranks' process groups (a fresh prefix per
  attempt), the run's generation (:mod:`~ftfleet.trainer.resilience.fencing`), and the
  rounds' keys below. It lives as long as its host.
* the wrapper's, on ``MASTER_PORT + 1 + round % 2``: nvidia-resiliency-ext's state of one
  round (iterations, barriers, heartbeats, terminated ranks). A round's wrapper store is
  new: the one of two rounds before is closed when it opens, the previous one is left to
  the processes still ending in it.

A **round** is one wrapper world: every node of the layout, started together. It ends
when the job cannot go on in place (:data:`stop key <round_key>` set by a worker, when
no spare is left to take a lost rank); the launchers stop their workers and join the
next round (or exit, and the fleet starts them again), which the host opens once every
node of the stopped round has either left it or was lost, and at most
:data:`STOP_GRACE_S` after the stop. A round forms with the nodes there: its training
nodes and the spare nodes that registered by then (:func:`join`). A node that registers
after it formed (a replacement booted after the job started: the wrapper world cannot
grow) waits for the next round; where the world shrank, that round comes at the next
step boundary (:mod:`.resize`).

Keys, in the trainer's store: ``ftfleet/inprocess/round`` (a counter: the round open
now), and per round ``r<R>/ready`` (its wrapper store is up), ``r<R>/nodes`` (node slots
taken, a counter), ``r<R>/prefer/<i>`` and ``r<R>/slot/<i>`` (the slot the ``i``-th
node to register asks for, and the one it got), ``r<R>/size`` (nodes in the round,
once it formed), ``r<R>/stop``
(why the job stops), ``r<R>/lost`` (nodes the stop found gone, every rank of theirs
terminated: a counter), ``r<R>/done`` (launchers that left the round: a counter),
``r<R>/waiting`` (nodes that registered after it formed and wait for the next round,
warm: a counter) and ``r<R>/waiting/<i>`` (the ``i``-th one's beat, a counter it adds to
while it waits; a world that shrank ends the round to take them in, :mod:`.resize`).
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from collections.abc import Callable

import torch.distributed as dist

ROUND_KEY = "ftfleet/inprocess/round"
#: Seconds from a round's stop to the next round at most: the launchers stop their
#: workers (SIGTERM, SIGKILL 2 s later) and leave the round before a new one opens; a
#: node that is gone but was not counted lost (its launcher hung) is not waited for longer.
STOP_GRACE_S = 5.0
#: How long a launcher waits for the job's stores to answer (the coordinator may boot
#: after the nodes).
STORE_WAIT_S = 120.0


def round_key(round_: int, name: str) -> str:
    return f"ftfleet/inprocess/r{round_}/{name}"


def sibling_key(key: str, name: str) -> str:
    """The key ``name`` of the round that ``key`` (one of its keys) belongs to."""
    return f"{key.rpartition('/')[0]}/{name}"


def wrapper_port(port: int, round_: int) -> int:
    """The wrapper store's port in round ``round_`` (``port``: the trainer's store)."""
    return port + 1 + round_ % 2


def _listen(port: int) -> dist.TCPStore:
    # The host listens on every address: the other nodes reach it at MASTER_ADDR.
    return dist.TCPStore(
        "0.0.0.0", port, None, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=300)
    )


class StoreHost:
    """Hosts the trainer's store on ``port`` and the current round's wrapper store."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.trainer = _listen(port)
        self.round = int(self.trainer.add(ROUND_KEY, 0))
        self.wrappers: dict[int, dist.TCPStore] = {}
        self._open()

    def _open(self) -> None:
        where = wrapper_port(self.port, self.round)
        self.wrappers.pop(where, None)  # two rounds old: its processes are long gone
        self.wrappers[where] = _listen(where)
        self.trainer.set(round_key(self.round, "ready"), "1")

    def next_round(self) -> int:
        self.round = int(self.trainer.add(ROUND_KEY, 1))
        self._open()
        return self.round

    def serve(self, stopping: list, poll_s: float = 0.1) -> int:
        """Serve until ``stopping`` is non-empty (a signal handler appends to it), opening
        the next round once every node of a stopped round has left it or was lost, at
        most :data:`STOP_GRACE_S` after the stop."""
        stopped_at = None
        while not stopping:
            if stopped_at is None and self.trainer.check([round_key(self.round, "stop")]):
                stopped_at = time.monotonic()
            if stopped_at is not None and (time.monotonic() - stopped_at >= STOP_GRACE_S or self._all_left()):
                print(f"ftfleet.inprocess: round {self.next_round()} open", file=sys.stderr, flush=True)
                stopped_at = None
            time.sleep(poll_s)
        return 0

    def _all_left(self) -> bool:
        """Whether every node of the current round has left it (``done``) or was lost."""
        size_key = round_key(self.round, "size")
        if not self.trainer.check([size_key]):  # a static layout: no count to go by
            return False
        size = int(self.trainer.get(size_key))
        done = int(self.trainer.add(round_key(self.round, "done"), 0))
        lost = int(self.trainer.add(round_key(self.round, "lost"), 0))
        return done + lost >= size


def connect(addr: str, port: int, wait_s: float = STORE_WAIT_S) -> dist.TCPStore:
    """A client of the trainer's store (raises RuntimeError when it does not answer)."""
    return dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=wait_s))


#: Seconds a round waits, once its training nodes have registered, for spare nodes
#: before it forms without the missing ones (they join the next round).
SETTLE_S = 10.0
#: The same after a stop (round 1 on): the nodes of the round before are up and come
#: back within a second, and the job does not wait long for one that does not.
RESETTLE_S = 2.0


def join(
    store: dist.TCPStore,
    training: int,
    spares: int,
    node_rank: int | None,
    settle_s: float = SETTLE_S,
    poll_s: float = 0.05,
    prefer: int | None = None,
    on_wait: Callable[[], None] | None = None,
) -> tuple[int, int, int]:
    """Join the open round: ``(round, node slot, spare nodes in the round)``.

    With ``node_rank`` None, take the next free slot: the first ``training`` nodes to
    register train, the next ones, up to ``spares``, wait as spare nodes. The round forms
    when all have registered, or ``settle_s`` after the last training node did, with the
    spare nodes there by then (the node that registered last of the training ones
    decides, once, in the store: ``r<R>/size``; after round 0, at most
    :data:`RESETTLE_S` after it). A node that finds the round full or
    formed waits for the next round, and so does one that finds the round stopped. With a
    ``node_rank`` (a static layout) the round has every node.

    Slots: the deciding node gives each node of the round its slot
    (:func:`assign_slots`): ``prefer`` (the training slot whose ranks this node trained in
    the round before: its shared memory holds their snapshots) where no node before it
    asked for the same, the others in the order they registered. ``on_wait`` runs once,
    when this node first waits for a next round, before it counts itself as waiting
    (the launcher warms its processes then)."""
    announced = beat = None
    most = training + spares
    while True:
        round_ = int(store.add(ROUND_KEY, 0))
        store.wait([round_key(round_, "ready")])
        if store.check([round_key(round_, "stop")]):  # stopped: the host opens the next one soon
            time.sleep(poll_s)
            continue
        if node_rank is not None:
            return round_, node_rank, spares
        index = int(store.add(round_key(round_, "nodes"), 1)) - 1
        store.set(round_key(round_, f"prefer/{index}"), str(-1 if prefer is None else prefer))
        settle = settle_s if round_ == 0 else min(settle_s, RESETTLE_S)
        size = _formed(store, round_, index, training, most, settle, poll_s) if index < most else 0
        if index < size:
            return round_, int(store.get(round_key(round_, f"slot/{index}"))), size - training
        if announced != round_:
            print(
                f"ftfleet.inprocess: round {round_} formed without this node; waiting for the next round",
                file=sys.stderr,
                flush=True,
            )
            announced = round_
            if on_wait is not None:  # warm before it counts itself: a resize may follow at once
                on_wait, wait_once = None, on_wait
                wait_once()
            # A world that shrank ends the round for the waiting nodes that beat (.resize).
            beat = round_key(round_, f"waiting/{int(store.add(round_key(round_, 'waiting'), 1)) - 1}")
        while int(store.add(ROUND_KEY, 0)) == round_:
            store.add(beat, 1)
            time.sleep(0.2)


def assign_slots(prefer: list[int], training: int) -> list[int]:
    """The slot of each of a round's nodes, in the order they registered: the training
    slot a node asks for (``prefer[i]``; -1: none) unless an earlier one has it, then
    the slots left, lowest first, to the others in order. Every slot below
    ``len(prefer)`` is taken once."""
    count = len(prefer)
    slots: list[int | None] = [None] * count
    for i, want in enumerate(prefer):
        if 0 <= want < min(training, count) and want not in slots:
            slots[i] = want
    free = iter([s for s in range(count) if s not in slots])
    return [s if s is not None else next(free) for s in slots]


#: Seconds the deciding node waits for a registered node's ``prefer`` key (set right
#: after it registered; one that died in between gets no preference).
PREFER_WAIT_S = 5.0


def _formed(
    store: dist.TCPStore, round_: int, index: int, training: int, most: int, settle_s: float, poll_s: float
) -> int:
    """The round's number of nodes, once it has formed (see :func:`join`)."""
    key = round_key(round_, "size")
    if index == training - 1:  # the last training node to register: it forms the round
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and int(store.add(round_key(round_, "nodes"), 0)) < most:
            time.sleep(poll_s)
        count = min(int(store.add(round_key(round_, "nodes"), 0)), most)
        prefer = []
        for i in range(count):
            wanted, until = round_key(round_, f"prefer/{i}"), time.monotonic() + PREFER_WAIT_S
            while not store.check([wanted]) and time.monotonic() < until:
                time.sleep(poll_s)
            prefer.append(int(store.get(wanted)) if store.check([wanted]) else -1)
        for i, slot in enumerate(assign_slots(prefer, training)):
            store.set(round_key(round_, f"slot/{i}"), str(slot))
        store.compare_set(key, "", str(count))
    store.wait([key])
    return int(store.get(key))


def request_stop(key: str, reason: str, lost_nodes: int = 0) -> None:
    """Tell every node's launcher that the job cannot go on (a worker's call, with its
    round's stop key; the stores' address is MASTER_ADDR:MASTER_PORT), counting the
    ``lost_nodes`` whose launchers will not leave the round (the round's ``lost``; every
    rank that computes the same stop counts them once, compare-set). Best effort: a store
    out of reach means the launchers are ending anyway."""
    try:
        store = connect(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), wait_s=10)
        if lost_nodes:
            store.compare_set(sibling_key(key, "lost"), "", str(lost_nodes))
        store.set(key, reason)
    except (RuntimeError, KeyError, ValueError) as exc:
        print(f"ftfleet.inprocess: could not ask the launchers to stop ({exc})", file=sys.stderr, flush=True)


def stop_reason(store: dist.TCPStore, round_: int) -> str | None:
    """Why round ``round_`` stops, or None (also when the host is out of reach: then the
    wrapper's own timeouts decide)."""
    key = round_key(round_, "stop")
    try:
        if store.check([key]):
            return store.get(key).decode(errors="replace")
    except RuntimeError:
        return None
    return None
