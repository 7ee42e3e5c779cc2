"""The factory sections of the trainer config: ``model``, ``data``, ``loss``, ``optim``,
``validation``.

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
    freeze: list[str] = dataclasses.field(default_factory=list)
    """Parameters that do not train (fine-tuning with a frozen base): patterns
    (fnmatch, e.g. ``model.layers.0.*``, ``*embed_tokens*``) of the names the factory's
    module gives them (``named_parameters()``, before any sharding). Each pattern must
    match a parameter. Their gradients are not computed and the optimizer holds no state
    for them; with checkpoint.incremental a checkpoint references them instead of writing
    them again."""
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


#: ``validation.milestones``: what retention keeps of the checkpoints saved as milestones.
MILESTONE_POLICIES = ("best", "all", "none")


@dataclasses.dataclass(kw_only=True, slots=True)
class ValidationConfig:
    """A held-out set evaluated every ``every`` steps on every rank, and the best
    checkpoint by one of its metrics kept as a milestone (trainer/validation.py). Every
    other key of the section is the factories' (the built-in ``synthetic``'s: vocab_size,
    seq_len). Not part of the config hash: an evaluation does not change the trajectory."""

    FACTORY_KEYS: ClassVar[tuple[str, ...]] = ("factory", "metrics")
    every: int = 0
    """Evaluate after every this many steps; 0: no validation."""
    factory: str = "synthetic"
    """The held-out set, a dataset factory as ``data.factory`` (`module:callable` or a
    built-in): `synthetic` (samples of the training stream's chain that training never
    reads), `token_shards` (`path`: a held-out split prepared like the training data)."""
    metrics: str = "loss"
    """`module:callable` called as metrics(cfg) -> fn(model, batch) -> a mapping of metric
    name to a scalar tensor (the micro-batch's mean), or the built-in `loss` (the
    ``loss.factory``'s loss, as `loss`). Each batch's value is weighted by its samples
    (the first dimension of its first tensor), not by tokens: a loss averaged over
    tokens with padding or ignored positions gets a per-sample weighting."""
    batches: int = 4
    """Batches of ``batch_size`` samples per evaluation; 0: the whole set (a sized one),
    the last partial batch left out."""
    batch_size: int = 0
    """Samples per evaluation batch over all ranks (a multiple of the world size); 0:
    ``train.global_batch_size``."""
    metric: str = "loss"
    """The metric that picks the milestone: one of the names the metrics function returns."""
    mode: str = "min"
    """`min` (a loss) or `max` (an accuracy): which way is better."""
    milestones: str = "best"
    """`best`: the checkpoint of the best evaluation so far is saved and kept by every
    tier until a better one supersedes it. `all`: each checkpoint that was the best when
    saved is kept by the durable tiers for good (the fast tier keeps the best). `none`:
    evaluate and log only."""
    args: dict[str, Any] = _factory_args()
    factories: dict[str, Any] = _bound()

    def __post_init__(self) -> None:
        for key in ("every", "batches", "batch_size"):
            if getattr(self, key) < 0:
                raise ConfigError(f"validation.{key}={getattr(self, key)}: use 0 or more")
        if self.mode not in ("min", "max"):
            raise ConfigError(f"validation.mode={self.mode!r}: use min (lower is better) or max")
        if self.milestones not in MILESTONE_POLICIES:
            raise ConfigError(f"validation.milestones={self.milestones!r}: use best, all or none")
        if not self.metric:
            raise ConfigError("validation.metric is empty: name a metric, e.g. loss")
        self.factories = bind_section(self, "validation", self.args)

    @property
    def enabled(self) -> bool:
        return self.every > 0
