"""A user's own CNN with BatchNorm on small images with random augmentation, by config
only (tests/trainer/scenarios/vision.yaml): the kind of model and data whose exact
resume needs each rank's own buffers (FSDP2 leaves every rank its own running
statistics) and each sample's own random numbers (drawn in the loader's workers)."""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """conv 3x3, BatchNorm, ReLU; residual."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.norm(self.conv(x)))


class CNN(nn.Module):
    def __init__(self, channels: int, classes: int, depth: int):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.blocks = nn.ModuleList(Block(channels) for _ in range(depth))
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h.mean(dim=(2, 3)))


def model(cfg: dict) -> CNN:
    return CNN(int(cfg["channels"]), int(cfg["classes"]), int(cfg["depth"]))


class Patterns:
    """Image i: its class's stripe pattern plus noise, a pure function of i; with
    ``augment``, flipped and shifted at random as torchvision's transforms do, from
    torch's global RNG (and numpy's, and ``random``'s), drawn in the loader's workers."""

    def __init__(self, samples: int, size: int, classes: int, augment: bool):
        self.samples, self.size, self.classes, self.augment = samples, size, classes, augment

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        label = i % self.classes
        rng = np.random.default_rng([17, i])
        grid = np.add.outer(np.arange(self.size), (label + 1) * np.arange(self.size)) % (label + 2)
        image = np.stack([grid, grid.T, -grid]).astype(np.float32) + rng.normal(0, 0.3, (3, self.size, self.size))
        x = torch.from_numpy(image.astype(np.float32))
        if self.augment:
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
            x = x.roll(tuple(torch.randint(-2, 3, (2,)).tolist()), dims=(1, 2))
            x = x * float(np.random.uniform(0.8, 1.2)) + random.gauss(0, 0.1)
        return {"x": x, "y": torch.tensor(label)}


def data(cfg: dict) -> Patterns:
    return Patterns(int(cfg["samples"]), int(cfg["size"]), int(cfg["classes"]), bool(cfg.get("augment", False)))


def loss(cfg: dict):
    def cross_entropy(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(model(batch["x"]), batch["y"])

    return cross_entropy
