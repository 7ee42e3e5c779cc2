"""SGD with momentum; norms, biases and embeddings without weight decay."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class SGDConfig:
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0


def sgd(cfg: SGDConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed" not in name else rest).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum)
