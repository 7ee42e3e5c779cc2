"""``model.factory: hf_causal_lm``: a Hugging Face causal LM built from a config on
disk or from a model type and overrides. Nothing is downloaded: the weights are
initialised by the model (or come from ``model.init_from``, e.g. a local
``model.safetensors``)."""

from __future__ import annotations

from torch import nn

from ftfleet.errors import ConfigError
from ftfleet.trainer.schemas import HFCausalLMConfig


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
