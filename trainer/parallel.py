"""How the model is spread over the ranks: FSDP2 units, hybrid sharding, mixed
precision, meta-device initialisation (or DDP).

* ``parallel.replicas`` R > 1 is HSDP: FSDP2 on a (replicate, shard) mesh of R groups of
  consecutive ranks; each group shards the state over its ranks and the groups hold the
  same shards (:func:`device_mesh`).

* ``parallel.wrap`` picks the submodules FSDP2 shards as units (then the root):
  ``auto`` takes a Hugging Face model's ``_no_split_modules`` classes, else the blocks
  of every ModuleList whose children share a class (``model.blocks``,
  ``model.model.layers``); class names or a callable pick them explicitly.
* ``parallel.mixed_precision: bf16`` is FSDP2's policy: parameters all-gathered and
  computed in bf16, gradients reduced in fp32, the sharded parameters, the optimizer
  state and the checkpoint in fp32. A resume therefore loads exactly what was saved.
* ``model.meta_init`` builds the model on the meta device (no memory), shards it, and
  only then allocates each rank's shards and initialises them with the model's own
  ``init_weights()`` or ``reset_parameters()``. DTensor's random ops keep a shard's
  values those of the whole tensor on CUDA; on CPU they do not, so there each rank
  seeds its shards from (seed, rank) to keep them distinct.
* A build for a restore (:func:`parameters_on_meta`, ``init=False``): the parameters are
  made on the meta device, sharded, and allocated without values, because the
  checkpoint overwrites every one of them; the init the model's constructor would have
  run is skipped (the trainer runs it later if nothing was restored).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from ftfleet.errors import ConfigError
from ftfleet.trainer.config import ParallelConfig
from ftfleet.trainer.environment import TrainerEnvironment
from ftfleet.trainer.factories import import_callable

log = logging.getLogger("ftfleet.parallel")


def shard_units(model: nn.Module, wrap: list[str]) -> list[nn.Module]:
    """The submodules FSDP2 shards as units, as ``parallel.wrap`` says."""
    if wrap == ["auto"]:
        names = getattr(model, "_no_split_modules", None)
        if names:
            return [m for m in model.modules() if type(m).__name__ in set(names)]
        units = []
        for m in model.modules():
            if isinstance(m, nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1:
                units += list(m)
        if not units:
            log.warning(
                "parallel.wrap=auto found no blocks in %s: sharding it as one unit "
                "(name its block classes in parallel.wrap to shard them separately)",
                type(model).__name__,
            )
        return units
    if ":" in wrap[0]:
        fn = import_callable("parallel.wrap", wrap[0])
        picked = list(fn(model))
        inside = {id(m) for m in model.modules()}
        for m in picked:
            if not isinstance(m, nn.Module) or id(m) not in inside:
                raise ConfigError(
                    f"parallel.wrap={wrap[0]} returned {type(m).__name__}, not a submodule of the model: "
                    "return the modules to shard"
                )
        return picked
    classes = {type(m).__name__ for m in model.modules()}
    for name in wrap:
        if name not in classes:
            near = difflib.get_close_matches(name, sorted(classes), n=1)
            hint = f"did you mean {near[0]}?" if near else f"its classes are {', '.join(sorted(classes))}"
            raise ConfigError(f"parallel.wrap: the model has no module of class {name}: {hint}")
    return [m for m in model.modules() if type(m).__name__ in set(wrap)]


def mixed_precision_policy(cfg: ParallelConfig) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if cfg.mixed_precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


class NeedsValues(Exception):
    """A model that cannot be built without its parameters' values (see
    :func:`parameters_on_meta`)."""


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Within it, every parameter a module registers is moved to the meta device: it
    takes no memory, and whatever the constructor does to initialise it costs nothing.
    Buffers stay real (a rotary table computed in ``__init__`` keeps its values). For a
    model whose parameters a checkpoint is about to overwrite. A parameter of a
    subclass of ``nn.Parameter`` raises :class:`NeedsValues` (its own fields would not
    survive the move), and so does a constructor that reads a parameter's values.

    It patches ``nn.Module.register_parameter`` for the duration: modules built on
    other threads meanwhile get meta parameters too (the trainer builds on one thread)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None and not param.is_meta:
            if type(param) is not nn.Parameter:
                raise NeedsValues(f"parameter {name} is a {type(param).__name__}")
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    except (NotImplementedError, RuntimeError) as exc:  # meta tensors have no data
        raise NeedsValues(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def parallelize(
    model: nn.Module, cfg: ParallelConfig, env: Any, *, on_meta: bool, seed: int, init: bool = True
) -> nn.Module:
    """FSDP2 or DDP. A model built normally must be identical on every rank (same
    seed); one built on the meta device is materialised and initialised here, or with
    ``init=False`` only allocated (its values undefined until a checkpoint loads into
    it; buffers that were not on meta keep theirs)."""
    name = type(model).__name__  # fully_shard changes the class to FSDP<name>
    if cfg.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        if not on_meta:
            model.to(env.device)
        mesh = device_mesh(cfg, env)
        policy = mixed_precision_policy(cfg)
        units = {id(m) for m in shard_units(model, cfg.wrap)}
        for m in reversed(list(model.modules())):  # FSDP2 wants children before parents
            if m is not model and id(m) in units:
                fully_shard(m, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        if on_meta and init:
            # The replicas of a shard (HSDP) must start equal: salted by the shard's index.
            shard = env.rank % hsdp_shape(cfg.replicas, env.world_size)[1]
            materialize(model, env.device, seed, shard if env.device.type == "cpu" else 0, name)
        elif on_meta:
            allocate(model, env.device)
        return model
    from torch.nn.parallel import DistributedDataParallel

    if on_meta and init:  # every rank the same values; DDP also broadcasts rank 0's
        materialize(model, env.device, seed, 0, name)
    elif on_meta:
        allocate(model, env.device)
    else:
        model.to(env.device)
    return DistributedDataParallel(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)


def hsdp_shape(replicas: int, world_size: int, launched: int | None = None) -> tuple[int, int]:
    """(replica groups, ranks per group) of HSDP on ``world_size`` ranks: ``replicas``
    groups of ``world_size / replicas``. On a world the in-process launcher shrank by
    whole groups (``--group-size``; ``launched``: its training ranks at the start, by
    default FTFLEET_ACTIVE_WORLD_SIZE) the groups keep their size and fewer of them
    train. ConfigError when neither fits."""
    if replicas == 1:
        return 1, world_size
    if launched is None:
        launched = TrainerEnvironment().active_world_size
    if launched and launched != world_size and launched % replicas == 0:
        size = launched // replicas
        if world_size % size == 0 and world_size > 0:
            return world_size // size, size
    if world_size % replicas:
        raise ConfigError(
            f"parallel.replicas={replicas} does not divide the world size {world_size}: "
            f"use a divisor of {world_size}, or 1 (a shrinking world keeps whole replica groups with the "
            "in-process launcher's --group-size)"
        )
    return replicas, world_size // replicas


def device_mesh(cfg: ParallelConfig, env: Any) -> Any:
    """FSDP2's mesh: one dimension over every rank, or with ``parallel.replicas`` R > 1
    (HSDP) replica groups of consecutive ranks (:func:`hsdp_shape`; ``("replicate",
    "shard")``: FSDP2 shards over the second dimension and replicates over the first)."""
    from torch.distributed.device_mesh import init_device_mesh

    if cfg.replicas == 1:
        return init_device_mesh(env.device.type, (env.world_size,))
    shape = hsdp_shape(cfg.replicas, env.world_size)
    if shape[0] != cfg.replicas:
        log.warning(
            "HSDP on %d of parallel.replicas=%d replica groups of %d ranks: the world shrank by whole groups",
            shape[0],
            cfg.replicas,
            shape[1],
        )
    if shape[0] == 1:
        return init_device_mesh(env.device.type, (env.world_size,))
    names = ("replicate", "shard")
    override = None
    if cfg.collective_timeout_s is not None and env.device.type == "cpu":
        # A 2-D mesh's groups are new gloo groups, which get torch's default timeout (30
        # minutes), not the world group's: a rank waiting in the replicas' all-reduce for
        # a peer that went on to an in-process restart would block that long, where no
        # restart can reach it. (NCCL's collectives do not block the Python thread.)
        import datetime

        import torch.distributed as dist

        options = dist.ProcessGroupGloo._Options()
        options._timeout = datetime.timedelta(seconds=cfg.collective_timeout_s)
        override = {name: ("gloo", options) for name in names}
    return init_device_mesh(env.device.type, shape, mesh_dim_names=names, backend_override=override)


def materialize(model: nn.Module, device: torch.device, seed: int, rank_salt: int, name: str = "") -> str:
    """Allocate a meta model's parameters and buffers on ``device`` and initialise them
    with the model's own init, under an RNG seeded from ``seed`` (and ``rank_salt``),
    leaving the caller's RNG state as it was. Returns what initialised it."""
    to_empty(model, device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed * 1_000_003 + rank_salt * 7_919 + 1)
        with torch.no_grad():
            return init_weights(model, name or type(model).__name__)


def to_empty(model: nn.Module, device: torch.device) -> None:
    """``model.to_empty(device)``, keeping a parameter that several modules share
    shared (tied embeddings): ``to_empty`` gives each module a parameter of its own."""
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                places.setdefault(id(param), []).append((module, name))
    model.to_empty(device=device)
    for (first, first_name), *rest in (p for p in places.values() if len(p) > 1):
        for module, name in rest:
            module._parameters[name] = first._parameters[first_name]


def allocate(model: nn.Module, device: torch.device) -> None:
    """Memory for a meta model's parameters on ``device``, values undefined; buffers
    that were already real keep their values (moved to ``device``)."""
    real = {name: buf for name, buf in model.named_buffers() if not buf.is_meta}
    to_empty(model, device)
    for name, buf in real.items():
        owner, _, leaf = name.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = buf.to(device)


def init_weights(model: nn.Module, name: str) -> str:
    """The model's init: ``init_weights()`` (torchtitan, Hugging Face), else
    ``reset_parameters()``, else every submodule's ``reset_parameters()``. Whatever is
    called must also recompute buffers that are not saved (rotary tables...)."""
    for method in ("init_weights", "reset_parameters"):
        fn = getattr(model, method, None)
        if callable(fn):
            fn()
            return f"{name}.{method}()"
    count = 0
    for m in model.modules():
        if m is not model and callable(getattr(m, "reset_parameters", None)):
            m.reset_parameters()
            count += 1
    if not count:
        raise ConfigError(
            f"model.meta_init: {name} has no init_weights() or reset_parameters() "
            "to initialise it after sharding: add one, or set model.meta_init=false"
        )
    return f"reset_parameters() of {count} submodules"


def unwrap(model: nn.Module) -> nn.Module:
    return getattr(model, "module", model)
