"""When the reference loop saves: :class:`SaveSchedule`, the adaptive interval applied.

After each step (a :class:`~ftfleet.trainer.callbacks.Callback`) it feeds the step's
time to :class:`~ftfleet.trainer.resilience.interval.adaptive.AdaptiveInterval` and starts a
save when one is due. A run's first save comes as soon as its step time is measured
(:data:`MIN_STEPS` steps after the first), or at ``fixed_steps`` if that is sooner: its
cost is the other measure the interval needs. After each save it chooses the next save step: rank 0 computes
it from its measurements and broadcasts it, since each rank measures slightly
different times and a save is a collective. Every save of the run (interval, early,
final, emergency) goes through :meth:`SaveSchedule.save`, so each is logged with its
reason and its commit is measured.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ftfleet.trainer.callbacks import Callback, StepInfo
from ftfleet.trainer.resilience.interval.adaptive import AdaptiveInterval, IntervalConfig

if TYPE_CHECKING:
    from ftfleet.trainer.checkpoint.manager import CheckpointManager
    from ftfleet.trainer.events import EventLog
    from ftfleet.trainer.resilience.anomaly.watchdog import Watchdog
    from ftfleet.trainer.resilience.observability.metrics import Metrics
    from ftfleet.trainer.train import Run

log = logging.getLogger("ftfleet.schedule")

#: How an interval chosen without a measurement starts its reason (AdaptiveInterval's
#: "no save measured yet" and the schedule's "no step measured yet").
UNMEASURED = "adaptive: no "
#: Steps between attempts to choose such an interval again.
REPLAN_STEPS = 2
#: Step times (the first step of a process or iteration left out) before the median
#: is taken as the step time; fewer: the interval is a stopgap, chosen again.
MIN_STEPS = 4
NO_STEPS = "adaptive: no step measured yet"
#: How the interval starts its reason when the run's first save is due at once: the step
#: time is measured and no save's cost is, so the first save is taken now to measure it.
FIRST_SAVE = "adaptive: the first save now"


class IntervalState:
    """The adaptive interval's history in the checkpoint (a ``Stateful`` extra of the
    app state), so that a replacement node continues the run's interruption count and
    starts from the costs measured so far. The snapshots' costs are a key of their own:
    a checkpoint written before they were kept lacks it, and the restore keeps the live
    values then."""

    _KEYS = {
        "history": ("elapsed_s", "interruptions", "blocked_s", "persist_s", "saves"),
        "snapshots": ("snapshot_s", "snapshot_busy_s", "snapshots"),
        # Its own key: DCP checkpoints written before it lack it (then: not provisional);
        # an in-memory snapshot written before it does not fit (keys must match): the
        # restore goes to the disk tiers then.
        "snapshot_provisional": ("snapshot_provisional",),
        # checkpoint.async_save=auto: the other mode's costs.
        "other": ("other_blocked_s", "other_persist_s", "other_saves"),
    }

    def __init__(self, interval: AdaptiveInterval) -> None:
        self.interval = interval

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = self.interval.state_dict()

        def pack(fields: tuple[str, ...]) -> torch.Tensor:
            values = [math.nan if state[k] is None else float(state[k]) for k in fields]
            return torch.tensor(values, dtype=torch.float64)

        return {key: pack(fields) for key, fields in self._KEYS.items() if fields[-1] in state}

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        values: dict[str, float | None] = {}
        for key, fields in self._KEYS.items():
            if key in sd:
                values.update((k, None if math.isnan(v) else v) for k, v in zip(fields, sd[key].tolist(), strict=True))
        self.interval.load_state_dict(values)


class SaveSchedule(Callback):
    """``last_step``: no interval save at or after it (the final save follows).
    ``group``: the group the choice is broadcast over (the training group: the main
    thread's; None: the default group)."""

    def __init__(
        self,
        cfg: IntervalConfig,
        ckpt: CheckpointManager,
        *,
        last_step: int,
        events: EventLog | None = None,
        metrics: Metrics | None = None,
        watchdog: Watchdog | None = None,
        group: Any = None,
    ) -> None:
        self.cfg = cfg
        self.ckpt = ckpt
        self.last_step = last_step
        self.events = events
        self.metrics = metrics
        self.watchdog = watchdog
        self.group = group
        configured = getattr(ckpt.cfg, "async_save", True)
        modes = ("async", "sync") if configured == "auto" else ("async",) if configured else ("sync",)
        self.interval = AdaptiveInterval(cfg, modes=modes)
        #: How the next interval save writes (rank 0's choice, checkpoint.async_save=auto).
        self.next_mode = modes[0]
        self.next_save = cfg.fixed_steps
        #: The next in-memory snapshot (None: checkpoint.memory is off).
        self.next_snapshot: int | None = cfg.snapshot_fixed_steps if ckpt.snapshots is not None else None
        self.snapshot_reason = ""
        self.reason = ""
        """Why the current interval (for the log and summary.json)."""
        self._step_times: deque[float] = deque(maxlen=50)
        self._pending: dict[int, dict[str, Any]] = {}
        #: The snapshot whose background part is being measured: [step, blocked seconds,
        #: extra seconds of the steps it overlapped so far, whether they are known].
        self._snapshot_open: list[Any] | None = None
        #: Snapshots taken by this schedule, and the step at which the first one's interval
        #: is planned again once it has been measured (it was chosen before that).
        self._snapshots_taken = 0
        self._replan: tuple[int, int] | None = None  # (at step, from step)
        #: The same for the durable interval while it lacks a measurement (a step time,
        #: a save's cost): chosen again every REPLAN_STEPS steps until it has them, not
        #: fixed_steps later (after every restart that was one more save than planned).
        self._replan_save: tuple[int, int] | None = None
        self._first_step_seen = False
        #: A save asked for at a step's end beside the interval (:meth:`request`).
        self._requested: tuple[int, str] | None = None
        self._saves_started = 0
        self._mode_why = ""
        ckpt.on_commit.append(self._on_commit)
        ckpt.app_state.extras["interval"] = IntervalState(self.interval)

    # -- the loop's side -----------------------------------------------------------

    def restored(self, restored: Any, step: int) -> None:
        """After the restore. A resumed process follows an interruption (a preemption,
        a crash, a hang) or a planned stop; both count, which errs on the side of
        checkpointing more often."""
        if restored is not None:
            self.interval.record_interruption()
        # The interval runs from the newest durable save: after a restore from memory
        # that is the newest step on disk, not the restored one (the work since then is
        # still only in RAM). Nothing on disk: from step 0, a save is due soon.
        base = step
        if restored is not None and str(restored.tier).startswith("memory"):
            base = min(step, self.ckpt.newest_on_disk or 0)
        self.reschedule(base, now=step)
        if self.next_snapshot is not None:
            self.reschedule_snapshot(step)

    def record_notice(self, received_at: float) -> None:
        self.interval.record_interruption(received_at)

    def on_step_end(self, run: Run, info: StepInfo) -> None:
        if self._first_step_seen:  # the first (warm-up, after a restore) is no measure
            self._step_times.append(info.step_time_s)
        self._first_step_seen = True
        # Steps that overlapped a background save measure what persisting costs training.
        self.interval.record_step(info.step_time_s, info.saving, info.snapshotting, self._last_mode())
        self._measure_snapshot(info)
        if self._replan_save is not None and info.step >= self._replan_save[0]:
            # Counted steps, the same on every rank: a collective (rank 0's choice).
            _, base = self._replan_save
            self.reschedule(base, now=info.step, replan=True)
        if self._replan is not None and info.step >= self._replan[0]:
            # The same step on every rank (counted, not measured): a collective.
            _, first = self._replan
            self._replan = None
            self.reschedule_snapshot(first)
        requested, self._requested = self._requested, None
        reason = "interval"
        if requested is not None and requested[0] == info.step and self.ckpt.cfg.enabled and not self.due(info.step):
            reason = requested[1]
        save = (self.due(info.step) or reason != "interval") and info.step < self.last_step
        snapshot = self.next_snapshot is not None and info.step >= self.next_snapshot and info.step < self.last_step
        # A background save written from memory (checkpoint.save_from_memory) writes the
        # snapshot of its step: taken here, it is a snapshot of the schedule's (measured,
        # and the next one planned from it), not one more.
        if snapshot or (save and self._saves_from_memory()):
            self.snapshot(info.step)
        if save:
            self.save(info.step, reason)

    def request(self, step: int, reason: str) -> None:
        """Save ``step`` at its end whether or not the interval is due (a milestone).
        Every rank asks at the same step, before this callback runs; the final step is
        saved anyway. The interval then runs from this save."""
        self._requested = (step, reason)

    def _saves_from_memory(self) -> bool:
        """Whether the next interval save writes a snapshot: a background one (the auto
        mode's choice, or the configured mode) with checkpoint.save_from_memory."""
        mode = self.next_mode if len(self.interval.modes) > 1 else self.interval.modes[0]
        return self.next_snapshot is not None and self.ckpt.cfg.save_from_memory and mode == "async"

    def due(self, step: int) -> bool:
        return self.ckpt.cfg.enabled and step >= self.next_save

    def save(self, step: int, reason: str, blocking: bool = False, **event_fields: Any) -> Any:
        """Collective. Start (or with ``blocking``, commit) a save of ``step``, then
        choose the next one. ``event_fields`` go into its ``committed`` event (an
        emergency save's ``deadline``)."""
        self._saves_started += 1
        self._pending[step] = {"reason": reason, **event_fields}
        kwargs: dict[str, Any] = {}
        if len(self.interval.modes) > 1:
            # A save that must be committed before this call returns is quicker in the
            # foreground (no staging copy); an interval save goes as chosen.
            kwargs["asynchronous"] = not blocking and self.next_mode == "async"
        mode = self.interval.modes[0] if not kwargs else "async" if kwargs["asynchronous"] else "sync"
        self._emit("save", step=step, reason=reason, blocking=blocking, mode=mode)
        if self.watchdog is not None:
            self.watchdog.beat(step)  # waiting for the previous commit is progress
        manifest = self.ckpt.save(step, blocking=blocking, **kwargs)
        if not blocking:  # a blocking save is the last one (final, emergency)
            self.reschedule(step)
        return manifest

    def snapshot(self, step: int) -> None:
        """Collective. Snapshot ``step`` into memory, then choose the next snapshot."""
        blocked = self.ckpt.snapshot(step)  # waits for the previous one's background part
        self._close_snapshot()
        self._emit("snapshot", step=step, blocked_s=round(blocked, 4))
        self._snapshot_open = [step, blocked, 0.0, True]
        self._snapshots_taken += 1
        self.reschedule_snapshot(step)
        if (self._snapshots_taken == 1 or self.interval.snapshot_provisional) and self.cfg.mode != "fixed":
            # Its cost is known once its background part is done: plan again then, not
            # snapshot_fixed_steps (or the provisional cost's interval) later: a SIGKILL
            # meanwhile would lose all of them.
            self._replan = (step + 2, step)

    def _measure_snapshot(self, info: StepInfo) -> None:
        """A snapshot's cost to training is the time it blocked plus what the steps that
        ran beside its background part lost: their time over the median quiet step. A
        step that also had a durable save in flight is the save's to account for (its
        ``k``), not the snapshot's."""
        open_ = self._snapshot_open
        if open_ is None:
            return
        if not info.snapshotting:
            self._close_snapshot()
            return
        if info.saving:
            return
        quiet = self.interval.quiet_step_s()
        if quiet is None:
            open_[3] = False
        else:
            open_[2] += max(0.0, info.step_time_s - quiet)

    def _close_snapshot(self) -> None:
        open_, self._snapshot_open = self._snapshot_open, None
        if open_ is None:
            return
        step, blocked, extra, known = open_
        done = self.ckpt.snapshots.last_complete if self.ckpt.snapshots is not None else None
        if done is None or done[0] != step:  # failed (logged): nothing to measure
            return
        background = done[1]
        # Before a quiet step was measured, the whole background part counts; and a
        # background part of b seconds takes at most b seconds from training (a slower
        # step beside it beyond that was slowed by something else: the machine's noise).
        slowdown = min(extra, background) if known else background
        # Without a quiet step, a process's first snapshot is no measure when the run
        # has one already (carried over a restart): it also creates the process's files,
        # beside a restore and the first steps' warm-up; one such sample of 4.9 s set a
        # replacement node's interval to 26 steps where 6 were due. Like the first step.
        counted = known or self.interval.snapshots == 0
        if counted:
            self.interval.record_snapshot(blocked, slowdown, background, provisional=not known)
        self._emit(
            "snapshotted",
            step=step,
            background_s=round(background, 4),
            slowdown_s=round(slowdown, 4),
            counted=counted,
        )

    def reschedule_snapshot(self, step: int) -> None:
        """Choose the next snapshot step after ``step`` (collective in adaptive mode)."""
        fixed = self.cfg.snapshot_fixed_steps
        if self.cfg.mode == "fixed":
            self.next_snapshot = (step // fixed + 1) * fixed
            return
        steps, why = fixed, f"adaptive: no step measured yet, every {fixed} steps"
        if self._step_times:
            steps, why = self.interval.snapshot_interval_steps(statistics.median(self._step_times))
        choice = [steps, why]
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.broadcast_object_list(choice, src=0, group=self.group)
        steps, why = int(choice[0]), str(choice[1])
        self.next_snapshot = step + steps
        if why != self.snapshot_reason:
            self.snapshot_reason = why
            log.info("snapshot interval: %d steps (%s)", steps, why)

    def reschedule(self, step: int, now: int | None = None, replan: bool = False) -> None:
        """Choose the next save step after ``step``, the newest durable one (collective
        in adaptive mode); ``now``: the current step, when later; ``replan``: planning
        again for a measurement that was missing."""
        fixed = self.cfg.fixed_steps
        if self.cfg.mode == "fixed":
            self.next_save = (step // fixed + 1) * fixed
            return
        steps, why = fixed, f"{NO_STEPS}, every {fixed} steps"
        if len(self._step_times) >= MIN_STEPS:
            steps, why = self.interval.interval_steps(statistics.median(self._step_times))
            if self.interval.cost() is None and self._saves_started == 0:
                # Not fixed_steps later (a run shorter than that saved only its last step):
                # the measured step time and this save's cost give Daly's interval.
                steps, why = 0, f"{FIRST_SAVE}, to measure what one costs (the step time is measured)"
        mode, mode_why = self.interval.choose_mode()
        choice = [steps, why, mode]
        if dist.is_initialized() and dist.get_world_size(self.group) > 1:
            dist.broadcast_object_list(choice, src=0, group=self.group)
        steps, why, self.next_mode = int(choice[0]), str(choice[1]), str(choice[2])
        if len(self.interval.modes) > 1 and (self.next_mode, mode_why) != (mode, self._mode_why):
            self._mode_why = mode_why
            log.info("next save: %s", mode_why if self.next_mode == mode else f"{self.next_mode} (rank 0's choice)")
        # rank 0's why, the same on every rank: all of them plan again at the same step.
        # A measured interval runs from the newest durable step; a stopgap from now (from
        # an older durable step it could be due at once), and planning again without a
        # measurement keeps it where it was.
        unmeasured = why.startswith(UNMEASURED)
        now = step if now is None else now
        next_save = step + steps
        if why.startswith(FIRST_SAVE):
            next_save = now
        elif unmeasured:
            next_save = self.next_save if replan else now + steps
        changed = (next_save, why) != (self.next_save, self.reason)
        self.next_save = next_save
        # Planning again helps only where the missing measure can come: step times, or
        # the cost of a save that was started (its commit). Counted, the same everywhere.
        waiting = why.startswith(NO_STEPS) or self._saves_started > 0
        self._replan_save = (now + REPLAN_STEPS, step) if unmeasured and waiting and self.ckpt.cfg.enabled else None
        if self.metrics is not None:
            self.metrics.checkpoint_interval_steps.set(steps)
        if why != self.reason:
            self.reason = why
            if steps:
                # The stopgap before the measurements is for debugging; the chosen interval is said.
                log.log(logging.DEBUG if unmeasured else logging.INFO, "checkpoint interval: %d steps (%s)", steps, why)
            else:
                log.info("checkpoint at step %d: %s", now, why.removeprefix("adaptive: "))
        if changed and steps:  # (the first save's is its "save" event)
            cost = self.interval.cost()  # rank 0's, the one that chose (events are rank 0's)
            self._emit("interval", steps=steps, why=why, cost_s=round(cost[0], 4) if cost else None)

    # -- the commit thread's side --------------------------------------------------

    def _on_commit(self, manifest: Any) -> None:
        """On the commit thread of every rank, after ``step-N``'s manifest landed."""
        stats = self.ckpt.stats
        persist = max(0.0, stats.last_commit_s - stats.last_blocked_s)
        self.interval.record_save(stats.last_blocked_s, persist, self._last_mode())
        if self.metrics is not None:
            self.metrics.checkpoint_saved(stats.last_blocked_s, persist)
            self.metrics.last_committed_step.set(manifest.step)
        fields = self._pending.pop(manifest.step, {"reason": ""})
        if "deadline" in fields:
            fields["within_deadline"] = time.time() <= fields["deadline"]
        self._emit(
            "committed",
            step=manifest.step,
            blocked_s=round(stats.last_blocked_s, 4),
            commit_s=round(stats.last_commit_s, 4),
            written_bytes=manifest.total_bytes,
            reused_bytes=manifest.reused_bytes,
            **fields,
        )

    def _last_mode(self) -> str | None:
        """How the newest save was written (the manager's record); None: not recorded."""
        asynchronous = getattr(self.ckpt.stats, "last_async", None) if hasattr(self.ckpt, "stats") else None
        return None if asynchronous is None else "async" if asynchronous else "sync"

    def _emit(self, event: str, **fields: Any) -> None:
        if self.events is not None:
            self.events.emit(event, **fields)
