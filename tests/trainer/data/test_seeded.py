"""Per-sample randomness (trainer/data/seeded.py): a sample's random augmentation is a
function of the sample, wherever and whenever it is read. With loader workers, the
same holds through a SIGKILL and resume: tests/trainer/scenarios/test_vision.py."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from ftfleet.trainer.data.loader import GlobalBatches
from ftfleet.trainer.data.seeded import SeededSamples, sample_generator, sample_rng, sample_seed

B = 6


class Augmented:
    """Item i: [i, a draw from each global RNG and from the per-sample helpers]."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> torch.Tensor:
        draws = [
            float(torch.rand(())),
            float(np.random.rand()),
            random.random(),
            float(torch.rand((), generator=sample_generator())),
            float(sample_rng().random()),
        ]
        return torch.tensor([float(i), *draws], dtype=torch.float64)


def read(rank: int, world: int, steps: range) -> dict[int, torch.Tensor]:
    """Global position -> the sample read there, for the steps ``steps``."""
    reader = GlobalBatches(Augmented(), B, rank, world, torch.device("cpu"), seed=3)
    out = {}
    for step in steps:
        batch = reader.get(step * B, step + 1)
        out.update(zip(batch.sample_ids, batch.data, strict=True))
    reader.close()
    return out


def test_a_samples_draws_are_the_same_at_any_world_size_and_after_a_resume():
    whole = read(0, 1, range(4))  # 24 positions: 2.4 epochs of 10 samples
    split = {**read(0, 2, range(4)), **read(1, 2, range(4))}
    resumed = read(0, 1, range(2, 4))  # a reader opened at step 2, as after a restore
    assert set(whole) == set(split) == set(range(24))
    for position, sample in whole.items():
        assert torch.equal(sample, split[position]), position
    for position, sample in resumed.items():
        assert torch.equal(sample, whole[position]), position


def test_each_sample_and_each_epoch_draws_its_own_numbers():
    whole = read(0, 1, range(4))
    draws = [tuple(s[1:].tolist()) for s in whole.values()]
    assert len(set(draws)) == len(draws)  # the same index in the next epoch draws anew


def test_reading_leaves_the_training_rngs_where_they_were():
    def training_draws() -> tuple:
        return float(torch.rand(())), float(np.random.rand()), random.random()

    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    expected = training_draws()
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    read(0, 1, range(2))
    assert training_draws() == expected


def test_sample_seed_outside_a_fetch_says_where_it_belongs():
    with pytest.raises(RuntimeError, match="__getitem__"):
        sample_seed()


def test_seeded_samples_give_a_loop_of_its_own_the_same_per_epoch():
    data = SeededSamples(Augmented(), seed=3)
    first = [data[i] for i in range(10)]
    assert all(torch.equal(a, data[i]) for i, a in enumerate(first))
    data.set_epoch(1)
    assert not any(torch.equal(a[1:], data[i][1:]) for i, a in enumerate(first))
