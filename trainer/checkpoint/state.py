"""What a checkpoint holds, and the hash that says two states are the same.

:class:`AppState` is the one object handed to DCP. It holds the complete training state:
model and optimizer (through ``get_state_dict``, so sharded FSDP2 state reshards on load
and DDP/FSDP checkpoints are interchangeable), the LR schedule, the step, the data
position in global samples, the RNG state of every rank (torch, CUDA when present,
numpy, Python), the state of every rank's data reader and every rank's own buffers
(running statistics), under rank-unique keys: one key shared by all ranks would load one
rank's value on every rank. Everything is a tensor or a plain Python value, so loading
needs nothing beyond ``torch.load(weights_only=True)``.

Buffers (a model's persistent non-parameter tensors, such as BatchNorm's running
statistics) are not sharded: FSDP2 leaves each rank its own, updated from its own
batches. The ``model`` entry keeps one rank's (DCP writes one copy of a key that every
rank saves); ``buffers_rank<r>`` keeps each rank's, and each rank loads its own. A rank
beyond the writer's world size has none and loads rank 0's. :func:`hashed_state` is
what ``state_sha256`` covers: the model with rank 0's buffers, the optimizer, and the
buffers of each rank where they differ from rank 0's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import zlib
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor

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


BUFFERS = "buffers"


def rank_entries(sd: dict[str, Any], rank: int) -> dict[str, Any]:
    """The entries of a state dict that are ``rank``'s own (:func:`rng_key`,
    :func:`rank_key`): what differs between two ranks that hold the same shards."""
    suffix = f"_rank{rank}"
    return {k: v for k, v in sd.items() if isinstance(k, str) and k.endswith(suffix)}


def model_buffers(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's persistent buffers that are plain tensors, by their state-dict key
    (wrappers' prefixes removed, as ``get_state_dict`` names them)."""
    from torch.distributed.checkpoint.state_dict import _get_fqns

    out: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        for name, buf in module.named_buffers(recurse=False):
            if buf is None or name in module._non_persistent_buffers_set or isinstance(buf, DTensor):
                continue
            for fqn in _get_fqns(model, f"{prefix}.{name}" if prefix else name):
                out[fqn] = buf
    return out


def borrowed_buffers(model: nn.Module, written: int, world: int) -> str | None:
    """What a restore cannot give back exactly, said in one line: the buffers of the
    ranks a checkpoint written by ``written`` ranks lacks (they take rank 0's). None
    when every rank has its own, or the model has no buffers."""
    names = list(model_buffers(model))
    if written >= world or not names:
        return None
    ranks = f"ranks {written}-{world - 1}" if world - written > 1 else f"rank {written}"
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return (
        f"was written by {written} ranks: {ranks} start from rank 0's buffers ({shown}), not their own as an "
        "uninterrupted run's would be; resume on the writer's world size to keep them exactly"
    )


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

    ``model`` and ``optimizer`` go through ``get_state_dict`` (sharded under FSDP2,
    keyed by parameter name); ``scheduler`` (optional) is saved by its own state dict;
    ``progress`` is the step and the data position. Further parts of the run are
    ``Stateful`` objects (``state_dict()`` / ``load_state_dict(sd)``):

    * ``extras``: the same on every rank (an EMA of the weights, a tokenizer's
      counters); saved once, loaded on every rank;
    * ``per_rank``: this rank's own (a data loader's position over its shard, as
      ``StatefulDataLoader`` keeps it), saved under a rank-unique key; a rank that did
      not exist when the checkpoint was written keeps its current state.

    A ``DataLoader`` among them is adopted (:func:`~ftfleet.trainer.data.loader.adopt`):
    given a generator of its own when it has none (seeded from ``seed``, the rank and
    its name), so that ``iter(loader)`` after a restore does not draw from the restored
    RNG, and its workers start in process groups of their own, so that torchrun's
    SIGTERM to the rank does not kill them. Register it before its first ``iter()``.

    The model's buffers are saved per rank too (module doc); a rank that did not exist
    when the checkpoint was written loads rank 0's.

    A checkpoint written by another loop or on another device may lack some of these
    parts (an extra, a scheduler, the CUDA RNG state): they keep their current state
    and the restore logs it. Model and optimizer state must fit exactly.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        progress: TrainProgress | None = None,
        rank: int | None = None,
        seed: int = 0,
        *,
        extras: dict[str, Any] | None = None,
        per_rank: dict[str, Any] | None = None,
    ):
        if rank is None:
            dist = torch.distributed
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.progress = progress if progress is not None else TrainProgress()
        self.rank = rank
        self.seed = seed
        #: Set before a load: whether the checkpoint has the entries of this rank (a rank
        #: beyond the writer's world size has none: its RNGs are seeded afresh and its
        #: buffers are rank 0's).
        self.include_rng = True
        self._loading = False
        #: The optimizer state that a template made for a load (see :meth:`state_dict`).
        self._made_state = False
        self.extras = dict(extras or {})
        self.per_rank = dict(per_rank or {})
        for name, part in {**self.extras, **self.per_rank}.items():
            if isinstance(part, torch.utils.data.DataLoader):
                from ftfleet.trainer.data.loader import adopt

                mixed = (seed * 1_000_003 + rank * 7_919 + zlib.crc32(name.encode())) % (2**31 - 1)
                if changed := adopt(part, mixed):
                    log.info("data loader %r: %s (exact resume, a stop survived)", name, ", ".join(changed))

    @property
    def loading(self) -> bool:
        """True while a checkpoint loads into this state (the template DCP fills, a
        snapshot's checks). Set to False, it drops an optimizer state that a template
        made for a load that did not complete: a start from scratch after every
        checkpoint failed must find the optimizer as new."""
        return self._loading

    @loading.setter
    def loading(self, value: bool) -> None:
        self._loading = value
        if not value and self._made_state:
            self.optimizer.state.clear()  # type: ignore[union-attr]
            self._made_state = False

    def adopt_optimizer_state(self, saved: Any) -> bool:
        """For a load of ``saved`` (this rank's optimizer entry of a snapshot, written at
        this world size by the same optimizer): give a new optimizer its per-parameter
        state directly, as the load's template, instead of torch's zero-lr init step
        (1.5 s at 113M parameters here). Each saved tensor must have its parameter's
        local shape (made a DTensor like the parameter) or be a scalar; anything else,
        an optimizer with state, or another layout changes nothing and returns False
        (the template then comes from the init step). The load overwrites what this
        sets, by parameter name; a load that does not complete drops it (``loading``)."""
        opt = self.optimizer
        if opt is None or opt.state or not self.loading or not isinstance(saved, dict):
            return False
        groups, states = saved.get("param_groups"), saved.get("state")
        if not isinstance(groups, list) or not isinstance(states, dict) or len(groups) != len(opt.param_groups):
            return False
        adopted: list[tuple[torch.Tensor, dict[str, Any]]] = []
        for live, kept in zip(opt.param_groups, groups, strict=True):
            names = kept.get("params") if isinstance(kept, dict) else None
            if not isinstance(names, list) or len(names) != len(live["params"]):
                return False
            for name, param in zip(names, live["params"], strict=True):
                entry = states.get(name)
                if entry is None:
                    continue  # a parameter that never had a gradient has no state
                shaped = _like_param(entry, param)
                if shaped is None:
                    return False
                adopted.append((param, shaped))
        if not adopted:
            return False
        for param, shaped in adopted:
            opt.state[param] = shaped
        self._made_state = True
        return True

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer is not None:
            # An optimizer that has taken no step has no state, and get_state_dict makes
            # one with a zero-lr step (AdamW's step count becomes 1, shifting its bias
            # correction). Undo that on the live optimizer, and record it so that a load
            # undoes it too: a run saved before its first update resumes as if never saved.
            # For a load, the made state stays until the load completes: the load fills
            # it, and set_state_dict would otherwise make it a second time (seconds for a
            # model of 100M parameters); `loading` drops it if the load fails.
            fresh = not self.optimizer.state
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
            if fresh and self.loading:
                self._made_state = True
            elif fresh:
                self.optimizer.state.clear()
            # Loading, this is the value a checkpoint without the entry leaves: not fresh.
            sd: dict[str, Any] = {
                "model": model_sd,
                "optim": optim_sd,
                "optim_fresh": torch.tensor(fresh and not self.loading),
            }
        else:
            sd = {"model": get_model_state_dict(self.model)}
        if self.scheduler is not None:
            sd["lr_schedule"] = self.scheduler.state_dict()
        sd["progress"] = {
            "step": torch.tensor(self.progress.step),
            "samples_seen": torch.tensor(self.progress.samples_seen),
        }
        if self.extras:
            sd["extras"] = {name: obj.state_dict() for name, obj in self.extras.items()}
        for name, obj in self.per_rank.items():
            sd[rank_key(name, self.rank)] = obj.state_dict()
        buffers = self._buffers_entry(sd["model"])
        if buffers is not None:
            # A rank beyond the writer's world size loads rank 0's.
            sd[rank_key(BUFFERS, self.rank if self.include_rng else 0)] = buffers
        if self.include_rng:
            sd[rng_key(self.rank)] = capture_rng()
        return sd

    def _buffers_entry(self, model_sd: dict[str, Any]) -> dict[str, Any] | None:
        """This rank's buffers (None: the model has none). ``saved`` tells a load whether
        the checkpoint had the entry: absent, the template's values stay, and False."""
        names = [n for n in model_buffers(self.model) if n in model_sd]
        if not names:
            return None
        values = {n: model_sd[n] for n in names}
        if self.loading:  # the template DCP fills: its own tensors, not the model's
            values = {n: torch.empty_like(v) for n, v in values.items()}
        return {"values": values, "saved": torch.tensor(not self.loading)}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        model_sd = sd["model"]
        buffers = sd.get(rank_key(BUFFERS, self.rank)) or sd.get(rank_key(BUFFERS, 0))
        if buffers is not None and bool(buffers["saved"]):
            model_sd = {**model_sd, **buffers["values"]}
        if self.optimizer is not None:
            set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=sd["optim"])
            if bool(sd.get("optim_fresh", False)):
                self.optimizer.state.clear()
        else:
            set_model_state_dict(self.model, model_sd)
        if self.scheduler is not None and "lr_schedule" in sd:
            self.scheduler.load_state_dict(sd["lr_schedule"])
        self.progress.step = int(sd["progress"]["step"])
        self.progress.samples_seen = int(sd["progress"]["samples_seen"])
        for name, obj in self.extras.items():
            if name in sd.get("extras", {}):
                obj.load_state_dict(sd["extras"][name])
        for name, obj in self.per_rank.items():
            if rank_key(name, self.rank) in sd:
                obj.load_state_dict(sd[rank_key(name, self.rank)])
        self._made_state = False  # loaded: the state is the checkpoint's now
        if rng_key(self.rank) in sd:
            restore_rng(sd[rng_key(self.rank)])
        else:
            log.info(
                "rank %d has no RNG state in the checkpoint (it had fewer ranks): seeding from (seed, rank, step)",
                self.rank,
            )
            seed_rngs(self.seed, self.rank, self.progress.step)


def placed_like(local: torch.Tensor, like: DTensor) -> DTensor:
    """``local`` (this rank's shard, of ``like``'s local shape) as a DTensor placed as
    ``like`` is: same mesh, placements, global shape and stride; on ``like``'s device."""
    return DTensor.from_local(
        local.to(like.to_local().device),
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )


def optimizer_layout(metadata: Any, model: nn.Module, optimizer: Any, prefix: tuple[str, ...]) -> dict[str, Any] | None:
    """The optimizer entry a DCP checkpoint holds (its ``metadata``, the optimizer's
    state dict under ``prefix``), as a state dict of empty tensors: each parameter's
    local shape where the saved tensor has the parameter's shape, scalars as they are;
    for :meth:`AppState.adopt_optimizer_state`, so that a load into a new optimizer skips
    the zero-lr step that would make its state. None when anything else is there (a
    state entry that is not a tensor, another shape, a parameter the model lacks): the
    load then makes the state as usual. Only for a checkpoint of the same optimizer (the
    config hash matched): the layout is the checkpoint's, not what this optimizer makes."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    paths = getattr(metadata, "planner_data", None) or {}
    params = dict(getattr(model, "module", model).named_parameters())
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, md in metadata.state_dict_metadata.items():
        path = tuple(paths.get(key, ()))
        if path[: len(prefix) + 1] != (*prefix, "state"):
            continue
        if len(path) != len(prefix) + 3 or not isinstance(md, TensorStorageMetadata) or path[-2] not in params:
            return None
        param, dtype = params[path[-2]], md.properties.dtype
        local = param.to_local() if isinstance(param, DTensor) else param
        if len(md.size) == 0:
            value = torch.empty((), dtype=dtype)
        elif tuple(md.size) == tuple(param.shape):
            value = torch.empty(local.shape, dtype=dtype, device=local.device)
        else:
            return None
        state.setdefault(path[-2], {})[path[-1]] = value
    names = {id(p): n for n, p in params.items()}
    try:
        groups = [{"params": [names[id(p)] for p in group["params"]]} for group in optimizer.param_groups]
    except KeyError:  # a parameter the model does not name
        return None
    return {"state": state, "param_groups": groups} if state else None


def _like_param(entry: Any, param: torch.Tensor) -> dict[str, Any] | None:
    """A saved per-parameter optimizer state with its tensors placed like ``param`` (its
    local shard's shape: a DTensor with the parameter's mesh and placements), scalars as
    they are; None when a tensor has another shape."""
    if not isinstance(entry, dict):
        return None
    local = param.to_local() if isinstance(param, DTensor) else param
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            out[key] = value
        elif value.shape != local.shape:
            return None
        elif isinstance(param, DTensor):
            out[key] = placed_like(value, param)
        else:
            out[key] = value.to(param.device)
    return out


# ---------------------------------------------------------------------------
# state_sha256
# ---------------------------------------------------------------------------


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
    """:func:`hashed_state` of the live run on rank 0 (None elsewhere): the unsharded
    model and optimizer, and every rank's buffers gathered. Collective."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=opts)
    own = {n: b.detach().cpu().clone() for n, b in model_buffers(model).items()}
    dist = torch.distributed
    gathered: list[Any] = [own]
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
        dist.gather_object(own, gathered if dist.get_rank() == 0 else None, dst=0)
        if dist.get_rank() != 0:
            return None
    return hashed_state(model_sd, optim_sd, dict(enumerate(gathered)))


def hashed_state(
    model_sd: dict[str, Any], optim_sd: Any, buffers: dict[int, dict[str, torch.Tensor]]
) -> dict[str, Any]:
    """What ``state_sha256`` covers: the model with rank 0's buffers, the optimizer, and
    under ``buffers`` each rank's buffers that differ from rank 0's (none for a model
    whose buffers agree, such as one without running statistics or under DDP, so that
    its hash is that of the model and optimizer alone, at any world size)."""
    model = {**model_sd, **buffers.get(0, {})}
    differing = {
        str(rank): diff
        for rank, own in sorted(buffers.items())
        if (diff := {n: t for n, t in own.items() if n in model and not _same(t, model[n])})
    }
    state: dict[str, Any] = {"model": model, "optim": optim_sd}
    if differing:
        state[BUFFERS] = differing
    return state


def checkpoint_state(app: dict[str, Any]) -> dict[str, Any]:
    """:func:`hashed_state` of a checkpoint's ``app`` entry, as loaded offline
    (:func:`~ftfleet.trainer.checkpoint.safe_load.load_offline`)."""
    prefix = f"{BUFFERS}_rank"
    buffers = {
        int(key.removeprefix(prefix)): dict(entry["values"])
        for key, entry in app.items()
        if key.startswith(prefix) and key.removeprefix(prefix).isdigit() and isinstance(entry, dict)
    }
    return hashed_state(dict(app.get("model") or {}), app.get("optim"), buffers)


def _same(a: Any, b: Any) -> bool:
    """Bit for bit (NaN equal to the same NaN)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a == b
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


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
