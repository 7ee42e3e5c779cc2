"""The keys of ftfleet's built-in factories, one dataclass each.

A factory section of the trainer config (``model``, ``data``, ``loss``, ``optim``)
names its factory and, beside ftfleet's own keys, holds the factory's keys. These
dataclasses declare them for the built-ins, exactly as a user's factory declares its
own by annotating its first parameter with a dataclass (trainer/factories.py). They
import nothing heavy, so that a config is checked before torch is imported.

A field whose metadata says ``hash=False`` is left out of the config hash: it says
where something is, not what the run computes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ftfleet.errors import ConfigError


def _positive(key: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{key}={value}: use a positive integer")


@dataclasses.dataclass(kw_only=True, slots=True)
class GPTConfig:
    """The reference decoder (``model.factory: gpt``)."""

    vocab_size: int = 256
    """Tokens in the vocabulary; the synthetic stream draws from all of them."""
    seq_len: int = 64
    """Context length in tokens (each sample holds seq_len + 1 tokens)."""
    d_model: int = 64
    """Width of the residual stream."""
    n_layers: int = 2
    """Transformer blocks; FSDP2 shards each one separately."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    mlp_ratio: int = 4
    """Hidden width of the MLP as a multiple of d_model."""
    dropout: float = 0.0
    """Dropout probability. Non-zero makes resume depend on the saved RNG state."""

    def __post_init__(self) -> None:
        for key in ("vocab_size", "seq_len", "d_model", "n_layers", "n_heads", "mlp_ratio"):
            _positive(f"model.{key}", getattr(self, key))
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model={self.d_model} is not divisible by "
                f"model.n_heads={self.n_heads}: choose n_heads dividing d_model"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout={self.dropout}: use a probability in [0, 1)")


@dataclasses.dataclass(kw_only=True, slots=True)
class HFCausalLMConfig:
    """A Hugging Face causal LM built from a config, never downloaded
    (``model.factory: hf_causal_lm``; needs ``transformers``)."""

    config: str = ""
    """A local directory holding config.json, or the path of a config.json file."""
    model_type: str = ""
    """Instead of ``config``: a transformers model type (``llama``, ``gpt2``, ...) whose
    config is built from ``overrides`` and the type's defaults."""
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Config attributes set on top (``hidden_size``, ``num_hidden_layers``, ...)."""

    def __post_init__(self) -> None:
        if bool(self.config) == bool(self.model_type):
            raise ConfigError(
                "model.factory=hf_causal_lm: set exactly one of model.config (a local config "
                "directory or config.json) and model.model_type (e.g. llama)"
            )


@dataclasses.dataclass(kw_only=True, slots=True)
class SyntheticConfig:
    """A learnable random token stream (``data.factory: synthetic``): sample i is a
    function of (seed, i) only."""

    vocab_size: int = 0
    """Tokens drawn from; 0: the model section's vocab_size."""
    seq_len: int = 0
    """Tokens per sample (plus one for the shifted targets); 0: the model section's seq_len."""

    def __post_init__(self) -> None:
        for key in ("vocab_size", "seq_len"):
            if getattr(self, key) < 0:
                raise ConfigError(f"data.{key}={getattr(self, key)}: use a positive integer, or 0 for the model's")


@dataclasses.dataclass(kw_only=True, slots=True)
class TokenShardsConfig:
    """Memory-mapped token shards written by ``ftfleet data prepare``
    (``data.factory: token_shards``; the format is docs/DATA.md)."""

    path: str = dataclasses.field(default="", metadata={"hash": False})
    """The shard directory (the one holding index.json), on the fast tier."""
    seq_len: int = 0
    """Tokens per sample (plus one for the shifted targets); 0: the model section's seq_len."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("data.path is empty: set the directory written by `ftfleet data prepare`")
        if self.seq_len < 0:
            raise ConfigError(f"data.seq_len={self.seq_len}: use a positive integer, or 0 for the model's")


@dataclasses.dataclass(kw_only=True, slots=True)
class NextTokenConfig:
    """Cross-entropy of each token's prediction of the next (``loss.factory: next_token``).
    A batch is a (batch, seq_len + 1) tensor of token ids; the model's output is the
    logits, or an object with ``.logits`` (Hugging Face)."""


@dataclasses.dataclass(kw_only=True, slots=True)
class AdamWConfig:
    """``optim.factory: adamw``: torch.optim.AdamW over every parameter."""

    lr: float = 3e-3
    """Peak learning rate."""
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"optim.lr={self.lr}: use a positive learning rate")
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay={self.weight_decay}: use 0 or more")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"optim.{key}={getattr(self, key)}: use a value in [0, 1)")
        if self.eps <= 0:
            raise ConfigError(f"optim.eps={self.eps}: use a positive number")


@dataclasses.dataclass(kw_only=True, slots=True)
class WarmupCosineConfig:
    """``optim.scheduler: warmup_cosine``: linear warmup, then cosine decay over train.steps."""

    warmup_steps: int = 10
    """Steps of linear warmup from 0 to the optimizer's lr."""
    min_lr_ratio: float = 0.1
    """The cosine decays to lr * min_lr_ratio at train.steps."""

    def __post_init__(self) -> None:
        if self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps={self.warmup_steps}: use 0 or more")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio={self.min_lr_ratio}: use a value in [0, 1]")


@dataclasses.dataclass(kw_only=True, slots=True)
class NoKeys:
    """A built-in that takes no keys (``optim.scheduler: constant``)."""
