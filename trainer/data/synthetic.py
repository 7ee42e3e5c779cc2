"""``data.factory: synthetic``: a learnable random token stream, the test fixture."""

from __future__ import annotations

import numpy as np

from ftfleet.errors import ConfigError
from ftfleet.trainer.factories import lookup
from ftfleet.trainer.schemas import SyntheticConfig


class SyntheticTokens:
    """A fixed random Markov chain over the vocabulary: each token has four likely
    successors, so the stream is learnable and a falling loss shows training works.
    Unsized: sample ``index`` exists for every index >= 0 and depends on (seed, index)."""

    BRANCHES = 4

    def __init__(self, vocab_size: int, seq_len: int, seed: int, *, stream: int = 1):
        """``stream``: which independent sequence of samples of the chain; 1 is the
        training stream, :data:`HELD_OUT` the validation set's."""
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.seed = seed
        self.stream = stream
        table_rng = np.random.default_rng([seed, 0x5EED])
        self.successors = table_rng.integers(0, vocab_size, size=(vocab_size, self.BRANCHES))
        self.probs = np.array([0.55, 0.25, 0.15, 0.05])

    def __getitem__(self, index: int) -> np.ndarray:
        """Sample ``index``: ``seq_len + 1`` tokens (inputs and shifted targets)."""
        rng = np.random.default_rng([self.seed, self.stream, index])
        choice = rng.choice(self.BRANCHES, size=self.seq_len, p=self.probs)
        noise = rng.random(self.seq_len) < 0.02
        random_tokens = rng.integers(0, self.vocab_size, size=self.seq_len)
        out = np.empty(self.seq_len + 1, dtype=np.int64)
        out[0] = rng.integers(0, self.vocab_size)
        for t in range(self.seq_len):
            nxt = self.successors[out[t], choice[t]]
            out[t + 1] = random_tokens[t] if noise[t] else nxt
        return out


#: The stream of the held-out set (``validation.factory: synthetic``).
HELD_OUT = 2


def build(cfg: SyntheticConfig, job, *, stream: int = 1) -> SyntheticTokens:
    model_args = job.model.factories["factory"].args
    sizes = {}
    for key in ("vocab_size", "seq_len"):
        sizes[key] = getattr(cfg, key) or lookup(model_args, key, 0)
        if not sizes[key]:
            raise ConfigError(f"data.{key} is 0 and the model section has no {key}: set data.{key}")
    return SyntheticTokens(int(sizes["vocab_size"]), int(sizes["seq_len"]), job.seed, stream=stream)


def held_out(cfg: SyntheticConfig, job) -> SyntheticTokens:
    """``validation.factory: synthetic``: samples of the training stream's chain from a
    stream of their own, which training never reads."""
    return build(cfg, job, stream=HELD_OUT)
