"""The resilience pieces of the reference loop, built from the config and wired together.

Each piece stands alone (and a loop of your own can use it alone, see the README):

| piece | module | in the loop |
| --- | --- | --- |
| notices + agreement | ``preemption/boundary.py`` | at each boundary (``NoticeStop``, a callback) |
| the preemption sequence | ``preemption/sequence.py`` | the end: emergency save, uploads, marker, exit 75 |
| anomaly handling | ``anomaly/guard.py`` | judge after backward, gated optimizer step, rollback |
| the save schedule | ``interval/schedule.py`` | after each step (a callback): the adaptive interval |
| the step monitor | ``observability/monitor.py`` | after each step (a callback): watchdog, metrics, events |
| the node's heartbeat | ``observability/node_metrics.py`` | after each step: counted; published by a thread (AWS) |

:class:`Resilience` builds them for one process, hands the loop its callbacks, and
starts and stops what runs in the background (the notice watcher, the hang watchdog,
the metrics exporter).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ftfleet.contract import EXIT_PREEMPTED
from ftfleet.trainer.callbacks import Callback, LogProgress, StopAtStep, StopRequest
from ftfleet.trainer.events import EventLog
from ftfleet.trainer.resilience import fencing
from ftfleet.trainer.resilience.anomaly.guard import AnomalyGuard
from ftfleet.trainer.resilience.interval.prior import prior_for
from ftfleet.trainer.resilience.interval.schedule import SaveSchedule
from ftfleet.trainer.resilience.notices.watcher import NoticeWatcher
from ftfleet.trainer.resilience.observability.metrics import Metrics, metrics_port
from ftfleet.trainer.resilience.observability.monitor import StepMonitor
from ftfleet.trainer.resilience.observability.node_metrics import NodeMetrics
from ftfleet.trainer.resilience.preemption.boundary import Interruptions
from ftfleet.trainer.resilience.preemption.sequence import Preemption
from ftfleet.trainer.validation import Validation

if TYPE_CHECKING:
    from ftfleet.trainer.train import Run

log = logging.getLogger("ftfleet.resilience")


class NoticeStop(Callback):
    """At each boundary: the agreed notice. A terminal one stops the run (exit 75 after
    the emergency sequence); an advisory one has taken an early checkpoint."""

    def __init__(self, preemption: Preemption, schedule: SaveSchedule, last_step: int) -> None:
        self.preemption = preemption
        self.schedule = schedule
        self.last_step = last_step

    def should_stop(self, run: Run) -> StopRequest | None:
        step = run.progress.step
        agreed = self.preemption.check(step, early_save=step < self.last_step)
        if agreed is None:
            return None
        if not agreed.notice.node_stays:  # a resize is no interruption of the fleet
            self.schedule.record_notice(agreed.notice.received_at)
        if not agreed.notice.terminal:
            return None
        notice = agreed.notice
        return StopRequest(f"notice: {notice.kind} from {notice.source}", EXIT_PREEMPTED)


class Resilience:
    def __init__(self, run: Run, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        cfg, res = run.cfg, run.cfg.resilience
        self.cfg = cfg
        self.environ = environ
        self.world_size = run.env.world_size
        self.events = EventLog(cfg.run_dir, enabled=run.env.is_rank0)
        fencing.report_to(self.events)  # a process that leaves says so in the event log
        self.metrics = Metrics.from_env(environ)
        self.watchdog = res.watchdog.build()
        # The interval is chosen on rank 0 and broadcast: only rank 0 needs the prior.
        interval = prior_for(res.interval, run.ckpt) if run.env.is_rank0 else res.interval
        self.schedule = SaveSchedule(
            interval,
            run.ckpt,
            last_step=cfg.train.steps,
            events=self.events,
            metrics=self.metrics,
            watchdog=self.watchdog,
        )
        self.anomalies = AnomalyGuard(
            res.anomaly,
            run.ckpt,
            run.optimizer,
            device=run.env.device,
            settle_every=cfg.train.log_every,
            events=self.events,
            metrics=self.metrics,
            on_rollback=self.schedule.reschedule,
        )
        interruptions = Interruptions(
            NoticeWatcher.from_env(res.watcher, environ), events=self.events, metrics=self.metrics
        )
        self.preemption = Preemption(
            run.ckpt,
            interruptions,
            save=self.schedule.save,
            local_rank=run.env.local_rank,
            events=self.events,
            environ=environ,
        )
        self.monitor = StepMonitor(
            watchdog=self.watchdog, metrics=self.metrics, events=self.events, step_events=cfg.train.step_events
        )
        self.node_metrics = NodeMetrics.from_env(res.node_metrics, local_rank=run.env.local_rank, environ=environ)
        self.validation = Validation.build(
            run, self.schedule, events=self.events, metrics=self.metrics, watchdog=self.watchdog
        )

    def callbacks(self, extra: Sequence[Callback] = ()) -> list[Callback]:
        """The loop's callbacks, in order. Stops that need no collective come before the
        notice agreement (skipped at the same boundary on every rank); the save comes
        last, after everything that looks at the finished step."""
        train = self.cfg.train
        stops: list[Callback] = [StopAtStep(train.stop_at_step)] if train.stop_at_step is not None else []
        return [
            *stops,
            *extra,
            NoticeStop(self.preemption, self.schedule, train.steps),
            self.monitor,
            *([self.node_metrics] if self.node_metrics is not None else []),
            self.anomalies,
            LogProgress(train.log_every),
            *([self.validation] if self.validation is not None else []),
            self.schedule,
        ]

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self.preemption.start()
        if self.watchdog is not None:
            self.watchdog.start()  # the first-step allowance covers the restore
        if self.node_metrics is not None:
            self.node_metrics.start()
        port = self.metrics.serve(metrics_port(self.environ), local_rank=self.preemption.local_rank)
        if port:
            log.info("metrics on :%d/metrics", port)

    def restored(self, restored: Any, step: int) -> None:
        if restored is None:
            self.events.emit("fresh")
        else:
            self.events.emit(
                "restored",
                step=restored.step,
                tier=restored.tier,
                source=restored.location,
                world_size_written=restored.manifest.world_size,
            )
            written = restored.manifest.world_size
            if written and written != self.world_size:  # a world that shrank or grew back
                self.events.emit(
                    "resize",
                    step=restored.step,
                    change="grow" if self.world_size > written else "shrink",
                    world_size_written=written,
                    world_size=self.world_size,
                )
        self.schedule.restored(restored, step)

    @contextlib.contextmanager
    def draining(self) -> Iterator[None]:
        """The end of the run (final or emergency save, uploads, marker) is covered by
        the hang watchdog with its own allowance."""
        if self.watchdog is None:
            yield
            return
        with self.watchdog.phase("the end of the run", self.cfg.resilience.watchdog.drain_timeout_s):
            yield

    def summary(self) -> dict[str, Any]:
        return {
            "notices": self.preemption.interruptions.records,
            "emergency": self.preemption.summary(),
            **self.anomalies.summary(),
            "checkpoint_interval": self.schedule.reason,
            "restarts": int(self.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
            **(self.validation.summary() if self.validation is not None else {}),
        }

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        self.preemption.close()
        if self.node_metrics is not None:
            self.node_metrics.close()
        self.metrics.close()
        fencing.report_to(None)
        self.events.close()
