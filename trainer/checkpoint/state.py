"""What a checkpoint holds, and the hash that says two states are the same.

:class:`AppState` is the one object handed to DCP. It holds the complete training state:
model and optimizer (through ``get_state_dict``, so sharded FSDP2 state reshards on load
and DDP/FSDP checkpoints are interchangeable), the LR schedule, the step, the data
position in global samples, the RNG state of every rank (torch, CUDA when present,
numpy, Python) and the state of every rank's data reader, under rank-unique keys: one
key shared by all ranks would load one rank's value on every rank. Everything is a
tensor or a plain Python value, so loading needs nothing beyond ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

log = logging.getLogger("ftfleet.ckpt")


@dataclasses.dataclass
class TrainProgress:
    step: int = 0
    """Optimizer steps taken."""
    samples_seen: int = 0
    """Global samples consumed: the data position, independent of the world size."""


def rng_key(rank: int) -> str:
    return f"rng_rank{rank}"


def rank_key(name: str, rank: int) -> str:
    """Where a per-rank part is saved: one key per rank, since DCP keeps one copy of a
    key that every rank saves."""
    return f"{name}_rank{rank}"


def seed_rngs(seed: int, rank: int, step: int = 0) -> None:
    """Seed every RNG of this rank from (seed, rank, step): distinct per rank (dropout
    masks differ across ranks) and reproducible."""
    mixed = (seed * 1_000_003 + rank * 7_919 + step) % (2**31 - 1)
    torch.manual_seed(mixed)
    np.random.seed(mixed)
    random.seed(mixed)


def capture_rng() -> dict[str, Any]:
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": torch.tensor(pos),
            "has_gauss": torch.tensor(has_gauss),
            "gauss": torch.tensor(gauss, dtype=torch.float64),
        },
        "python": {
            "state": torch.tensor(internal, dtype=torch.int64),
            "version": torch.tensor(version),
            "has_gauss": torch.tensor(gauss_next is not None),
            "gauss": torch.tensor(gauss_next or 0.0, dtype=torch.float64),
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    npst = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            npst["keys"].numpy().astype(np.uint32),
            int(npst["pos"]),
            int(npst["has_gauss"]),
            float(npst["gauss"]),
        )
    )
    pyst = state["python"]
    gauss = float(pyst["gauss"]) if bool(pyst["has_gauss"]) else None
    random.setstate((int(pyst["version"]), tuple(int(x) for x in pyst["state"].tolist()), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class AppState:
    """DCP ``Stateful`` over the whole training state of this rank.

    ``extras`` are further parts of the run's state, each an object with
    ``state_tensor() -> Tensor`` (the same shape every time) and ``load_tensor(t)``,
    saved under ``extras/<name>``. A plain tensor is replicated: every rank loads the
    value rank 0 saved.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        progress: TrainProgress,
        rank: int,
        seed: int,
        extras: dict[str, Any] | None = None,
        *,
        per_rank: dict[str, Any] | None = None,
    ):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.progress = progress
        self.rank = rank
        self.seed = seed
        #: Set before a load: whether the checkpoint has an RNG entry for this rank
        #: (a rank beyond the writer's world size has none and is seeded afresh).
        self.include_rng = True
        self.extras = dict(extras or {})
        self.per_rank = dict(per_rank or {})

    def state_dict(self) -> dict[str, Any]:
        # An optimizer that has taken no step has no state, and get_state_dict makes one
        # with a zero-lr step (AdamW's step count becomes 1, shifting its bias
        # correction). Undo that on the live optimizer, and record it so that a load
        # undoes it too: a run saved before its first update resumes as if never saved.
        fresh = not self.optimizer.state
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        if fresh:
            self.optimizer.state.clear()
        sd: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "optim_fresh": torch.tensor(fresh),
            "lr_schedule": self.scheduler.state_dict(),
            "progress": {
                "step": torch.tensor(self.progress.step),
                "samples_seen": torch.tensor(self.progress.samples_seen),
            },
        }
        if self.extras:
            sd["extras"] = {name: obj.state_tensor() for name, obj in self.extras.items()}
        if self.include_rng:
            sd[rng_key(self.rank)] = capture_rng()
            for name, obj in self.per_rank.items():
                sd[rank_key(name, self.rank)] = obj.state_dict()
        return sd

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        if bool(sd["optim_fresh"]):
            self.optimizer.state.clear()
        self.scheduler.load_state_dict(sd["lr_schedule"])
        self.progress.step = int(sd["progress"]["step"])
        self.progress.samples_seen = int(sd["progress"]["samples_seen"])
        for name, obj in self.extras.items():
            obj.load_tensor(sd["extras"][name])
        for name, obj in self.per_rank.items():
            if rank_key(name, self.rank) in sd:
                obj.load_state_dict(sd[rank_key(name, self.rank)])
        if rng_key(self.rank) in sd:
            restore_rng(sd[rng_key(self.rank)])
        else:
            log.info(
                "rank %d has no RNG state in the checkpoint (it had fewer ranks): seeding from (seed, rank, step)",
                self.rank,
            )
            seed_rngs(self.seed, self.rank, self.progress.step)


# ---------------------------------------------------------------------------
# state_sha256
# ---------------------------------------------------------------------------


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """Unsharded model and optimizer state on rank 0 (None elsewhere). Collective."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return None
    return {"model": model_sd, "optim": optim_sd}


def state_sha256(tree: dict[str, Any]) -> str:
    """SHA-256 of a (nested) state: key paths, dtypes, shapes and bytes of tensors, and
    the values of plain entries. Independent of sharding and world size, so it is the
    same for the live state of any run and for the same state read from a checkpoint."""
    h = hashlib.sha256()
    for path, value in sorted(_flatten(tree, ()), key=lambda kv: kv[0]):
        h.update(path.encode() + b"\0")
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(f"V{type(value).__name__}:{value!r}".encode())
        h.update(b"\1")
    return h.hexdigest()


def _flatten(node: Any, prefix: tuple[str, ...]):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _flatten(v, prefix + (str(k),))
    elif isinstance(node, (list, tuple)):
        if not node:
            yield "/".join(prefix), "[]"
        for i, v in enumerate(node):
            yield from _flatten(v, prefix + (str(i),))
    else:
        yield "/".join(prefix), node
