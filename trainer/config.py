"""Typed configuration of a training run: a YAML file, then the fleet's environment,
then ``key.sub=value`` overrides from the command line, validated once, here.

Every error is a :class:`ftfleet.errors.ConfigError` whose one line names the key and
the fix. Nothing else in the trainer reads YAML, the environment or argv.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import os
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ftfleet.errors import ConfigError, require_positive
from ftfleet.trainer.checkpoint.config import CheckpointConfig
from ftfleet.trainer.config_sections import DataConfig, LossConfig, ModelConfig, OptimConfig, ValidationConfig
from ftfleet.trainer.environment import CONFIG_OVERRIDES, TrainerEnvironment
from ftfleet.trainer.factories import import_callable
from ftfleet.trainer.resilience.config import ResilienceConfig


@dataclasses.dataclass(kw_only=True, slots=True)
class TrainConfig:
    steps: int = 300
    """Total optimizer steps of the run; also the length of the LR schedule."""
    global_batch_size: int = 8
    """Samples per step over all ranks; must be divisible by the world size. Keeping it
    fixed when the world size changes keeps the sample stream identical."""
    log_every: int = 50
    """Log loss and throughput every this many steps (rank 0)."""
    step_events: bool = False
    """Append a `step` line per step to <run_dir>/events.jsonl (drills measure lost work
    with it); other events (restore, notices, commits, anomalies, exit) are always logged."""
    stop_at_step: int | None = None
    """Stop cleanly after this step with a committed checkpoint, as if preempted, without
    changing the LR schedule (a resumed run continues to train.steps)."""
    state_hash: bool = False
    """Write `state_sha256` (a hash of the unsharded model and optimizer state) to
    summary.json, to compare runs bit for bit. It gathers the whole state onto rank 0's
    host memory: for tests and drills, not for a model at scale."""
    huge_pages: bool = True
    """Large CPU tensors on transparent huge pages (PyTorch's ``THP_MEM_ALLOC_ENABLE``;
    trainer/hostmem.py). Without them every step's big tensors come back as fresh 4 KiB
    pages: on the goodput bench about 70% of a CPU rank's time went to the kernel (page faults).
    Set before the model is built; an explicit THP_MEM_ALLOC_ENABLE=0 is kept."""

    def __post_init__(self) -> None:
        _positive("train.steps", self.steps)
        _positive("train.global_batch_size", self.global_batch_size)
        _positive("train.log_every", self.log_every)
        if self.stop_at_step is not None and self.stop_at_step < 0:
            raise ConfigError(f"train.stop_at_step={self.stop_at_step}: use a step >= 0 or null")


@dataclasses.dataclass(kw_only=True, slots=True)
class ParallelConfig:
    mode: str = "fsdp"
    """`fsdp` (FSDP2 fully_shard per block) or `ddp`. Checkpoints are interchangeable."""
    backend: str = "auto"
    """`auto` (NCCL with a gloo side for CPU work when CUDA is present, else gloo),
    `gloo` or `nccl`."""
    wrap: list[str] = dataclasses.field(default_factory=lambda: ["auto"])
    """Which submodules FSDP2 shards as a unit (then the root): `auto` (a Hugging Face
    model's _no_split_modules, else the blocks of the model's ModuleLists), class names
    (`[Block]`, `[LlamaDecoderLayer]`), or one `module:callable` called as fn(model) ->
    the modules."""
    mixed_precision: str = "none"
    """`bf16`: FSDP2 computes with bf16 parameters and reduces gradients in fp32; the
    sharded parameters, the optimizer and the checkpoint stay fp32. `none`: fp32."""
    replicas: int = 1
    """Hybrid sharding (HSDP, FSDP2 on a two-dimensional mesh): the ranks form ``replicas``
    groups of world_size / replicas consecutive ranks; each group shards the model and
    optimizer state over its ranks (keep a group within a node or a few), and the groups
    hold copies of one another's shards, kept equal by an all-reduce of the gradient
    shards across groups each step. Every shard then lives on ``replicas`` ranks. Cost
    against 1 (plain FSDP over all ranks): per rank ``replicas`` times the parameter,
    gradient and optimizer memory, and each step also moves 2 (replicas - 1) / replicas
    of a gradient shard (the full model's gradients over world_size / replicas ranks)
    per rank across groups. Checkpoints are written once per shard and restore at any
    ``replicas`` and world size. With ``checkpoint.memory`` a rank whose node is lost
    heals from a live replica's snapshot (a group of at least one node's ranks puts the
    replicas of a shard on different nodes), and ``checkpoint.memory_peer_every: 0`` drops the peer copies. FSDP
    only; must divide the world size."""
    collective_timeout_s: float | None = None
    """Seconds a collective of the training group waits for a peer before it fails; null:
    torch's default (30 min gloo, 10 min NCCL). Under in-process restart this is how the
    survivors of a hung rank find out (the failed collective restarts them in place, the
    hung rank is interrupted or, stuck in native code, replaced): set it well above the
    slowest normal wait (a restore, the first step, a straggler), and below
    resilience.watchdog.timeout_s, which ends the process instead. It covers HSDP's
    mesh groups too on CPU; on a GPU those NCCL groups keep NCCL's default."""

    def __post_init__(self) -> None:
        if self.collective_timeout_s is not None and not 0 < self.collective_timeout_s < 86400:
            raise ConfigError(
                f"parallel.collective_timeout_s={self.collective_timeout_s}: "
                "use seconds > 0 (under a day), or null for torch's default"
            )
        if self.mode not in ("fsdp", "ddp"):
            raise ConfigError(f"parallel.mode={self.mode!r}: use fsdp or ddp")
        if self.replicas < 1:
            raise ConfigError(f"parallel.replicas={self.replicas}: use 1 (plain FSDP) or more replica groups")
        if self.replicas > 1 and self.mode != "fsdp":
            raise ConfigError(
                f"parallel.replicas={self.replicas} needs parallel.mode=fsdp (DDP replicates everything already)"
            )
        if self.backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"parallel.backend={self.backend!r}: use auto, gloo or nccl")
        if self.mixed_precision not in ("none", "bf16"):
            raise ConfigError(f"parallel.mixed_precision={self.mixed_precision!r}: use none or bf16")
        if self.mixed_precision != "none" and self.mode != "fsdp":
            raise ConfigError(
                f"parallel.mixed_precision={self.mixed_precision} needs parallel.mode=fsdp (FSDP2's policy)"
            )
        if not self.wrap:
            raise ConfigError("parallel.wrap is empty: use auto, class names, or one module:callable")
        special = [w for w in self.wrap if w == "auto" or ":" in w]
        if special and len(self.wrap) > 1:
            raise ConfigError(
                f"parallel.wrap={self.wrap}: {special[0]} stands alone; list class names, or give it by itself"
            )
        if ":" in self.wrap[0]:
            import_callable("parallel.wrap", self.wrap[0])


@dataclasses.dataclass(kw_only=True, slots=True)
class JobConfig:
    run_id: str = "local"
    """Identifies the run; a checkpoint of another run is refused. Env: FTFLEET_RUN_ID."""
    run_dir: str = ""
    """Where events.jsonl, summary.json (and by default checkpoints) go. Empty:
    runs/<run_id>. Env: FTFLEET_RUN_DIR (on a fleet node, its directory on the fast tier)."""
    seed: int = 0
    """Seeds model init, the token stream and per-rank RNGs."""
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    validation: ValidationConfig = dataclasses.field(default_factory=ValidationConfig)
    resilience: ResilienceConfig = dataclasses.field(default_factory=ResilienceConfig)

    def __post_init__(self) -> None:
        if not self.run_id or "/" in self.run_id:
            raise ConfigError(f"run_id={self.run_id!r}: use a non-empty name without '/'")
        for key in ("memory_share", "notice_share"):
            if getattr(self.resilience.interval, key) and not self.checkpoint.memory:
                raise ConfigError(
                    f"resilience.interval.{key}={getattr(self.resilience.interval, key)}: set checkpoint.memory=true "
                    "(it plans the in-memory snapshots; without them every failure restores from disk), or use 0"
                )
        if not self.run_dir:
            self.run_dir = str(Path("runs") / self.run_id)
        if not self.checkpoint.dir:
            self.checkpoint.dir = str(Path(self.run_dir) / "checkpoints")

    def config_hash(self) -> str:
        """Hash of what determines the training trajectory: model, data, loss, optimizer,
        seed and global batch. Run length, checkpointing, parallelism, how data is read
        and where things are (paths, init_from) are excluded, so a run can be extended or
        moved to another world size or FSDP/DDP and still resume."""
        identity = {
            "model": _section_identity(self.model, skip=("init_from", "meta_init")),
            "data": _section_identity(self.data, skip=("num_workers", "start_method", "trace_samples")),
            "loss": _section_identity(self.loss),
            "optim": _section_identity(self.optim),
            "seed": self.seed,
            "global_batch_size": self.train.global_batch_size,
        }
        blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def effective(self) -> dict[str, Any]:
        """Every key as this run has it (the defaults, then the file, the environment and
        the overrides), shaped as a config file: a factory section's own keys beside its
        factories' (a built-in factory's with their defaults)."""
        return _effective(self)


#: Environment variables of the fleet contract that override config keys.
ENV_OVERRIDES = CONFIG_OVERRIDES


def load_config(
    path: str | os.PathLike | None, overrides: list[str] = (), environ: Mapping[str, str] | None = None
) -> JobConfig:
    """File, then environment (:data:`~ftfleet.trainer.environment.CONFIG_OVERRIDES`), then
    ``key.sub=value`` overrides."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"--config {path}: cannot read ({exc.strerror}); pass an existing YAML file") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"--config {path}: {_yaml_problem(exc)}; fix the file") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"--config {path}: top level must be a mapping of keys")
    for var, key, value in TrainerEnvironment(environ).config_overrides():
        _set_dotted(raw, key, value, source=var)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: write key.sub=value, e.g. train.steps=100")
        try:
            parsed = yaml.safe_load(value) if value else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"override {item!r}: {_yaml_problem(exc)}; quote the value or fix it") from None
        _set_dotted(raw, key.strip(), parsed, source=item)
    return build(JobConfig, raw, prefix="")


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: where and what (PyYAML's own message spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "not valid YAML"
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "not valid YAML"
    return f"{where}: {' '.join(str(problem).split())}"


def _section_identity(section: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {
        f.name: getattr(section, f.name)
        for f in dataclasses.fields(section)
        if f.init and f.metadata.get("config_key", True) and f.name not in skip
    }
    for key, factory in section.factories.items():
        out[f"{key}.args"] = factory.hash_view()
    return out


def _effective(section: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(section):
        if f.init and f.metadata.get("config_key", True):
            value = getattr(section, f.name)
            out[f.name] = _effective(value) if dataclasses.is_dataclass(value) else copy.deepcopy(value)
    for factory in getattr(section, "factories", {}).values():
        args = factory.args
        out.update(dataclasses.asdict(args) if dataclasses.is_dataclass(args) else dict(args or {}))
    return out


def _set_dotted(raw: dict[str, Any], key: str, value: Any, source: str) -> None:
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{source}: {part} is not a section; check the key name")
        node = child
    node[parts[-1]] = value


def build(cls: type, raw: Mapping[str, Any], prefix: str) -> Any:
    """Build dataclass ``cls`` from a mapping, checking keys and types. A factory
    section (one with FACTORY_KEYS) hands the keys that are not its own to its
    factories (trainer/factories.py), which check them."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.metadata.get("config_key", True)]
    factory_section = hasattr(cls, "FACTORY_KEYS")
    kwargs: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in names:
            if factory_section:
                extras[str(key)] = value
                continue
            near = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {prefix}{near[0]}?" if near else f"valid keys: {', '.join(names)}"
            raise ConfigError(f"unknown config key {prefix}{key}: {hint}")
        kwargs[key] = _coerce(hints[key], value, f"{prefix}{key}")
    if factory_section:
        kwargs["args"] = extras
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, key: str) -> Any:
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value if value is not None else {}, prefix=f"{key}.")
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)) and (
            value is None or (isinstance(value, str) and value.lower() in ("", "null", "none"))
        ):
            return None
        for i, arg in enumerate(args):  # the first type the value fits (bool | str: true, auto)
            try:
                return _coerce(arg, value, key)
            except ConfigError:
                if i == len(args) - 1:
                    raise
        raise TypeError(f"unsupported config type {tp} for {key}")  # pragma: no cover
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}={value!r}: expected a mapping of keys, e.g. {{a: 1}}")
        return dict(value)
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r}: expected a list, e.g. [100, 200]")
        return [_coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{key}={value!r}: expected true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}={value!r}: expected an integer")
        try:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}={value!r}: expected an integer") from None
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}={value!r}: expected a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}={value!r}: expected a number, e.g. 3e-4") from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}={value!r}: expected a string")
        return "" if value is None else str(value)
    raise TypeError(f"unsupported config type {tp} for {key}")  # pragma: no cover


def _positive(key: str, value: int) -> None:
    require_positive(key, value)
