"""The anomaly rule of :class:`~ftfleet.trainer.resilience.anomaly.detector.AnomalyDetector`,
evaluated on the device, so that a step's verdict never waits for the host.

Reading a loss or a gradient norm on the host (``.item()``, ``.tolist()``) blocks the
host until the device has finished the step: the host then launches the optimizer step
and the next forward pass late and the device idles meanwhile. :class:`DeviceCheck`
keeps the rolling history of good steps in device tensors and returns the verdict as a
0-d device tensor, which a fused optimizer consumes as its ``found_inf`` flag
(``torch.optim.AdamW(fused=True)`` skips the update, step count included, when it is
1: the mechanism ``torch.amp.GradScaler`` uses). The host reads the values later, in a
batch, to log and count (:meth:`AnomalyGuard.settle`), replaying the same rule.

The rule is the detector's, operation for operation in float64: non-finite loss or
gradient norm; or, with at least ``min_history`` good steps of history, a value above
``factor`` times the median of the last ``window`` good ones (the median of an even
count is the mean of the middle two, as ``statistics.median``). The verdict is
therefore the host detector's, bit for bit, and identical on every rank, whose inputs
are the same all-reduced values.
"""

from __future__ import annotations

import torch

from ftfleet.trainer.resilience.anomaly.detector import AnomalyConfig


class _History:
    """The last ``window`` good values of one quantity, NaN-padded, on the device."""

    def __init__(self, window: int, device: torch.device) -> None:
        self.values = torch.full((window,), float("nan"), dtype=torch.float64, device=device)
        self.count = torch.zeros((), dtype=torch.int64, device=device)
        self.pos = torch.zeros((), dtype=torch.int64, device=device)
        self.window = window

    def spike(self, value: torch.Tensor, factor: float, min_history: int) -> torch.Tensor:
        if not factor:
            return torch.zeros((), dtype=torch.bool, device=value.device)
        ordered = torch.sort(self.values).values  # NaN padding sorts last
        lo = ((self.count - 1).clamp(min=0) // 2).view(1)
        hi = (self.count // 2).clamp(max=self.window - 1).view(1)
        median = (ordered.gather(0, lo) + ordered.gather(0, hi)).squeeze(0) / 2
        return (self.count >= min_history) & (median > 0) & (value > factor * median)

    def append_if(self, keep: torch.Tensor, value: torch.Tensor) -> None:
        index = self.pos.view(1)
        current = self.values.gather(0, index)
        self.values.scatter_(0, index, torch.where(keep, value.view(1), current))
        self.pos.copy_(torch.where(keep, (self.pos + 1) % self.window, self.pos))
        self.count.copy_(torch.where(keep, (self.count + 1).clamp(max=self.window), self.count))


class DeviceCheck:
    def __init__(self, config: AnomalyConfig, device: torch.device) -> None:
        self.config = config
        self._loss = _History(config.window, device)
        self._grad = _History(config.window, device)

    def update(self, values: torch.Tensor) -> torch.Tensor:
        """``values``: ``[loss, grad_norm]`` (float64, on the device). Returns whether
        the step is anomalous (0-d bool on the device) and adds a good step to the
        history. Launches device work only."""
        cfg = self.config
        loss, grad = values[0], values[1]
        nonfinite = ~(torch.isfinite(loss) & torch.isfinite(grad))
        spike = self._loss.spike(loss, cfg.spike_factor, cfg.min_history) | self._grad.spike(
            grad, cfg.grad_norm_spike_factor, cfg.min_history
        )
        bad = nonfinite | spike
        good = ~bad
        self._loss.append_if(good, loss)
        self._grad.append_if(good, grad)
        return bad
