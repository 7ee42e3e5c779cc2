"""The reference training loop. Read :func:`train` top to bottom: build, restore, step,
save, stop, summarize.

Hook points for the resilience layer are :class:`Callback` objects, called at the step
boundary on every rank:

* ``on_train_start(run)`` after restore, before the first step;
* ``on_step_end(run, info)`` after each optimizer step (anomaly detector, watchdog
  heartbeat, metrics);
* ``should_stop(run)`` at every step boundary, including the first: return a
  :class:`StopRequest` to stop (preemption). It must answer the same on every rank, so
  a callback that sees a local signal agrees with the others through a collective;
* ``on_train_end(run, result)`` after the final (or emergency) checkpoint is committed
  (commit markers, exit code).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ftfleet.contract import EXIT_OK, EXIT_PREEMPTED
from ftfleet.errors import ConfigError
from ftfleet.trainer import distributed, parallel
from ftfleet.trainer.checkpoint.manager import CheckpointManager
from ftfleet.trainer.checkpoint.restore import Restored
from ftfleet.trainer.checkpoint.state import AppState, TrainProgress, full_state, seed_rngs, state_sha256
from ftfleet.trainer.config import JobConfig
from ftfleet.trainer.data.loader import GlobalBatches
from ftfleet.trainer.events import EventLog
from ftfleet.trainer.resilience.anomaly import Action, Decision
from ftfleet.trainer.resilience.guard import Guard

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
    loss: float
    """This rank's loss on its micro-batch."""
    samples_seen: int
    step_time_s: float


class Callback:
    """Base class of the hooks; override what you need."""

    def on_train_start(self, run: Run) -> None: ...
    def on_step_end(self, run: Run, info: StepInfo) -> None: ...
    def should_stop(self, run: Run) -> StopRequest | None:
        return None

    def on_train_end(self, run: Run, result: dict[str, Any]) -> None: ...


class StopAtStep(Callback):
    """``train.stop_at_step``: stop cleanly with a committed checkpoint at a given step."""

    def __init__(self, step: int):
        self.step = step

    def should_stop(self, run: Run) -> StopRequest | None:
        if run.progress.step >= self.step:
            return StopRequest(f"stop_at_step {self.step}")
        return None


@dataclasses.dataclass
class Run:
    """Everything a callback may need, built once."""

    cfg: JobConfig
    env: distributed.DistEnv
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    progress: TrainProgress
    ckpt: CheckpointManager
    data: GlobalBatches
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    """``loss.factory``'s loss(model, batch)."""
    restored: Restored | None = None

    def load_pretrained(self) -> None:
        """``model.init_from``, for a run that restored nothing (a checkpoint, when there
        is one, holds newer weights). Collective."""
        if not self.cfg.model.init_from:
            return
        from ftfleet.trainer.weights import load_pretrained

        what = load_pretrained(self.model, self.cfg.model.init_from, rank=self.env.rank, group=self.env.ckpt_group)
        if self.env.is_rank0:
            log.info("model: initialised from %s", what)


def build(cfg: JobConfig) -> Run:
    """The run's parts, from the config's factories (trainer/factories.py). Every factory
    is called before the RNGs are seeded for training, so whatever a user's factory
    draws does not shift the training stream."""
    env = distributed.init_distributed(cfg.parallel, cfg.checkpoint.timeout_s)
    model = build_model(cfg, env)
    optimizer = cfg.optim.factories["factory"](model, job=cfg)
    _expect(optimizer, torch.optim.Optimizer, "optim.factory", "a torch.optim.Optimizer")
    scheduler = _expect(
        cfg.optim.factories["scheduler"](optimizer, job=cfg),
        torch.optim.lr_scheduler.LRScheduler,
        "optim.scheduler",
        "a torch.optim.lr_scheduler.LRScheduler",
    )
    loss_fn = cfg.loss.factories["factory"](job=cfg)
    if not callable(loss_fn):
        raise ConfigError(f"loss.factory returned {type(loss_fn).__name__}: return a callable loss(model, batch)")
    dataset = build_dataset(cfg, model)
    seed_rngs(cfg.seed, env.rank)  # distinct dropout streams per rank
    progress = TrainProgress()
    trace = Path(cfg.run_dir) / "samples" if cfg.data.trace_samples else None
    data = GlobalBatches(
        dataset,
        cfg.train.global_batch_size,
        env.rank,
        env.world_size,
        env.device,
        seed=cfg.seed,
        shuffle=cfg.data.shuffle,
        num_workers=cfg.data.num_workers,
        trace_dir=trace,
    )
    app = AppState(model, optimizer, scheduler, progress, env.rank, cfg.seed, per_rank={"data": data})
    ckpt = CheckpointManager(
        cfg.checkpoint,
        app,
        run_id=cfg.run_id,
        config_hash=cfg.config_hash(),
        ckpt_group=env.ckpt_group,
        upload_group=env.upload_group,
    )
    return Run(cfg, env, model, optimizer, scheduler, progress, ckpt, data, loss_fn)


def build_model(cfg: JobConfig, env: distributed.DistEnv) -> nn.Module:
    """``model.factory``, on the meta device with ``model.meta_init``, then sharded (or
    wrapped in DDP). Without meta_init every rank builds identical weights."""
    factory = cfg.model.factories["factory"]
    torch.manual_seed(cfg.seed)
    with torch.device("meta") if cfg.model.meta_init else contextlib.nullcontext():
        model = factory(job=cfg)
    _expect(model, nn.Module, "model.factory", "a torch.nn.Module")
    return parallel.parallelize(model, cfg.parallel, env, on_meta=cfg.model.meta_init, seed=cfg.seed)


def build_dataset(cfg: JobConfig, model: nn.Module) -> Any:
    dataset = cfg.data.factories["factory"](job=cfg)
    if not (callable(getattr(dataset, "__getitem__", None)) or isinstance(dataset, torch.utils.data.IterableDataset)):
        raise ConfigError(
            f"data.factory={cfg.data.factory} returned {type(dataset).__name__}: return a map-style dataset "
            "(__getitem__, and __len__ when sized) or a torch.utils.data.IterableDataset"
        )
    vocab = getattr(dataset, "vocab_size", None)
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if isinstance(vocab, int) and embedding is not None and vocab > embedding.num_embeddings:
        raise ConfigError(
            f"data: token ids go up to {vocab - 1} but the model's embedding has {embedding.num_embeddings} rows: "
            f"give the model a vocabulary of at least {vocab}"
        )
    return dataset


def _expect(obj: Any, kind: type, key: str, what: str) -> Any:
    if not isinstance(obj, kind):
        raise ConfigError(f"{key} returned {type(obj).__name__}, not {what}: check what it returns")
    return obj


def train(cfg: JobConfig, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    t_start = time.monotonic()
    run = build(cfg)
    events = EventLog(cfg.run_dir, enabled=run.env.is_rank0)
    guard = Guard(run, events)
    try:
        return _train(run, guard, events, list(callbacks), t_start)
    finally:
        guard.close()
        events.close()


def _train(run: Run, guard: Guard, events: EventLog, callbacks: list[Callback], t_start: float) -> dict[str, Any]:
    cfg = run.cfg
    model, optimizer, scheduler, progress, ckpt = (run.model, run.optimizer, run.scheduler, run.progress, run.ckpt)
    if cfg.train.stop_at_step is not None:
        callbacks.append(StopAtStep(cfg.train.stop_at_step))
    events.emit("start", world_size=run.env.world_size)
    guard.start()
    run.restored = ckpt.restore()
    if run.restored is None:
        run.load_pretrained()
    guard.restored(run.restored)
    for cb in callbacks:
        cb.on_train_start(run)

    loss_value, stop, t_log = float("nan"), None, time.monotonic()
    while progress.step < cfg.train.steps:
        if stop := _should_stop(run, callbacks) or guard.boundary(progress.step):
            break
        t0, step = time.monotonic(), progress.step + 1
        if guard.skip_batch(step):  # a rollback decided this batch is poison
            _advance(run, scheduler)
            continue
        guard.before_step(step)
        batch = run.data.get(progress.samples_seen, step)
        loss = guard.poison(step, run.loss_fn(model, batch.data))
        loss.backward()
        # The norm is computed (not clipped) when clipping is off: the anomaly check uses it.
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or math.inf)
        decision = guard.judge(step, loss, _full(grad_norm))
        if decision.action is Action.ROLLBACK:
            optimizer.zero_grad(set_to_none=True)
            if guard.rollback(step):
                continue
            decision = Decision(Action.SKIP, step, decision.reason)
        if decision.ok:
            ckpt.wait_for_staging()  # the last save's copy must be done before the weights change
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _advance(run, scheduler)

        loss_value = loss.item()
        info = StepInfo(progress.step, loss_value, progress.samples_seen, time.monotonic() - t0)
        guard.after_step(progress.step, loss_value, info.step_time_s)
        for cb in callbacks:
            cb.on_step_end(run, info)
        if progress.step % cfg.train.log_every == 0 and run.env.is_rank0:
            dt, t_log = time.monotonic() - t_log, time.monotonic()
            log.info(
                "step %d loss %.4f lr %.2e %.1f steps/s",
                progress.step,
                loss_value,
                scheduler.get_last_lr()[0],
                cfg.train.log_every / dt,
            )
        if guard.should_save(progress.step) and progress.step < cfg.train.steps:
            guard.save(progress.step, "interval")

    # The final (or emergency) checkpoint is synchronous: committed when this returns.
    ckpt.wait()
    resumed_here = run.restored is not None and run.restored.step == progress.step
    if (
        cfg.checkpoint.enabled
        and (stop is None or stop.save)
        and progress.step not in ckpt.committed
        and not resumed_here
    ):
        guard.save(
            progress.step, "emergency" if stop and stop.exit_code else "stop" if stop else "final", blocking=True
        )
    if stop is not None and stop.exit_code == EXIT_PREEMPTED:
        # The checkpoint is safe on the fast tier: keep uploading while the notice
        # leaves time, then tell the fleet the node may go.
        drained = ckpt.close(upload_deadline=guard.upload_deadline())
        if cfg.checkpoint.enabled:
            guard.write_marker(progress.step)
    else:
        drained = ckpt.close(wait_for_upload=stop is None or stop.exit_code == EXIT_OK)
    run.data.close()

    result = summarize(run, stop, loss_value, time.monotonic() - t_start)
    result.update(guard.summary())
    if run.env.is_rank0:
        write_summary(Path(run.cfg.run_dir), result)
    events.emit("exit", code=result["exit_code"], reason=result["stop_reason"], step=progress.step)
    for cb in callbacks:
        cb.on_train_end(run, result)
    if drained:  # an upload still in a collective would make the teardown hang
        distributed.shutdown()
    if stop is not None and stop.exit_code == EXIT_PREEMPTED:
        guard.release_node()
    return result


def _advance(run: Run, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
    """One step consumed: its batch, its place in the LR schedule, its step number,
    whether or not its update was applied."""
    scheduler.step()
    run.progress.step += 1
    run.progress.samples_seen += run.cfg.train.global_batch_size


def _full(norm: torch.Tensor) -> torch.Tensor:
    """FSDP2 returns the global norm as a DTensor; the value is the same everywhere."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def _should_stop(run: Run, callbacks: Sequence[Callback]) -> StopRequest | None:
    for cb in callbacks:
        if (request := cb.should_stop(run)) is not None:
            return request
    return None


def summarize(run: Run, stop: StopRequest | None, loss: float, wall_s: float) -> dict[str, Any]:
    """The run's summary (the caller writes it to <run_dir>/summary.json on rank 0).
    Collective (state hash)."""
    state = full_state(run.model, run.optimizer)
    ckpt = run.ckpt
    result = {
        "status": "stopped" if stop else "completed",
        "stop_reason": stop.reason if stop else None,
        "exit_code": stop.exit_code if stop else EXIT_OK,
        "run_id": run.cfg.run_id,
        "config_hash": run.cfg.config_hash(),
        "step": run.progress.step,
        "samples_seen": run.progress.samples_seen,
        "world_size": run.env.world_size,
        "parallel": run.cfg.parallel.mode,
        "loss": loss,
        "state_sha256": state_sha256(state) if state is not None else None,
        "resumed_from": run.restored.to_json() if run.restored else None,
        "committed": [{"step": s, "path": str(ckpt.local.step_dir(s))} for s in ckpt.committed],
        "durable": [{"step": s, "uri": f"{ckpt.stores['primary'].uri}/step-{s}"} for s in ckpt.durable_steps],
        "checkpoint_blocked_s": round(ckpt.stats.blocked_s, 4),
        "wall_s": round(wall_s, 2),
    }
    return result


def write_summary(run_dir: Path, result: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / ".summary.json.tmp"
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, run_dir / "summary.json")
