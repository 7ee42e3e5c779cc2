"""Factories as a user might get them wrong (and a few right), for the tests of
trainer/factories.py and `ftfleet data prepare --tokenizer`. Importable as
``tests.trainer.userpkg`` (the trainer subprocesses run with the repository on
PYTHONPATH)."""

from __future__ import annotations

import dataclasses
import time

NOT_CALLABLE = 42


def returns_a_list(cfg):
    return [1, 2, 3]


def takes_nothing():
    return None


@dataclasses.dataclass
class StrictConfig:
    width: int = 8

    def __post_init__(self):
        if self.width % 2:
            raise ValueError(f"width must be even, got {self.width}")


def strict_model(cfg: StrictConfig):
    import torch

    return torch.nn.Linear(cfg.width, cfg.width)


def not_an_optimizer(cfg, model):
    return "sgd"


def not_a_dataset(cfg):
    return 3


class WordTokenizer:
    """Whitespace words over a fixed vocabulary; 0 is unknown, 1 ends a document."""

    WORDS = ["<unk>", "<eos>", "the", "cat", "sat", "on", "a", "mat", "dog", "ran"]
    eos_id = 1

    def __init__(self, delay_s: float = 0.0):
        self.vocab_size = len(self.WORDS)
        self.delay_s = delay_s

    def encode(self, text: str) -> list[int]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return [self.WORDS.index(w) if w in self.WORDS else 0 for w in text.split()]


def words() -> WordTokenizer:
    return WordTokenizer()


def slow_words() -> WordTokenizer:
    """Slow enough that a kill lands in the middle of a prepare."""
    return WordTokenizer(delay_s=0.05)


def broken_tokenizer():
    raise RuntimeError("no vocabulary file")


def blocks_of(model):
    """parallel.wrap as a callable: the modules FSDP2 shards as units."""
    return list(model.blocks)


def foreign_modules(model):
    import torch

    return [torch.nn.Linear(1, 1)]


def token_accuracy(cfg, job):
    """``validation.metrics``: next-token accuracy beside the loss."""
    import torch

    from ftfleet.trainer.losses import next_token_loss

    def metrics(model, batch):
        logits = model(batch[:, :-1])
        accuracy = (logits.argmax(-1) == batch[:, 1:]).float().mean()
        return {"loss": next_token_loss(model, batch), "accuracy": accuracy, "count": torch.tensor(batch.shape[0])}

    return metrics


def not_metrics(cfg):
    return 3


def list_metrics(cfg):
    return lambda model, batch: [1.0]


def short_stream(cfg, job):
    """``validation.factory``: an IterableDataset of 15 samples of the synthetic chain."""
    import torch

    from ftfleet.trainer.data.synthetic import held_out
    from ftfleet.trainer.schemas import SyntheticConfig

    source = held_out(SyntheticConfig(), job)

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return (torch.from_numpy(source[i]) for i in range(15))

    return Stream()


def drawing_set(cfg, job):
    """``validation.factory``: a held-out set chosen with the global RNGs."""
    import random

    import numpy as np
    import torch

    from ftfleet.trainer.data.synthetic import held_out
    from ftfleet.trainer.schemas import SyntheticConfig

    torch.randperm(10), np.random.rand(), random.random()
    return held_out(SyntheticConfig(), job)
