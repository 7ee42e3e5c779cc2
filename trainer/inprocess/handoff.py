"""A node told it will go hands its ranks to a spare node before it goes.

Under the in-process launcher across nodes, a terminal notice to one node (a spot
notice, a rebalance it takes as terminal, a termination of its group) need not stop the
job: at the boundary where the ranks agree on it, every rank takes a snapshot of that
step with its peer copy (collective), then the noticed node's processes leave (exit
:data:`~ftfleet.contract.EXIT_PREEMPTED`, after completing its lifecycle action), and
the others train on: their next collective fails, the wrapper restarts them in place,
and a spare node's warm processes take the leaving node's ranks, restoring them from the
peer copies of the step just taken, or under HSDP from their replicas' own snapshots of
it. Nothing is computed again.

It applies when every rank can tell the same thing (the decision is taken from the same
values on every rank): this process runs under the in-process launcher
(:data:`ftfleet.trainer.inprocess.ranks.CURRENT`), snapshots are kept in memory
(``checkpoint.memory``) with a peer copy of each (``checkpoint.memory_peer_every: 1``)
or every leaving rank has a replica on a node that stays (HSDP), and enough spare
nodes wait for every node that is leaving. Otherwise the notice takes the
usual path: an emergency checkpoint and exit 75 on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ftfleet.trainer.inprocess import ranks


class Handoff:
    """The job's nodes as the rank assignment sees them now (:class:`~.ranks.NodeFill`)."""

    def __init__(self, fill: ranks.NodeFill) -> None:
        self.fill = fill

    def node_of(self, rank: int) -> int:
        return self.fill.nodes[rank]

    def leaving(self, noticed: Sequence[bool]) -> set[int]:
        """The nodes of the ranks whose own watcher holds the notice (``noticed[rank]``)."""
        return {self.node_of(r) for r, flag in enumerate(noticed) if flag}

    def replicated(self, leaving: set[int], replicas: Mapping[int, Sequence[int]]) -> bool:
        """Every rank of the ``leaving`` nodes has a replica (``replicas``: rank -> the
        ranks holding its shards) on a node that stays."""
        fill = self.fill
        gone = [r for r in range(fill.active) if fill.nodes[r] in leaving]
        return all(any(p < fill.active and fill.nodes[p] not in leaving for p in replicas.get(r, ())) for r in gone)

    def possible(self, leaving: set[int]) -> bool:
        """A spare node waits for each leaving node, with a process for each of its ranks."""
        idle = self.fill.idle_nodes()
        need = [sum(self.fill.nodes[r] == n for r in range(self.fill.active)) for n in leaving]
        have = sorted((self.fill.nodes.count(n) for n in idle), reverse=True)
        return (
            bool(leaving)
            and len(have) >= len(need)
            and all(h >= n for h, n in zip(have, sorted(need, reverse=True), strict=False))
        )


def current() -> Handoff | None:
    """The hand-off of this process's in-process job, or None outside one."""
    return Handoff(ranks.CURRENT) if ranks.CURRENT is not None else None
