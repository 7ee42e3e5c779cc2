"""The peer copies of snapshots: who holds whose, and moving bytes between ranks.

Node ``i`` keeps the latest snapshot of node ``(i + 1) mod N`` (a ring): after a
snapshot, each rank sends its bytes to the rank with the same local rank on the
previous node (gloo point-to-point on a group of its own). A lost node's ranks then
restore from their holders' RAM.

Under HSDP the ranks of one column of the (replicate, shard) mesh hold the same shards
(:func:`replica_sets`): each one's own snapshot is, but for its rank's own entries, a
copy of the others', with no bytes sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ftfleet.trainer.checkpoint.memory.format import as_bytes


@dataclasses.dataclass(frozen=True)
class Ring:
    """Which ranks form a node, and who holds whose copy. ``ranks_per_node`` ranks per
    node, in rank order (torchrun's numbering); node ``i`` holds node ``i + 1``'s."""

    rank: int
    world_size: int
    ranks_per_node: int

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.ranks_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def peer_of(self, rank: int) -> int:
        """The rank whose snapshot ``rank`` holds (same local rank, next node)."""
        node, local = divmod(rank, self.ranks_per_node)
        return ((node + 1) % self.nodes) * self.ranks_per_node + local

    def holder_of(self, rank: int) -> int:
        """The rank that holds ``rank``'s copy (same local rank, previous node)."""
        node, local = divmod(rank, self.ranks_per_node)
        return ((node - 1) % self.nodes) * self.ranks_per_node + local


def replica_sets(model: Any, group: Any = None) -> list[list[int]]:
    """The sets of ranks (numbered in ``group``; None: the default group) that hold the
    same shards of ``model``'s parameters, and so the same optimizer state: under HSDP
    (FSDP2 on a two-dimensional mesh whose first dimension replicates) each column of
    the mesh. Empty where no rank has a replica: no DTensor parameters (DDP, one
    process), a one-dimensional mesh (plain FSDP), one replica group, or parameters on
    different meshes or placements."""
    from torch.distributed.tensor import DTensor, Replicate

    params = [p for p in (model.parameters() if hasattr(model, "parameters") else ()) if isinstance(p, DTensor)]
    if not params:
        return []
    mesh, placements = params[0].device_mesh, tuple(params[0].placements)
    if mesh.ndim != 2 or not isinstance(placements[0], Replicate) or mesh.mesh.shape[0] < 2:
        return []
    if any(p.device_mesh != mesh or tuple(p.placements) != placements for p in params):
        return []
    to_group = (lambda r: r) if group is None else (lambda r: dist.get_group_rank(group, r))
    return [[to_group(int(r)) for r in column] for column in mesh.mesh.t().tolist()]


# ---------------------------------------------------------------------------
# Moving bytes between ranks (gloo point-to-point)
# ---------------------------------------------------------------------------

_SIZES, _HEAD, _BODY = 1, 2, 3  # p2p tags
#: What one rank sends another: a small head (bytes) and a body (a uint8 tensor).
Message = tuple[bytes, torch.Tensor]
EMPTY: Message = (b"", torch.empty(0, dtype=torch.uint8))


def exchange(
    transfers: list[tuple[int, int]],
    rank: int,
    outgoing: dict[int, Message],
    group: Any,
    into: Callable[[int], torch.Tensor] | None = None,
) -> dict[int, Message]:
    """Point-to-point transfers ``(src, dst)``, the same list on every rank: this rank
    sends ``outgoing[dst]`` for each of its own and returns what it received, by
    source. A sender with nothing to send (:data:`EMPTY`) makes its receiver get an
    empty message. ``into(n)``: the uint8 tensor of at least ``n`` bytes to receive a
    body into (a buffer kept between calls); default a new one."""
    mine_out = [(s, d) for s, d in transfers if s == rank]
    mine_in = [(s, d) for s, d in transfers if d == rank]
    if not mine_out and not mine_in:
        return {}
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    sent = {d: outgoing.get(d, EMPTY) for _, d in mine_out}
    sizes_out = {d: torch.tensor([len(h), b.numel()], dtype=torch.int64) for d, (h, b) in sent.items()}
    sizes_in = {s: torch.zeros(2, dtype=torch.int64) for s, _ in mine_in}
    ops = [dist.P2POp(dist.isend, t, peer(d), group, _SIZES) for d, t in sizes_out.items()]
    ops += [dist.P2POp(dist.irecv, t, peer(s), group, _SIZES) for s, t in sizes_in.items()]
    _run(ops)
    heads_in = {s: torch.empty(int(t[0]), dtype=torch.uint8) for s, t in sizes_in.items()}
    bodies_in = {}
    for s, t in sizes_in.items():
        n = int(t[1])
        bodies_in[s] = (into(n) if into is not None and n else torch.empty(n, dtype=torch.uint8))[:n]
    ops = []
    for d, (head, body) in sent.items():
        if head:
            head_t = torch.frombuffer(bytearray(head), dtype=torch.uint8)
            ops.append(dist.P2POp(dist.isend, head_t, peer(d), group, _HEAD))
        if body.numel():
            ops.append(dist.P2POp(dist.isend, body, peer(d), group, _BODY))
    for s in sizes_in:
        if heads_in[s].numel():
            ops.append(dist.P2POp(dist.irecv, heads_in[s], peer(s), group, _HEAD))
        if bodies_in[s].numel():
            ops.append(dist.P2POp(dist.irecv, bodies_in[s], peer(s), group, _BODY))
    _run(ops)
    return {s: (bytes(as_bytes(heads_in[s])), bodies_in[s]) for s in sizes_in}


def _run(ops: list[Any]) -> None:
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
