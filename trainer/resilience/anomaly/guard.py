"""Anomaly handling in the reference loop: judge each step, skip or roll back, count.

:meth:`AnomalyGuard.judge` runs after the backward pass on every rank. The mean loss and
the global gradient norm are all-reduced, so every rank judges the same numbers and
takes the same decision (a rank that decided alone would leave the others waiting in a
collective). How the decision reaches the optimizer depends on what it can do:

* **On the device** (policy ``skip`` and an optimizer that takes a ``found_inf`` flag:
  ``AdamW(fused=True)``, ``Adam(fused=True)``, ``SGD(fused=True)``): the rule runs on
  the device (:mod:`~ftfleet.trainer.resilience.anomaly.device_check`) and the optimizer skips
  the update there. Nothing waits for the host; the values are read in one batch on
  logging steps and at the end (:meth:`~AnomalyGuard.settle`), where the skips are
  logged and counted and too many in a row stop the run (so that stop comes up to
  ``train.log_every`` steps late).
* **On the host** (policy ``rollback``, which must reload a checkpoint before the next
  step, or an optimizer without ``found_inf``): the values are read every step, as the
  detector needs them.

A skipped step still takes its step number, its batch and its place in the LR schedule,
so the sample stream and the schedule do not shift. A rollback reloads the newest
checkpoint and marks the offending batch, whose step then passes without a forward
pass (:meth:`AnomalyGuard.skips`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ftfleet.trainer.callbacks import Callback, StepInfo
from ftfleet.trainer.resilience.anomaly.detector import Action, AnomalyConfig, AnomalyDetector, Decision
from ftfleet.trainer.resilience.anomaly.device_check import DeviceCheck

if TYPE_CHECKING:
    from ftfleet.trainer.checkpoint.manager import CheckpointManager
    from ftfleet.trainer.events import EventLog
    from ftfleet.trainer.resilience.observability.metrics import Metrics
    from ftfleet.trainer.train import Run

log = logging.getLogger("ftfleet.anomaly")


@dataclasses.dataclass(frozen=True)
class Verdict:
    step: int
    action: Action
    """The host's decision; OK when the device decides (``found_inf``)."""
    found_inf: torch.Tensor | None = None
    """The device's decision: 1.0 skips the update (a 0-d float tensor on the device)."""

    @property
    def rollback(self) -> bool:
        return self.action is Action.ROLLBACK


def gates_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """The optimizer skips an update on the device when given ``found_inf`` (fused)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


class AnomalyGuard(Callback):
    """``settle_every``: read the device's verdicts every this many steps (the loop's
    logging interval). ``on_rollback(step)``: called after a rollback restored ``step``
    (the save schedule starts over from there)."""

    def __init__(
        self,
        cfg: AnomalyConfig,
        ckpt: CheckpointManager | None,
        optimizer: torch.optim.Optimizer,
        *,
        device: torch.device,
        settle_every: int,
        group: Any = None,
        events: EventLog | None = None,
        metrics: Metrics | None = None,
        on_rollback: Callable[[int], None] | None = None,
    ) -> None:
        self.detector = AnomalyDetector(cfg)
        self.ckpt = ckpt
        self.optimizer = optimizer
        self.device = device
        self.settle_every = settle_every
        self.group = group
        self.events = events
        self.metrics = metrics
        self.on_rollback = on_rollback
        self.device_check = DeviceCheck(cfg, device) if cfg.policy == "skip" and gates_on_device(optimizer) else None
        if self.device_check is None and cfg.policy == "skip":
            log.debug(
                "%s takes no found_inf flag (fused=True does): the anomaly check reads the loss every step",
                type(optimizer).__name__,
            )
        self.skipped_batches: set[int] = set()
        self.rollbacks: list[dict[str, int]] = []
        self._pending: list[tuple[int, torch.Tensor]] = []

    # -- one step ------------------------------------------------------------------

    def skips(self, step: int) -> bool:
        """True for a batch that a rollback decided to skip (the same on every rank)."""
        return step in self.skipped_batches

    def judge(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> Verdict:
        """Collective. This step's verdict from the mean loss and the global gradient
        norm over all ranks (a NaN anywhere makes the mean NaN everywhere)."""
        norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP2: a DTensor
        values = torch.stack([t.detach().reshape(()).to(self.device, torch.float64) for t in (loss, norm)])
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.all_reduce(values, group=self.group)
            values = values / dist.get_world_size(self.group)
        if self.device_check is not None:
            bad = self.device_check.update(values)
            self._pending.append((step, torch.cat([values, bad.to(torch.float64).view(1)])))
            return Verdict(step, Action.OK, found_inf=bad.to(torch.float32))
        mean_loss, mean_norm = values.cpu().tolist()
        decision = self.detector.check(step, mean_loss, mean_norm)
        self._record(decision)
        return Verdict(step, decision.action)

    def apply(self, verdict: Verdict) -> None:
        """The optimizer step, unless the verdict says the step is anomalous."""
        opt = self.optimizer
        if verdict.found_inf is None:
            if verdict.action is Action.OK:
                opt.step()
            return
        # The protocol of torch.amp.GradScaler with a fused optimizer.
        opt.grad_scale, opt.found_inf = None, verdict.found_inf
        try:
            opt.step()
        finally:
            del opt.grad_scale, opt.found_inf

    def on_step_end(self, run: Run, info: StepInfo) -> None:
        if info.step % self.settle_every == 0:
            self.settle()

    def settle(self) -> None:
        """Read the device's verdicts since the last call (one wait for the device) and
        replay them through the detector: log, count, and raise
        :class:`~ftfleet.trainer.resilience.anomaly.detector.RepeatedAnomalyError` when skipping
        does not help. The same on every rank."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        rows = torch.stack([values for _, values in pending]).cpu().tolist()
        for (step, _), (mean_loss, mean_norm, bad) in zip(pending, rows, strict=True):
            decision = self.detector.check(step, mean_loss, mean_norm)
            if decision.ok == bool(bad):
                log.error("step %d: the device's anomaly verdict differs from the detector's (%s)", step, decision)
            self._record(decision)

    def _record(self, decision: Decision) -> None:
        if decision.ok:
            return
        self._emit("anomaly", step=decision.step, action=str(decision.action), reason=decision.reason)
        if decision.action is Action.SKIP and self.metrics is not None:
            self.metrics.skipped_steps.inc()

    # -- rollback ------------------------------------------------------------------

    def rollback(self, step: int) -> bool:
        """Collective. Reload the newest valid checkpoint and remember to skip
        ``step``'s batch. False when there is nothing to roll back to (the verdict then
        skips the update)."""
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped_batches.add(step)
        restored = self.ckpt.rollback()
        if restored is None:
            log.warning("no checkpoint to roll back to: skipping the batch of step %d", step)
            return False
        if self.metrics is not None:
            self.metrics.rollbacks.inc()
        self.rollbacks.append({"from_step": step, "to_step": restored.step})
        self._emit("rollback", from_step=step, to_step=restored.step)
        if self.on_rollback is not None:
            self.on_rollback(restored.step)
        return True

    def summary(self) -> dict[str, Any]:
        self.settle()
        c = self.detector.counters
        return {
            "anomalies": {"nonfinite": c.nonfinite, "spikes": c.spikes, "skipped": c.skipped, "rollbacks": c.rollbacks},
            "rollbacks": self.rollbacks,
            "skipped_batches": sorted(self.skipped_batches),
        }

    def _emit(self, event: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(event, **fields)
