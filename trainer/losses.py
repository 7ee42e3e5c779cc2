"""Built-in losses (``loss.factory``). A loss factory returns ``loss(model, batch)``:
the model's forward pass is the loss's, so a loss decides what of the batch the model
sees (token ids, a dict of tensors, inputs and labels...)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ftfleet.trainer.schemas import NextTokenConfig


def next_token(cfg: NextTokenConfig) -> Callable[[nn.Module, Any], torch.Tensor]:
    """``loss.factory: next_token``: the batch is a (batch, seq_len + 1) tensor of token
    ids; the model sees all but the last and predicts each next token."""
    del cfg
    return next_token_loss


def next_token_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    out = model(batch[:, :-1])
    logits = getattr(out, "logits", out)
    # In fp32 whatever the compute dtype: a bf16 log-softmax over a large vocabulary
    # loses most of the loss's precision.
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
