"""A tiny causal sequence model with its own class names and config."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn


@dataclasses.dataclass
class TinyLMConfig:
    """The model section's keys (ftfleet checks them: an unknown one is refused)."""

    vocab: int = 32
    width: int = 32
    depth: int = 2
    dropout: float = 0.0


class Mixer(nn.Module):
    """Mixes each position with the one before it (causal), then an MLP; residual."""

    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.mix = nn.Linear(2 * width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
        self.drop = nn.Dropout(dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.norm(h)
        prev = torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1]], dim=1)
        x = self.mix(torch.cat([x, prev], dim=-1))
        return h + self.drop(self.mlp(x))


class TinyLM(nn.Module):
    def __init__(self, cfg: TinyLMConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.layers = nn.ModuleList(Mixer(cfg.width, cfg.dropout) for _ in range(cfg.depth))
        self.head = nn.Linear(cfg.width, cfg.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def build(cfg: TinyLMConfig) -> TinyLM:
    return TinyLM(cfg)
