"""Built-in optimizers and LR schedules (``optim.factory``, ``optim.scheduler``)."""

from __future__ import annotations

import math

import torch
from torch import nn

from ftfleet.trainer.schemas import AdamWConfig, NoKeys, WarmupCosineConfig


def adamw(cfg: AdamWConfig, model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=True,  # one kernel per step; also takes an anomaly verdict as found_inf without a host sync
    )


def warmup_cosine(
    cfg: WarmupCosineConfig, optimizer: torch.optim.Optimizer, job
) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warmup from 0 to the optimizer's lr, then cosine decay to
    lr * min_lr_ratio at train.steps."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, job.train.steps))


def lr_lambda(cfg: WarmupCosineConfig, total: int):
    warmup, floor = cfg.warmup_steps, cfg.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def constant(cfg: NoKeys, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    del cfg
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
