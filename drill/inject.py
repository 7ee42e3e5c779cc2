"""Injected faults, as callbacks of the reference loop: the drill's and the tests' way to
make a run fail on purpose. The trainer never imports this module; the drill runs the
trainer through :mod:`drill.worker`, which installs these callbacks.

``faults.*`` arguments (``faults.nan_at_steps=[10]``) configure them, with the same
checks and one-line errors as the trainer config.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from ftfleet.errors import ConfigError
from ftfleet.trainer.callbacks import Callback
from ftfleet.trainer.config import build

if TYPE_CHECKING:
    import torch

    from ftfleet.trainer.train import Run

log = logging.getLogger("drill.inject")

PREFIX = "faults."


@dataclasses.dataclass(kw_only=True, slots=True)
class FaultConfig:
    """Injected faults, for drills and tests."""

    nan_at_steps: list[int] = dataclasses.field(default_factory=list)
    """The loss of these steps becomes NaN on rank 0: a poisoned batch. It is a property of
    the data, so it recurs when the step is replayed (unless its batch is skipped)."""
    spike_at_steps: list[int] = dataclasses.field(default_factory=list)
    """The loss of these steps is multiplied by spike_factor on rank 0 (a bad batch that
    is finite but far off the rolling median)."""
    spike_factor: float = 100.0
    hang_at_step: int | None = None
    """Rank `hang_rank` stops making progress before this step, once per run directory
    (a flag file in <run_dir>/faults/ keeps a restarted run from hanging again)."""
    hang_rank: int = 0
    step_delay_s: float = 0.0
    """Sleep this long in every step (paces a tiny model like a real one)."""

    def __post_init__(self) -> None:
        for key in ("nan_at_steps", "spike_at_steps"):
            if any(s < 1 for s in getattr(self, key)):
                raise ConfigError(f"faults.{key}={getattr(self, key)}: steps start at 1")
        if self.spike_factor <= 1:
            raise ConfigError(f"faults.spike_factor={self.spike_factor}: use a factor above 1")
        if self.hang_at_step is not None and self.hang_at_step < 1:
            raise ConfigError(f"faults.hang_at_step={self.hang_at_step}: use a step >= 1")
        if self.hang_rank < 0:
            raise ConfigError(f"faults.hang_rank={self.hang_rank}: use a rank >= 0")
        if not 0 <= self.step_delay_s < 3600:
            raise ConfigError(f"faults.step_delay_s={self.step_delay_s}: use 0 to 3600 s")

    def callbacks(self) -> list[Callback]:
        out: list[Callback] = []
        if self.step_delay_s:
            out.append(StepDelay(self.step_delay_s))
        if self.hang_at_step is not None:
            out.append(Hang(self.hang_at_step, self.hang_rank))
        if self.nan_at_steps or self.spike_at_steps:
            out.append(PoisonedBatches(self.nan_at_steps, self.spike_at_steps, self.spike_factor))
        return out


def parse(overrides: list[str]) -> tuple[FaultConfig, list[str]]:
    """The ``faults.*`` overrides as a FaultConfig, and the others (the trainer's)."""
    raw: dict[str, object] = {}
    rest = []
    for item in overrides:
        if not item.startswith(PREFIX):
            rest.append(item)
            continue
        key, _, value = item.partition("=")
        try:
            raw[key.removeprefix(PREFIX)] = yaml.safe_load(value) if value else ""
        except yaml.YAMLError:
            raise ConfigError(f"override {item!r}: not a valid value; e.g. faults.nan_at_steps=[10]") from None
    return build(FaultConfig, raw, prefix=PREFIX), rest


def callbacks_from(overrides: list[str]) -> tuple[list[Callback], list[str]]:
    faults, rest = parse(overrides)
    return faults.callbacks(), rest


class StepDelay(Callback):
    """Paces every step; does not change the trajectory."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_start(self, run: Run, step: int) -> None:
        time.sleep(self.seconds)


class Hang(Callback):
    """Rank ``rank`` stops making progress before ``step``: only the hang watchdog (or a
    signal) ends it. Once per run directory."""

    def __init__(self, step: int, rank: int) -> None:
        self.step = step
        self.rank = rank

    def on_step_start(self, run: Run, step: int) -> None:
        flag = Path(run.cfg.run_dir) / "faults" / f"hang-step-{self.step}"
        if step != self.step or run.env.rank != self.rank or flag.exists():
            return
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.write_text(f"{time.time()}\n")
        log.warning("fault injection: rank %d hangs before step %d", self.rank, step)
        # Short sleeps: a Python-level hang, which an in-process restart's asynchronous
        # exception reaches between two of them (one long sleep would hold it back).
        while True:
            time.sleep(0.05)


class PoisonedBatches(Callback):
    """A bad batch on rank 0, applied to the loss before the backward pass so that the
    gradients are bad too, as with bad data."""

    def __init__(self, nan_steps: list[int], spike_steps: list[int], factor: float) -> None:
        self.nan_steps = set(nan_steps)
        self.spike_steps = set(spike_steps)
        self.factor = factor

    def on_loss(self, run: Run, step: int, loss: torch.Tensor) -> torch.Tensor:
        if run.env.rank != 0:
            return loss
        if step in self.nan_steps:
            log.warning("fault injection: NaN loss at step %d", step)
            return loss * float("nan")
        if step in self.spike_steps:
            log.warning("fault injection: loss x%g at step %d", self.factor, step)
            return loss * self.factor
        return loss
