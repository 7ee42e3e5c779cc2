"""Process groups (model parallelism is trainer/parallel.py).

* Works under ``torchrun`` (any number of ranks) and as a plain ``python -m ftfleet.trainer``
  (one rank, an in-memory store), so every code path is the distributed one.
* Each torchrun attempt gets its own key prefix in the agent's store, agreed by its
  ranks (:func:`agree_on_attempt`): workers restarted by ``--max-restarts`` otherwise
  read the previous attempt's stale keys and hang or fail in gloo init. The attempt
  is a generation of the run, registered in that store: its commits are refused once
  a newer one registered (:mod:`ftfleet.trainer.resilience.fencing`).
* Checkpointing gets two dedicated gloo groups: ``ckpt`` for DCP's async save and the
  commit protocol, ``upload`` for the background upload to the durable tier. Collectives
  of a background save on the training group hang or corrupt data.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist

from ftfleet.trainer.config import ParallelConfig
from ftfleet.trainer.resilience import fencing
from ftfleet.trainer.resilience.fencing import bind_to_launcher

log = logging.getLogger("ftfleet.dist")

STORE_TIMEOUT = datetime.timedelta(seconds=300)


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
    bind_to_launcher()  # the entry points did already; a loop of one's own has not
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
        host_store = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
        base = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world_size,
            is_master=host_store,
            timeout=STORE_TIMEOUT,
        )
        attempt = agree_on_attempt(base, rank, world_size, STORE_TIMEOUT)
        if rank == 0:
            restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "-")
            log.log(
                logging.INFO if restart not in ("-", "0") else logging.DEBUG,  # said for a restart
                "process group: attempt %s (torchrun restart %s), %d ranks",
                attempt,
                os.environ.get("TORCHELASTIC_RESTART_COUNT", "-"),
                world_size,
            )
        store: dist.Store = dist.PrefixStore(f"ftfleet/{attempt}", base)
        # The attempt is a generation of the run: its commits are checked against the store.
        fencing.adopt(fencing.Fence(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), attempt))
    else:
        if world_size != 1:
            raise RuntimeError("WORLD_SIZE > 1 without MASTER_ADDR: launch with torchrun")
        store = dist.HashStore()
        fencing.adopt(None)  # no store to register in: one process, whose launcher alone is checked
    extra: dict[str, Any] = {}
    if cfg.collective_timeout_s is not None:
        extra["timeout"] = datetime.timedelta(seconds=cfg.collective_timeout_s)
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, device_id=device if use_cuda else None, **extra
    )
    timeout = datetime.timedelta(seconds=ckpt_timeout_s)
    ckpt_group = dist.new_group(backend="gloo", timeout=timeout)
    upload_group = dist.new_group(backend="gloo", timeout=timeout)
    return DistEnv(rank, world_size, local_rank, device, ckpt_group, upload_group)


def agree_on_attempt(store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta) -> str:
    """A name that every rank of this attempt gets and that no earlier attempt used: the
    token of the generation rank 0 registers in ``store`` (``<number>.<hex>``,
    :func:`ftfleet.trainer.resilience.fencing.register`).

    torchrun's agent store lives as long as the job, so it holds the keys of every
    earlier attempt. ``TORCHELASTIC_RESTART_COUNT`` cannot name the attempt: each agent
    counts only the restarts its own failed workers caused, not those for a membership
    change, so two nodes disagree once a worker dies on one node and the other node's
    workers do not notice (NCCL blocks in the collective instead of failing).

    Rank 0 registers a new generation, whose token is the name. Every other rank posts
    a fresh token of its own under its rank and waits for the name under a key made
    from that token, which no earlier attempt can have written. Rank 0 answers every
    token it reads there (a dead worker's stale one too, harmlessly) until all ranks
    have counted themselves in under the new name. Workers of earlier attempts are gone
    by then: an agent stops its workers before it joins the next rendezvous.
    """
    if world_size == 1:
        return fencing.register(store)
    hello = [f"ftfleet/hello/{r}" for r in range(1, world_size)]
    if rank != 0:
        token = uuid.uuid4().hex
        store.set(hello[rank - 1], token)
        store.wait([f"ftfleet/answer/{token}"], timeout)
        attempt = store.get(f"ftfleet/answer/{token}").decode()
        store.add(f"ftfleet/{attempt}/joined", 1)
        return attempt
    attempt = fencing.register(store)
    deadline = time.monotonic() + timeout.total_seconds()
    answered: set[bytes] = set()
    store.wait(hello, timeout)
    while store.add(f"ftfleet/{attempt}/joined", 0) < world_size - 1:
        fresh = [t for t in store.multi_get(hello) if t not in answered]
        if fresh:
            store.multi_set([f"ftfleet/answer/{t.decode()}" for t in fresh], [attempt] * len(fresh))
            answered.update(fresh)
        elif time.monotonic() > deadline:
            raise TimeoutError(f"not every rank of {world_size} joined attempt {attempt} within {timeout}")
        else:
            time.sleep(0.01)
    return attempt


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
