"""A map-style dataset: sample i is a counting sequence, a pure function of i."""

from __future__ import annotations

import torch


class CountingSequences:
    def __init__(self, samples: int, length: int, vocab: int):
        self.samples, self.length, self.vocab = samples, length, vocab

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start, stride = i % self.vocab, 1 + i % 3
        seq = (start + stride * torch.arange(self.length + 1)) % self.vocab
        return {"x": seq[:-1], "y": seq[1:]}


def build(cfg: dict) -> CountingSequences:
    """No dataclass annotation: the factory gets the data section's own keys as a dict."""
    return CountingSequences(int(cfg["samples"]), int(cfg["length"]), int(cfg["vocab"]))
