"""The factory sections of the trainer config: ``model``, ``data``, ``loss``, ``optim``.

Each names its factories (trainer/factories.py) and holds ftfleet's own keys; every
other key of the section is the factories' (``args``), checked against what each
factory declares when the section is built. Loading is trainer/config.py's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from ftfleet.errors import ConfigError
from ftfleet.trainer.factories import bind_section


def _factory_args() -> Any:
    """``args``: the factories' keys as written (every key of the section that is not
    ftfleet's); not a key of its own."""
    return dataclasses.field(default_factory=dict, metadata={"config_key": False})


def _bound() -> Any:
    """``factories``: factory key -> the resolved :class:`Factory`, with what it receives."""
    return dataclasses.field(init=False, default_factory=dict, repr=False, compare=False)


@dataclasses.dataclass(kw_only=True, slots=True)
class ModelConfig:
    """The model: a factory, and where its first weights come from. Every other key of
    the section is the factory's (``gpt``'s: vocab_size, seq_len, d_model, n_layers,
    n_heads, mlp_ratio, dropout; see trainer/schemas.py)."""

    FACTORY_KEYS: ClassVar[tuple[str, ...]] = ("factory",)
    factory: str = "gpt"
    """`module:callable` called as factory(cfg) -> torch.nn.Module, or a built-in: `gpt`
    (the reference decoder), `hf_causal_lm` (a Hugging Face causal LM from a local config)."""
    init_from: str = ""
    """Pretrained weights a run starts from when there is no checkpoint to resume: a DCP
    directory, a torch.save file, or a safetensors file or directory. Every parameter
    must be there with its shape. Not part of the config hash: a checkpoint always wins."""
    meta_init: bool = False
    """Build the model on the meta device, shard it, then allocate only this rank's shards
    and initialise them (the model's init_weights() or reset_parameters()): for models
    that do not fit on one device. Not part of the config hash."""
    args: dict[str, Any] = _factory_args()
    factories: dict[str, Any] = _bound()

    def __post_init__(self) -> None:
        self.factories = bind_section(self, "model", self.args)


@dataclasses.dataclass(kw_only=True, slots=True)
class DataConfig:
    """The dataset and how it is read. Sample i of a map-style dataset is read at global
    position i (shuffled by a seeded permutation per epoch), so any rank can read any
    sample and a resumed run continues at a global sample index on any world size. Each
    sample is fetched with torch's, numpy's and Python's global RNGs seeded from (seed,
    epoch, index), so random augmentation drawn from them resumes exactly at any worker
    count (trainer/data/seeded.py)."""

    FACTORY_KEYS: ClassVar[tuple[str, ...]] = ("factory",)
    factory: str = "synthetic"
    """`module:callable` called as factory(cfg) -> a map-style dataset (len and getitem)
    or an IterableDataset (with state_dict/load_state_dict for an exact resume), or a
    built-in: `synthetic` (a learnable random stream), `token_shards` (docs/DATA.md)."""
    num_workers: int = 2
    """DataLoader worker processes per rank (0: read in the training process)."""
    start_method: str = "auto"
    """How the workers start: `forkserver` (forked from a server process that imported
    torch once; the dataset must pickle), `spawn`, `fork` (forks the trainer, which runs
    threads: on CPython 3.11 before 3.11.10 that can deadlock the worker, gh-112275), or
    `auto`: forkserver on such an interpreter, else fork (docs/DATA.md)."""
    shuffle: bool = True
    """Visit a sized map-style dataset in a seeded random order, a new one each epoch."""
    trace_samples: bool = False
    """Write the global sample indices each rank consumed to <run_dir>/samples/ (tests)."""
    args: dict[str, Any] = _factory_args()
    factories: dict[str, Any] = _bound()

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ConfigError(f"data.num_workers={self.num_workers}: use 0 or more")
        if self.start_method not in ("auto", "forkserver", "spawn", "fork"):
            raise ConfigError(f"data.start_method={self.start_method!r}: use auto, forkserver, spawn or fork")
        self.factories = bind_section(self, "data", self.args)


@dataclasses.dataclass(kw_only=True, slots=True)
class LossConfig:
    """The loss: factory(cfg) returns loss(model, batch) -> a scalar tensor."""

    FACTORY_KEYS: ClassVar[tuple[str, ...]] = ("factory",)
    factory: str = "next_token"
    """`module:callable`, or the built-in `next_token` (cross-entropy of next-token
    prediction; handles a Hugging Face model's output)."""
    args: dict[str, Any] = _factory_args()
    factories: dict[str, Any] = _bound()

    def __post_init__(self) -> None:
        self.factories = bind_section(self, "loss", self.args)


@dataclasses.dataclass(kw_only=True, slots=True)
class OptimConfig:
    """The optimizer and its LR schedule. Every other key of the section belongs to them
    (`adamw`: lr, weight_decay, beta1, beta2, eps; `warmup_cosine`: warmup_steps,
    min_lr_ratio)."""

    FACTORY_KEYS: ClassVar[tuple[str, ...]] = ("factory", "scheduler")
    factory: str = "adamw"
    """`module:callable` called as factory(cfg, model) -> torch.optim.Optimizer, or `adamw`."""
    scheduler: str = "warmup_cosine"
    """`module:callable` called as scheduler(cfg, optimizer) -> LRScheduler, or a built-in:
    `warmup_cosine` (linear warmup, cosine decay over train.steps), `constant`."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    args: dict[str, Any] = _factory_args()
    factories: dict[str, Any] = _bound()

    def __post_init__(self) -> None:
        if self.grad_clip < 0:
            raise ConfigError(f"optim.grad_clip={self.grad_clip}: use 0 (off) or a positive norm")
        self.factories = bind_section(self, "optim", self.args)
