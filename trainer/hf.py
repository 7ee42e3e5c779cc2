"""``model.factory: hf_causal_lm``: a Hugging Face causal LM built from a config on
disk or from a model type and overrides. Nothing is downloaded: the weights are
initialised by the model (or come from ``model.init_from``, e.g. a local
``model.safetensors``)."""

from __future__ import annotations

from torch import nn

from ftfleet.errors import ConfigError
from ftfleet.trainer.schemas import HFCausalLMConfig

#: The AppState extra that holds a Hugging Face model's config (:class:`ConfigRecord`).
CONFIG_EXTRA = "hf_config"


class ConfigRecord:
    """A Hugging Face model's config, kept in its checkpoints (an AppState extra) so that
    ``ftfleet ckpt export`` writes the ``config.json`` that ``from_pretrained`` reads beside
    the weights. Loading it changes nothing: the run's own config builds the model."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, str]:
        import json

        config = self.model.config.to_dict()
        # The transformers class the model is (FSDP2 and DDP wrap it in classes of their own).
        names = [c.__name__ for c in type(self.model).__mro__ if c.__module__.startswith("transformers.models.")]
        config["architectures"] = names[:1] or config.get("architectures")
        return {"json": json.dumps(config, indent=2, sort_keys=True) + "\n"}

    def load_state_dict(self, state: dict[str, str]) -> None:
        pass


def config_record(model: nn.Module) -> ConfigRecord | None:
    """A :class:`ConfigRecord` of ``model`` (or of the module a DDP wrapper holds) when it
    is a Hugging Face model; else None."""
    inner = getattr(model, "module", model)
    return ConfigRecord(inner) if callable(getattr(getattr(inner, "config", None), "to_dict", None)) else None


def causal_lm(cfg: HFCausalLMConfig) -> nn.Module:
    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise ConfigError("model.factory=hf_causal_lm needs transformers: pip install 'ftfleet[hf]'") from None
    try:
        if cfg.config:
            hf_config = AutoConfig.from_pretrained(cfg.config, local_files_only=True, **cfg.overrides)
        else:
            hf_config = AutoConfig.for_model(cfg.model_type, **cfg.overrides)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        what = f"model.config={cfg.config}" if cfg.config else f"model.model_type={cfg.model_type}"
        detail = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"{what}: no usable Hugging Face config ({type(exc).__name__}: {detail[:200]})") from None
    hf_config.use_cache = False  # a key/value cache serves generation, not training
    return AutoModelForCausalLM.from_config(hf_config)
