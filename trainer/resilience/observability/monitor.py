"""The step monitor: after every step, the hang watchdog's heartbeat, the step metrics
and the step events. A :class:`~ftfleet.trainer.callbacks.Callback` of the reference loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftfleet.trainer.callbacks import Callback, StepInfo

if TYPE_CHECKING:
    from ftfleet.trainer.events import EventLog
    from ftfleet.trainer.resilience.anomaly.watchdog import Watchdog
    from ftfleet.trainer.resilience.observability.metrics import Metrics
    from ftfleet.trainer.train import Run


class StepMonitor(Callback):
    """``step_events``: also log every step's loss and time to the event log (drills
    measure lost work with them). Reading the loss waits for the device, so this costs a
    synchronisation per step: for tests and drills."""

    def __init__(
        self,
        *,
        watchdog: Watchdog | None = None,
        metrics: Metrics | None = None,
        events: EventLog | None = None,
        step_events: bool = False,
    ):
        self.watchdog = watchdog
        self.metrics = metrics
        self.events = events
        self.step_events = step_events
        self._first = True

    def on_step_end(self, run: Run, info: StepInfo) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(info.step)
        if self.metrics is not None:
            self.metrics.step(info.step_time_s)
        if self.events is None or not self.events.enabled:  # events are rank 0's
            return
        if self._first:
            self._first = False
            self.events.emit("first_step", step=info.step)
        if self.step_events:
            self.events.emit(
                "step",
                step=info.step,
                loss=info.loss.item(),
                seconds=round(info.step_time_s, 5),
                saving=info.saving,
                snapshotting=info.snapshotting,
            )
