"""The reference loop's extension point: :class:`Callback` objects, called on every rank.

The loop (:func:`ftfleet.trainer.train.train`) calls, in this order::

    on_train_start(run)                 after restore, before the first step
    while steps remain:
        should_stop(run)                every step boundary, the first included
        on_step_start(run, step)        before the batch is read
        loss = on_loss(run, step, loss) after the forward pass, before backward
        on_step_end(run, info)          after the optimizer step (or its skip)
    on_train_end(run, result)           after the final (or emergency) checkpoint

The loop's own pieces are callbacks too (:mod:`ftfleet.trainer.resilience`: agreed
notices stop the run, the step monitor beats the watchdog, the save schedule saves),
and so are the drill's injected faults (``drill/inject.py``), which is how fault
injection stays out of the trainer.

Two rules keep the ranks together. ``should_stop`` must answer the same on every rank
at the same boundary: a callback that sees something local (a signal, a file) agrees
with the others through a collective. And a callback that runs a collective must run
it on every rank, in the same order.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any

from ftfleet.contract import EXIT_OK

if TYPE_CHECKING:
    import torch

    from ftfleet.trainer.train import Run

log = logging.getLogger("ftfleet.train")


@dataclasses.dataclass(frozen=True)
class StopRequest:
    reason: str
    exit_code: int = EXIT_OK
    save: bool = True
    """Commit a checkpoint of the current step before stopping (blocking)."""


@dataclasses.dataclass(frozen=True)
class StepInfo:
    step: int
    loss: torch.Tensor
    """This rank's loss on its micro-batch: a 0-d tensor on the training device.
    ``loss.item()`` waits for the device: do it on the steps that log, not every step."""
    samples_seen: int
    step_time_s: float
    """Host time of the step. Without a synchronisation the host runs ahead of the
    device; over many steps the two rates agree."""
    saving: bool = False
    """A background save was in flight during the step (it competed for the host)."""
    snapshotting: bool = False
    """An in-memory snapshot was being written or sent in the background during the step."""


class Callback:
    """Base class of the hooks: override what you need. Every hook runs on every rank."""

    def on_train_start(self, run: Run) -> None: ...

    def should_stop(self, run: Run) -> StopRequest | None:
        return None

    def on_step_start(self, run: Run, step: int) -> None: ...

    def on_loss(self, run: Run, step: int, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def on_step_end(self, run: Run, info: StepInfo) -> None: ...

    def on_train_end(self, run: Run, result: dict[str, Any]) -> None: ...


class StopAtStep(Callback):
    """``train.stop_at_step``: stop cleanly with a committed checkpoint at a given step."""

    def __init__(self, step: int):
        self.step = step

    def should_stop(self, run: Run) -> StopRequest | None:
        if run.progress.step >= self.step:
            return StopRequest(f"stop_at_step {self.step}")
        return None


class LogProgress(Callback):
    """Every ``every`` steps, on rank 0: the loss, the learning rate and the speed. The
    reference loop's only read of the loss, so it waits for the device on these steps
    only."""

    def __init__(self, every: int):
        self.every = every
        self._since = time.monotonic()

    def on_step_end(self, run: Run, info: StepInfo) -> None:
        if info.step % self.every or not run.env.is_rank0:
            return
        now = time.monotonic()
        elapsed, self._since = now - self._since, now
        lr = run.scheduler.get_last_lr()[0] if run.scheduler is not None else float("nan")
        log.info("step %d loss %.4f lr %.2e %.1f steps/s", info.step, info.loss.item(), lr, self.every / elapsed)


def first_stop(callbacks: list[Callback], run: Run) -> StopRequest | None:
    """The first stop request, in callback order. Deterministic callbacks come first, so
    a collective one later in the list is skipped at the same boundary on every rank."""
    for cb in callbacks:
        if (request := cb.should_stop(run)) is not None:
            return request
    return None
