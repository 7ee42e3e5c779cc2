"""The deterministic token stream and how a global batch is split over ranks.

Position in the data is one number, the count of global samples consumed. Sample ``i``
is a pure function of ``(seed, i)`` and step ``s`` of a run with global batch ``B``
consumes samples ``[s*B, (s+1)*B)``, rank ``r`` of ``W`` taking the ``r``-th contiguous
slice of ``B/W``. So a checkpoint written by N ranks resumes on M ranks at exactly the
next sample, and nothing in the data path draws from a global RNG.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import torch

from ftfleet.errors import ConfigError


class SyntheticTokens:
    """A fixed random Markov chain over the vocabulary: each token has four likely
    successors, so the stream is learnable and a falling loss shows training works."""

    BRANCHES = 4

    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.seed = seed
        table_rng = np.random.default_rng([seed, 0x5EED])
        self.successors = table_rng.integers(0, vocab_size, size=(vocab_size, self.BRANCHES))
        self.probs = np.array([0.55, 0.25, 0.15, 0.05])

    def __getitem__(self, index: int) -> np.ndarray:
        """Sample ``index``: ``seq_len + 1`` tokens (inputs and shifted targets)."""
        rng = np.random.default_rng([self.seed, 1, index])
        choice = rng.choice(self.BRANCHES, size=self.seq_len, p=self.probs)
        noise = rng.random(self.seq_len) < 0.02
        random_tokens = rng.integers(0, self.vocab_size, size=self.seq_len)
        out = np.empty(self.seq_len + 1, dtype=np.int64)
        out[0] = rng.integers(0, self.vocab_size)
        for t in range(self.seq_len):
            nxt = self.successors[out[t], choice[t]]
            out[t + 1] = random_tokens[t] if noise[t] else nxt
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    inputs: torch.Tensor
    targets: torch.Tensor
    sample_ids: range


class GlobalBatches:
    """This rank's share of each global batch, addressed by the global sample count."""

    def __init__(
        self,
        dataset: SyntheticTokens,
        global_batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device,
        trace_dir: Path | None = None,
    ):
        if global_batch_size % world_size:
            raise ConfigError(
                f"train.global_batch_size={global_batch_size} is not divisible by the world "
                f"size {world_size}: choose a multiple of {world_size}"
            )
        self.dataset = dataset
        self.global_batch_size = global_batch_size
        self.micro_batch_size = global_batch_size // world_size
        self.rank = rank
        self.device = device
        self._trace = None
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
            # One file per process lifetime and rank; lines are "step first-last".
            self._trace = open(trace_dir / f"rank{rank}-pid{os.getpid()}.txt", "a", buffering=1)

    def sample_ids(self, samples_seen: int) -> range:
        start = samples_seen + self.rank * self.micro_batch_size
        return range(start, start + self.micro_batch_size)

    def get(self, samples_seen: int, step: int) -> Batch:
        """The batch of the step that starts after ``samples_seen`` global samples."""
        ids = self.sample_ids(samples_seen)
        tokens = torch.from_numpy(np.stack([self.dataset[i] for i in ids]))
        if self._trace is not None:
            self._trace.write(f"{step} {ids.start} {ids.stop - 1}\n")
        tokens = tokens.to(self.device, non_blocking=True)
        return Batch(tokens[:, :-1], tokens[:, 1:], ids)

    def close(self) -> None:
        if self._trace is not None:
            self._trace.close()
