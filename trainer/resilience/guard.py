"""The resilience layer as the training loop sees it: one :class:`Guard` per process.

The loop calls, on every rank, in this order::

    guard.start()                         # watcher, watchdog, metrics exporter
    guard.restored(ckpt.restore())        # log it, count a restart as an interruption
    while ...:
        stop = guard.boundary(step)       # agree on notices; early save on advisory ones
        if guard.skip_batch(step + 1): ...# a batch a rollback decided to skip
        guard.before_step(step + 1)       # injected faults (drills)
        loss = guard.poison(step + 1, loss)
        decision = guard.judge(step + 1, loss, grad_norm)   # collective
        ...                                # OK: optimizer step; SKIP; ROLLBACK
        guard.after_step(info)            # watchdog beat, metrics, events
        if guard.should_save(step): guard.save(step, "interval")
    guard.finish(stop, ...)               # emergency/final save, marker, exit event

Every decision that changes what the ranks do next (stop, save, skip, roll back) is
taken from values that are identical on every rank: agreed notices, all-reduced loss
and gradient norm, and a save schedule that rank 0 chooses and broadcasts. A rank that
decided alone would leave the others waiting in a collective.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import statistics
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ftfleet.contract import EXIT_PREEMPTED, CommitMarker
from ftfleet.trainer.agent import stop_agent
from ftfleet.trainer.checkpoint.manager import DEADLINE_MARGIN_S
from ftfleet.trainer.events import EventLog
from ftfleet.trainer.resilience.agreement import agree
from ftfleet.trainer.resilience.anomaly import Action, AnomalyDetector, Decision
from ftfleet.trainer.resilience.interval import AdaptiveInterval
from ftfleet.trainer.resilience.markers import publish_marker
from ftfleet.trainer.resilience.metrics import Metrics, metrics_port
from ftfleet.trainer.resilience.notices import Notice
from ftfleet.trainer.resilience.watcher import NoticeWatcher

if TYPE_CHECKING:
    from ftfleet.trainer.train import Run, StopRequest

log = logging.getLogger("ftfleet.guard")


class IntervalState:
    """The adaptive interval's history as one tensor in the checkpoint (AppState
    ``extras``), so that a replacement node continues the run's interruption count."""

    _FIELDS = ("elapsed_s", "interruptions", "blocked_s", "persist_s", "saves")

    def __init__(self, interval: AdaptiveInterval) -> None:
        self.interval = interval

    def state_tensor(self) -> torch.Tensor:
        state = self.interval.state_dict()
        return torch.tensor(
            [math.nan if state[k] is None else float(state[k]) for k in self._FIELDS], dtype=torch.float64
        )

    def load_tensor(self, tensor: torch.Tensor) -> None:
        values = tensor.tolist()
        state = {k: (None if math.isnan(v) else v) for k, v in zip(self._FIELDS, values, strict=True)}
        self.interval.load_state_dict(state)


class Guard:
    def __init__(self, run: Run, events: EventLog, environ: dict[str, str] | None = None):
        environ = dict(os.environ if environ is None else environ)
        cfg = run.cfg
        self.run = run
        self.cfg = cfg.resilience
        self.faults = cfg.faults
        self.events = events
        self.node_id = environ.get("FTFLEET_NODE_ID") or socket.gethostname()
        self.local_rank = run.env.local_rank
        self.watcher = NoticeWatcher.from_env(self.cfg.watcher, environ)
        self.watchdog = self.cfg.watchdog.build()
        self.detector = AnomalyDetector(self.cfg.anomaly)
        self.interval = AdaptiveInterval(self.cfg.interval)
        self.metrics = Metrics.from_env(environ)
        self._metrics_port = metrics_port(environ)
        self.notices: list[dict[str, Any]] = []
        self.skipped_batches: set[int] = set()
        self.rollbacks: list[dict[str, int]] = []
        self.next_save = self.cfg.interval.fixed_steps
        self.interval_reason = ""
        self._step_times: deque[float] = deque(maxlen=50)
        self._saving_at_step_start = False
        self._first_step_logged = False
        self._save_reason: dict[int, str] = {}
        self._emergency: dict[str, Any] | None = None
        self._hang_flag = Path(cfg.run_dir) / "faults" / f"hang-step-{self.faults.hang_at_step}"
        run.ckpt.on_commit.append(self._on_commit)
        run.ckpt.app_state.extras["interval"] = IntervalState(self.interval)

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        self.watcher.start()
        if self.watchdog is not None:
            self.watchdog.start()  # the first-step allowance covers the restore
        port = self.metrics.serve(self._metrics_port, local_rank=self.local_rank)
        if port:
            log.info("metrics on :%d/metrics", port)

    def close(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        self.watcher.stop()
        self.metrics.close()

    def restored(self, restored: Any) -> None:
        """After ``ckpt.restore()``. A resumed process follows an interruption (a
        preemption, a crash, a hang) or a planned stop; both count, which errs on the
        side of checkpointing more often."""
        progress = self.run.progress
        if restored is None:
            self.events.emit("fresh")
        else:
            self.interval.record_interruption()
            self.events.emit(
                "restored",
                step=restored.step,
                tier=restored.tier,
                source=restored.location,
                world_size_written=restored.manifest.world_size,
            )
        self._schedule_next(progress.step)

    # -- the step boundary -------------------------------------------------------

    def boundary(self, step: int) -> StopRequest | None:
        """Collective. The agreed notice, if any: a terminal one stops the run (the
        loop then takes the emergency checkpoint); an advisory one starts an early
        checkpoint here and training carries on."""
        from ftfleet.trainer.train import StopRequest

        mine = self.watcher.pending()
        notice = agree(mine)
        if notice is None:
            return None
        self.metrics.notice(notice.kind)
        record = {
            "kind": str(notice.kind),
            "source": str(notice.source),
            "received_at": notice.received_at,
            "deadline": notice.deadline,
            "terminal": notice.terminal,
            "step": step,
            "agreed_at": time.time(),
        }
        self.notices.append(record)
        self.events.emit("notice", **record)
        self.interval.record_interruption(notice.received_at)
        if notice.terminal:
            # Whether this node's own watcher saw a termination (this machine is the one
            # going away), or only agreed to another node's.
            self._emergency = {"notice": notice, "step": step, "local": mine is not None and mine.terminal}
            log.warning(
                "%s: emergency checkpoint of step %d, %.1fs before the deadline",
                notice.describe(),
                step,
                notice.remaining(),
            )
            return StopRequest(f"notice: {notice.kind} from {notice.source}", EXIT_PREEMPTED, save=True)
        self.watcher.acknowledge(notice)
        ckpt = self.run.ckpt
        if (
            self.run.cfg.checkpoint.enabled
            and step > 0
            and step not in ckpt.committed
            and step != ckpt.last_saved_step  # an interval save of it may be in flight
            and step < self.run.cfg.train.steps
        ):
            log.warning("%s: early checkpoint of step %d, then carrying on", notice.describe(), step)
            self.save(step, f"notice:{notice.kind}")
        return None

    # -- one step ----------------------------------------------------------------

    def skip_batch(self, step: int) -> bool:
        """True for a batch that a rollback decided to skip (the same on every rank)."""
        return step in self.skipped_batches

    def before_step(self, step: int) -> None:
        self._saving_at_step_start = self.run.ckpt.save_in_flight
        f = self.faults
        if f.step_delay_s:
            time.sleep(f.step_delay_s)
        if f.hang_at_step == step and self.run.env.rank == f.hang_rank and not self._hang_flag.exists():
            self._hang_flag.parent.mkdir(parents=True, exist_ok=True)
            self._hang_flag.write_text(f"{time.time()}\n")
            log.warning("fault injection: rank %d hangs before step %d", f.hang_rank, step)
            while True:  # only the watchdog (or a signal) ends this
                time.sleep(1)

    def poison(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """``faults.nan_at_steps`` / ``spike_at_steps``: a bad batch on rank 0, applied
        before the backward pass so the gradients are bad too, as with bad data."""
        if self.run.env.rank != 0:
            return loss
        if step in self.faults.nan_at_steps:
            log.warning("fault injection: NaN loss at step %d", step)
            return loss * float("nan")
        if step in self.faults.spike_at_steps:
            log.warning("fault injection: loss x%g at step %d", self.faults.spike_factor, step)
            return loss * self.faults.spike_factor
        return loss

    def judge(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> Decision:
        """Collective. The anomaly decision for this step, from the mean loss and the
        gradient norm over all ranks (a NaN anywhere makes the mean NaN everywhere)."""
        values = torch.stack([loss.detach().float().reshape(()), grad_norm.detach().float().reshape(())]).to(
            torch.float64
        )
        if dist.is_initialized():
            values = values.to(self.run.env.device)
            dist.all_reduce(values)
            values = values / dist.get_world_size()
        mean_loss, norm = values.cpu().tolist()
        decision = self.detector.check(step, mean_loss, norm)
        if not decision.ok:
            self.events.emit("anomaly", step=step, action=str(decision.action), reason=decision.reason)
            if decision.action is Action.SKIP:
                self.metrics.skipped_steps.inc()
        return decision

    def rollback(self, step: int) -> bool:
        """Reload the newest valid checkpoint and remember to skip ``step``'s batch.
        False when there is nothing to roll back to (the step is skipped instead)."""
        ckpt = self.run.ckpt
        ckpt.wait()
        self.skipped_batches.add(step)
        restored = ckpt.rollback()
        if restored is None:
            log.warning("no checkpoint to roll back to: skipping the batch of step %d", step)
            return False
        self.metrics.rollbacks.inc()
        self.rollbacks.append({"from_step": step, "to_step": restored.step})
        self.events.emit("rollback", from_step=step, to_step=restored.step)
        self._schedule_next(restored.step)
        return True

    def after_step(self, step: int, loss: float, seconds: float) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(step)
        self.metrics.step(seconds)
        self._step_times.append(seconds)
        # Steps that overlapped a background save measure what persisting costs training.
        saving = self._saving_at_step_start or self.run.ckpt.save_in_flight
        self.interval.record_step(seconds, saving)
        if not self._first_step_logged:
            self._first_step_logged = True
            self.events.emit("first_step", step=step)
        if self.run.cfg.train.step_events:
            self.events.emit("step", step=step, loss=loss, seconds=round(seconds, 5), saving=saving)

    # -- the save schedule -------------------------------------------------------

    def should_save(self, step: int) -> bool:
        return self.run.cfg.checkpoint.enabled and step >= self.next_save

    def save(self, step: int, reason: str, *, blocking: bool = False) -> Any:
        """Start (or with ``blocking``, commit) a save of ``step``, then choose the next
        one. Collective."""
        ckpt = self.run.ckpt
        self._save_reason[step] = reason
        self.events.emit("save", step=step, reason=reason, blocking=blocking)
        if self.watchdog is not None:
            self.watchdog.beat(step)  # waiting for the previous commit is progress
        manifest = ckpt.save(step, blocking=blocking)
        if not blocking:  # a blocking save is the last one (final, emergency)
            self._schedule_next(step)
        return manifest

    def _schedule_next(self, step: int) -> None:
        """Rank 0 chooses the next save step from the measured costs and broadcasts it:
        each rank measures slightly different times, and a save is a collective."""
        fixed = self.cfg.interval.fixed_steps
        if self.cfg.interval.mode == "fixed":
            self.next_save = (step // fixed + 1) * fixed
            return
        steps, why = fixed, f"adaptive: no step measured yet, every {fixed} steps"
        if self._step_times:
            steps, why = self.interval.interval_steps(statistics.median(self._step_times))
        choice = [steps, why]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(choice, src=0)  # the training group: main thread
        steps, why = int(choice[0]), str(choice[1])
        self.next_save = step + steps
        self.metrics.checkpoint_interval_steps.set(steps)
        if why != self.interval_reason:
            self.interval_reason = why
            log.info("checkpoint interval: %d steps (%s)", steps, why)
        cost = self.interval.cost()  # rank 0's, the one that chose (events are rank 0's)
        self.events.emit("interval", steps=steps, why=why, cost_s=round(cost[0], 4) if cost else None)

    def _on_commit(self, manifest: Any) -> None:
        """On the commit thread of every rank, after ``step-N``'s manifest landed."""
        stats = self.run.ckpt.stats
        persist = max(0.0, stats.last_commit_s - stats.last_blocked_s)
        self.interval.record_save(stats.last_blocked_s, persist)
        self.metrics.checkpoint_saved(stats.last_blocked_s, persist)
        self.metrics.last_committed_step.set(manifest.step)
        reason = self._save_reason.pop(manifest.step, "")
        record: dict[str, Any] = {
            "step": manifest.step,
            "reason": reason,
            "blocked_s": round(stats.last_blocked_s, 4),
            "commit_s": round(stats.last_commit_s, 4),
        }
        if self._emergency is not None and manifest.step == self._emergency["step"]:
            notice: Notice = self._emergency["notice"]
            record.update(deadline=notice.deadline, within_deadline=time.time() <= notice.deadline)
            self._emergency["committed_at"] = time.time()
        self.events.emit("committed", **record)

    # -- the end -----------------------------------------------------------------

    def upload_deadline(self) -> float | None:
        """Epoch by which the emergency path stops waiting for the durable upload."""
        if self._emergency is None:
            return None
        return self._emergency["notice"].deadline - DEADLINE_MARGIN_S

    def write_marker(self, step: int) -> dict[str, Any] | None:
        """After an emergency checkpoint: the commit marker of this node (local rank 0;
        every rank has committed its shard when the blocking save returned)."""
        if self._emergency is None or self.local_rank != 0:
            return None
        ckpt = self.run.ckpt
        notice: Notice = self._emergency["notice"]
        marker = CommitMarker.now(
            self.run.cfg.run_id, self.node_id, step, str(notice.kind), durable=step in ckpt.durable_steps
        )
        primary = ckpt.stores.get("primary")
        written = publish_marker(
            marker,
            fast_root=ckpt.local.root,
            put=primary.put_bytes if primary is not None else None,
            deadline=notice.deadline,
        )
        result = {
            "step": step,
            "reason": str(notice.kind),
            "path": str(written.local_path),
            "uploaded": written.uploaded,
            "durable": marker.durable,
        }
        self.events.emit("marker", **result)
        return result

    def release_node(self) -> int | None:
        """The very last thing a preempted node does: on the node whose own watcher saw
        the termination notice, stop its torchrun agent, which would otherwise restart the
        workers (``--max-restarts``) on a machine that is going away
        (:mod:`ftfleet.trainer.agent`). Returns the agent's pid when it was stopped."""
        if self._emergency is None or not self._emergency["local"]:
            return None
        pid = stop_agent(EXIT_PREEMPTED, "this node is going away")
        if pid is not None:
            self.events.emit("agent_stopped", pid=pid, code=EXIT_PREEMPTED)
        return pid

    def emergency(self) -> dict[str, Any] | None:
        """What the emergency path did, for summary.json."""
        if self._emergency is None:
            return None
        notice: Notice = self._emergency["notice"]
        committed_at = self._emergency.get("committed_at")
        return {
            "kind": str(notice.kind),
            "source": str(notice.source),
            "step": self._emergency["step"],
            "received_at": notice.received_at,
            "deadline": notice.deadline,
            "committed_at": committed_at,
            "seconds_to_commit": (None if committed_at is None else round(committed_at - notice.received_at, 3)),
            "within_deadline": committed_at is not None and committed_at <= notice.deadline,
        }

    def summary(self) -> dict[str, Any]:
        c = self.detector.counters
        return {
            "notices": self.notices,
            "emergency": self.emergency(),
            "anomalies": {"nonfinite": c.nonfinite, "spikes": c.spikes, "skipped": c.skipped, "rollbacks": c.rollbacks},
            "rollbacks": self.rollbacks,
            "skipped_batches": sorted(self.skipped_batches),
            "checkpoint_interval": self.interval_reason,
            "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0),
        }
