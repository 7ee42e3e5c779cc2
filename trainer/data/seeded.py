"""Per-sample randomness: a sample's random augmentation as a function of the sample.

A dataset that draws random numbers in ``__getitem__`` (a random crop or flip, as
torchvision's transforms do, from torch's global RNG) resumes exactly only if each
sample sees the same random numbers in the resumed run as in an uninterrupted one. A
loader worker's RNG streams through the samples that worker happened to fetch, and a
resumed run starts new workers; so instead every sample is fetched under RNGs seeded
from ``(seed, epoch, index)``: torch's CPU generator, numpy's global one and Python's
``random``. The trainer does this for every map-style dataset, in its loader workers
and in the training process alike (there the training RNGs are put back after each
sample): a sample's augmentation is then the same at any worker count and world size,
resumed or not.

A dataset that keeps generators of its own seeds them per sample from :func:`sample_seed`
(or takes :func:`sample_generator`, :func:`sample_rng`); one seeded once in
``__init__`` streams through samples and is not exact. In a loop of your own, wrap the
dataset in :class:`SeededSamples`.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

_TAG = 0x5A3D1E  # keeps these seeds apart from the other SeedSequences of a run
_current: list[int] = []  # the seed of the sample being fetched in this process, if any


def seed_of(seed: int, epoch: int, index: int) -> int:
    """The 63-bit seed of dataset ``index`` read in ``epoch`` of a run seeded ``seed``."""
    return int(np.random.SeedSequence([seed, epoch, index, _TAG]).generate_state(1, np.uint64)[0] >> np.uint64(1))


@contextlib.contextmanager
def seeded(value: int) -> Iterator[None]:
    """Run the block with torch's CPU generator, numpy's global RNG and ``random``
    seeded from ``value`` (:func:`sample_seed` inside says ``value``); afterwards they
    are as they were. CUDA generators are left alone."""
    saved = torch.get_rng_state(), np.random.get_state(), random.getstate()
    torch.default_generator.manual_seed(value)
    np.random.seed(value % 2**32)
    random.seed(value)
    _current.append(value)
    try:
        yield
    finally:
        _current.pop()
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])


def sample_seed() -> int:
    """The seed of the sample being fetched: for a dataset's own generators, called in
    its ``__getitem__``."""
    if not _current:
        raise RuntimeError(
            "sample_seed() is for a dataset's __getitem__ while the trainer (or SeededSamples) fetches a sample"
        )
    return _current[-1]


def sample_generator() -> torch.Generator:
    """A torch CPU generator seeded for the sample being fetched."""
    return torch.Generator().manual_seed(sample_seed())


def sample_rng() -> np.random.Generator:
    """A numpy generator seeded for the sample being fetched."""
    return np.random.default_rng(sample_seed())


class SeededSamples(torch.utils.data.Dataset):
    """A map-style ``dataset`` whose item ``i`` is fetched under :func:`seeded` RNGs
    from ``(seed, epoch, i)``: for a loop of your own, with any sampler. Call
    :meth:`set_epoch` before each epoch's ``iter(loader)`` (loader workers get the
    dataset as it is then), as with ``DistributedSampler``. The trainer needs none of
    this: it fetches every sample that way itself."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        with seeded(seed_of(self.seed, self.epoch, index)):
            return self.dataset[index]


class _Positions(torch.utils.data.Dataset):
    """The trainer's view of a map-style dataset: keyed by ``(epoch, index)`` (the
    sampler maps global positions to them), each fetched under its seeds."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        epoch, index = key
        with seeded(seed_of(self.seed, epoch, index)):
            return self.dataset[index]


class _StatefulPositions(_Positions):
    """For a dataset with a state of its own: the loader saves and restores it."""

    def state_dict(self) -> Any:
        return self.dataset.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.dataset.load_state_dict(state)


def by_position(dataset: Any, seed: int) -> _Positions:
    """``dataset`` as the trainer's loader reads it (:class:`_Positions`)."""
    stateful = callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))
    return (_StatefulPositions if stateful else _Positions)(dataset, seed)
