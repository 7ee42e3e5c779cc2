"""Process groups and model parallelism.

* Works under ``torchrun`` (any number of ranks) and as a plain ``python -m trainer``
  (one rank, an in-memory store), so every code path is the distributed one.
* Each torchrun attempt gets its own key prefix in the agent's store: workers restarted
  by ``--max-restarts`` otherwise read the previous attempt's stale keys and hang
  (measured; see shared/REFERENCE.md).
* Checkpointing gets two dedicated gloo groups: ``ckpt`` for DCP's async save and the
  commit protocol, ``upload`` for the background upload to the durable tier. Collectives
  of a background save on the training group hang or corrupt data.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os

import torch
import torch.distributed as dist
from torch import nn

from trainer.config import ParallelConfig

log = logging.getLogger("ftfleet.dist")


@dataclasses.dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    ckpt_group: dist.ProcessGroup
    upload_group: dist.ProcessGroup

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def init_distributed(cfg: ParallelConfig, ckpt_timeout_s: int) -> DistEnv:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and cfg.backend in ("auto", "nccl")
    if cfg.backend == "nccl" and not torch.cuda.is_available():
        from ftfleet.errors import ConfigError

        raise ConfigError("parallel.backend=nccl but CUDA is not available: use auto or gloo")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        # CPU tensors (async-save staging, object collectives) need a CPU backend too.
        backend = "cpu:gloo,cuda:nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"

    if "MASTER_ADDR" in os.environ:
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        host_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                             world_size, is_master=host_store,
                             timeout=datetime.timedelta(seconds=300))
        store: dist.Store = dist.PrefixStore(f"attempt_{attempt}", base)
    else:
        if world_size != 1:
            raise RuntimeError("WORLD_SIZE > 1 without MASTER_ADDR: launch with torchrun")
        store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            device_id=device if use_cuda else None)
    timeout = datetime.timedelta(seconds=ckpt_timeout_s)
    ckpt_group = dist.new_group(backend="gloo", timeout=timeout)
    upload_group = dist.new_group(backend="gloo", timeout=timeout)
    return DistEnv(rank, world_size, local_rank, device, ckpt_group, upload_group)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def parallelize(model: nn.Module, cfg: ParallelConfig, env: DistEnv) -> nn.Module:
    """FSDP2 (``fully_shard`` each block, then the root) or DDP. The model must be built
    identically on every rank (same seed) before this call."""
    model.to(env.device)
    if cfg.mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(env.device.type, (env.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda"
                                   else None)


def unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)
