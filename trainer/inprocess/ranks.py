"""Which process trains which rank after a failure, node by node.

An in-process job spans ``nodes`` launchers (one per machine): ``training_nodes`` whose
processes train, then ``spare_nodes`` whose processes wait warm; each launcher starts
``nproc`` processes, plus ``spares`` spare processes beside them. The initial ranks are
laid out so that the ranks a node trains are consecutive (torchrun's numbering, which
the snapshot ring, :class:`~ftfleet.trainer.checkpoint.memory.peers.Ring`, assumes):

* node ``n``'s process ``i < nproc``: rank ``n * nproc + i`` (training nodes first, so
  ranks ``0 .. training_nodes * nproc - 1`` train; then the spare nodes');
* node ``n``'s spare process ``j``: rank ``nodes * nproc + n * spares + j``.

After a failure every process computes the same new numbering from the same inputs (the
node of each current rank, the terminated ranks), :func:`reassign`:

* a survivor keeps its rank;
* a rank whose node still runs is taken by a spare process of that node (in place, its
  snapshot is in the node's shared memory);
* the ranks of a lost node are taken together, in order, by the processes of one spare
  node (whole-node replacement: the peers' copies of the lost ranks' snapshots restore
  them, and the new node's ranks stay consecutive);
* otherwise by any waiting process, the lowest rank first.

A hole nobody can fill either shrinks the world (survivors renumbered in order, at least
``min_active`` ranks: another trajectory; with ``group`` G > 1, by whole blocks of G
consecutive ranks, HSDP's replica groups, so that the groups left stay whole and the
survivors of a broken one wait as spares) or, by default, stops the job: every process
goes inactive and :attr:`Plan.stop` says why; the worker tells the launchers, which end
the job so that the fleet starts it again (with the snapshots, the peers' copies and the
disk tiers to restore from).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Layout:
    """How an in-process job's processes are spread over its nodes (the module's numbering)."""

    training_nodes: int
    spare_nodes: int
    nproc: int
    spares: int = 0

    def __post_init__(self) -> None:
        if self.training_nodes < 1 or self.spare_nodes < 0 or self.nproc < 1 or self.spares < 0:
            raise ValueError(f"{self.encode()}: use at least 1 training node and 1 process per node, 0 or more spares")

    @property
    def nodes(self) -> int:
        return self.training_nodes + self.spare_nodes

    @property
    def world_size(self) -> int:
        """Every process of every node: the wrapper's world."""
        return self.nodes * (self.nproc + self.spares)

    @property
    def active(self) -> int:
        """Ranks that train: the training nodes' processes."""
        return self.training_nodes * self.nproc

    def rank(self, node: int, local: int) -> int:
        """The initial rank of node ``node``'s ``local``-th process (spares after ``nproc``)."""
        if not (0 <= node < self.nodes and 0 <= local < self.nproc + self.spares):
            raise ValueError(f"node {node} process {local}: outside {self.encode()}")
        if local < self.nproc:
            return node * self.nproc + local
        return self.nodes * self.nproc + node * self.spares + (local - self.nproc)

    def node_of(self, rank: int) -> int:
        """The node whose launcher started initial rank ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank}: outside {self.encode()}")
        first_spare = self.nodes * self.nproc
        return rank // self.nproc if rank < first_spare else (rank - first_spare) // self.spares

    def encode(self) -> str:
        """``training:spare:nproc:spares``, as the launcher passes it to its workers."""
        return f"{self.training_nodes}:{self.spare_nodes}:{self.nproc}:{self.spares}"

    @classmethod
    def parse(cls, text: str) -> Layout:
        parts = text.split(":")
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            raise ValueError(f"{text!r}: expected training_nodes:spare_nodes:nproc:spares (four integers)")
        return cls(*(int(p) for p in parts))


@dataclasses.dataclass(frozen=True)
class Plan:
    """A restart's numbering: ``order[new_rank]`` is the current rank that takes it;
    ranks below ``active`` train. ``stop`` (a reason) when the job cannot go on."""

    order: tuple[int, ...]
    active: int
    stop: str | None = None

    def new_rank(self, rank: int) -> int:
        return self.order.index(rank)


def reassign(
    nodes: Sequence[int], target: int, terminated: Collection[int], min_active: int | None = None, group: int = 1
) -> Plan:
    """The numbering after ``terminated`` ranks are gone (see the module's rules).

    ``nodes[r]`` is the node of current rank ``r``; ``target`` ranks should train;
    ``min_active`` (default ``target``) is the fewest that may train on when holes
    cannot be filled. ``group``: the ranks go and stay in blocks of this many
    consecutive ranks (HSDP's replica groups): a smaller world drops every block with
    a hole no spare fills, its survivors wait with the spares. Pure: every process
    computes the same plan."""
    world = len(nodes)
    gone = set(terminated)
    min_active = target if min_active is None else min_active
    holes = [s for s in range(target) if s >= world or s in gone]
    pool = [r for r in range(target, world) if r not in gone]  # waiting survivors, rank order
    running = {nodes[s] for s in range(min(target, world)) if s not in gone}  # nodes that still train
    spare_for: dict[int, int] = {}  # lost node -> the spare node taking its ranks
    fill: dict[int, int] = {}
    for hole in holes:
        lost = nodes[hole] if hole < world else None
        pick = _pick(pool, nodes, lost, running, spare_for)
        if pick is not None:
            pool.remove(pick)
            fill[hole] = pick
    owners = [fill.get(s, s if s < world and s not in gone else None) for s in range(target)]
    if None not in owners:
        return Plan(tuple(owners) + tuple(pool), target)
    blocks = [owners[i : i + group] for i in range(0, target, group)]
    kept = [r for block in blocks if None not in block for r in block]
    idle = [r for block in blocks if None in block for r in block if r is not None]
    missing = target - len(kept)
    if len(kept) >= min_active and min_active < target and kept:
        return Plan(tuple(kept) + tuple(sorted(idle + pool)), len(kept))
    reason = (
        f"{missing} of {target} ranks lost and no spare to take them: the job stops so that the fleet "
        f"starts it again (spare nodes or --min-ranks let it go on in place)"
    )
    return Plan(tuple(r for r in range(world) if r not in gone), 0, stop=reason)


def _pick(
    pool: list[int], nodes: Sequence[int], lost: int | None, running: set[int], spare_for: dict[int, int]
) -> int | None:
    """The waiting process that takes a hole of node ``lost`` (None: a slot beyond the world)."""
    if not pool:
        return None
    if lost is not None:
        same = [r for r in pool if nodes[r] == lost]
        if same:
            return same[0]  # in place: the node's own spare process
        spare = spare_for.get(lost)
        if spare is None:
            # A whole spare node: one that trains nothing and takes no other lost node's
            # ranks, with the most processes waiting (the lowest node first on a tie).
            taken = set(spare_for.values())
            idle = [n for n in dict.fromkeys(nodes[r] for r in pool) if n not in running and n not in taken]
            if idle:
                spare = max(idle, key=lambda n: (sum(nodes[r] == n for r in pool), -n))
                spare_for[lost] = spare
        on_spare = [r for r in pool if nodes[r] == spare]
        if on_spare:
            return on_spare[0]
    return pool[0]


class NodeFill:
    """The wrapper's rank assignment (an ``inprocess.RankAssignment``): :func:`reassign`
    over the job's :class:`Layout`, keeping the node of each current rank between
    restarts. ``on_stop(reason, lost_nodes)`` runs once, in each process, when a plan
    stops the job; ``lost_nodes``: the nodes none of whose ranks is left (gone whole)."""

    def __init__(
        self,
        layout: Layout,
        min_active: int | None = None,
        on_stop: Callable[[str, int], None] | None = None,
        group: int = 1,
    ):
        self.layout = layout
        self.group = group
        self.nodes = [layout.node_of(r) for r in range(layout.world_size)]
        #: Ranks below this train (after the newest restart).
        self.active = layout.active
        self.min_active = min_active
        self.on_stop = on_stop
        self.stopped = False

    def idle_nodes(self) -> list[int]:
        """Nodes none of whose processes trains now: the spare nodes still waiting."""
        training = set(self.nodes[: self.active])
        return [n for n in dict.fromkeys(self.nodes[self.active :]) if n not in training]

    def __call__(self, ctx: Any) -> Any:
        from nvidia_resiliency_ext.inprocess.rank_assignment import RankDiscarded
        from nvidia_resiliency_ext.inprocess.state import Mode

        state = ctx.state
        if state.world_size != len(self.nodes):
            raise RuntimeError(f"wrapper world {state.world_size} != layout {self.layout.encode()} ({len(self.nodes)})")
        terminated = set(ctx.terminated_ranks)
        if state.rank in terminated:
            raise RankDiscarded(f"rank {state.rank} terminated: {sorted(terminated)}")
        plan = reassign(self.nodes, self.layout.active, terminated, self.min_active, self.group)
        if plan.stop and not self.stopped:
            self.stopped = True
            if self.on_stop is not None:
                self.on_stop(plan.stop, lost_nodes(self.nodes, terminated))
        rank = plan.new_rank(state.rank)
        self.nodes = [self.nodes[r] for r in plan.order]
        self.active = plan.active
        active = rank < plan.active
        ctx.state = dataclasses.replace(
            state,
            rank=rank,
            world_size=len(plan.order),
            mode=Mode.ACTIVE if active else Mode.INACTIVE,
            active_rank=rank if active else None,
            active_world_size=plan.active,
        )
        ctx.terminated_ranks = set()
        return ctx


def lost_nodes(nodes: Sequence[int], terminated: Collection[int]) -> int:
    """How many nodes have lost every rank they held (``nodes[r]``: the node of rank ``r``)."""
    held: dict[int, bool] = {}
    for rank, node in enumerate(nodes):
        held[node] = held.get(node, False) or rank not in terminated
    return sum(not alive for alive in held.values())


def node_fill(
    layout: Layout,
    min_active: int | None = None,
    on_stop: Callable[[str, int], None] | None = None,
    group: int = 1,
) -> Any:
    """A :class:`NodeFill` that nvidia-resiliency-ext's ``Wrapper`` accepts (it checks
    that its ``rank_assignment`` is one of its ``RankAssignment``)."""
    from nvidia_resiliency_ext.inprocess.rank_assignment import RankAssignment

    class WrapperNodeFill(NodeFill, RankAssignment):
        pass

    global CURRENT
    CURRENT = WrapperNodeFill(layout, min_active, on_stop, group)
    return CURRENT


#: The rank assignment of this process's wrapper, once :func:`node_fill` made it: who
#: trains where now (:mod:`.handoff` reads it). None outside the in-process launcher.
CURRENT: NodeFill | None = None
