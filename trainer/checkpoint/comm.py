"""The few collectives the checkpoint protocol needs, over one process group.

Every protocol step is "each rank does its share, rank 0 decides, everyone learns the
decision", so a failure on one rank becomes the same outcome on all ranks instead of a
hang. :class:`LocalComm` is the one-process version, used by tools and tests.
"""

from __future__ import annotations

from typing import Any


class LocalComm:
    rank = 0
    world_size = 1

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        return obj

    def barrier(self) -> None:
        pass


class DistComm:
    def __init__(self, group: Any):
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size(group)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (None elsewhere)."""
        out = [None] * self.world_size if self.rank == 0 else None
        self._dist.gather_object(obj, out, dst=0, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        self._dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def barrier(self) -> None:
        self._dist.barrier(group=self.group)
