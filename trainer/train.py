"""The reference training loop. Read :func:`train` top to bottom: check, build,
restore, step, save, stop, drain, summarize.

The loop's extension point is the :class:`~ftfleet.trainer.callbacks.Callback`; its own
resilience pieces (notices, anomalies, the save schedule, the step monitor) are
callbacks or small objects wired by :class:`~ftfleet.trainer.resilience.reference.Resilience`.
A loop of your own can use the same pieces without this one (README: "Your own training loop").
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ftfleet.contract import EXIT_OK
from ftfleet.errors import ConfigError
from ftfleet.hostenv import find_jemalloc
from ftfleet.trainer import distributed, parallel
from ftfleet.trainer.callbacks import Callback, StepInfo, StopRequest, first_stop
from ftfleet.trainer.checkpoint.manager import CheckpointManager
from ftfleet.trainer.checkpoint.restore import Restored
from ftfleet.trainer.checkpoint.state import AppState, TrainProgress, full_state, seed_rngs, state_sha256
from ftfleet.trainer.config import JobConfig
from ftfleet.trainer.data.loader import GlobalBatches
from ftfleet.trainer.data.workers import start_for
from ftfleet.trainer.environment import TrainerEnvironment
from ftfleet.trainer.hf import CONFIG_EXTRA, config_record
from ftfleet.trainer.hostmem import active_allocator, use_huge_pages
from ftfleet.trainer.preflight import preflight
from ftfleet.trainer.resilience.anomaly.guard import AnomalyGuard
from ftfleet.trainer.resilience.fencing import lease
from ftfleet.trainer.resilience.reference import Resilience

log = logging.getLogger("ftfleet.train")


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
    deferred_init: Callable[[], None] | None = None
    """The model's init, when the build skipped it for a restore (:func:`build_model`)."""

    def initialize(self) -> None:
        """The init the build deferred, for a run that restored nothing. Collective."""
        if self.deferred_init is not None:
            t0 = time.monotonic()
            self.deferred_init()
            self.deferred_init = None
            log.debug("model: initialised in %.2f s (nothing to restore)", time.monotonic() - t0)

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
    model, deferred_init = build_model(cfg, env, restoring=cfg.checkpoint.load)
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
        start_method=cfg.data.start_method,
        trace_dir=trace,
    )
    extras = {CONFIG_EXTRA: record} if (record := config_record(model)) is not None else {}
    app = AppState(model, optimizer, scheduler, progress, env.rank, cfg.seed, extras=extras, per_rank={"data": data})
    ckpt = CheckpointManager(
        cfg.checkpoint,
        app,
        run_id=cfg.run_id,
        config_hash=cfg.config_hash(),
        ckpt_group=env.ckpt_group,
        upload_group=env.upload_group,
    )
    return Run(cfg, env, model, optimizer, scheduler, progress, ckpt, data, loss_fn, deferred_init=deferred_init)


def build_model(
    cfg: JobConfig, env: distributed.DistEnv, *, restoring: bool = False
) -> tuple[nn.Module, Callable[[], None] | None]:
    """``model.factory``, on the meta device with ``model.meta_init``, then sharded (or
    wrapped in DDP). Without meta_init every rank builds identical weights.

    ``restoring``: a checkpoint will probably overwrite every parameter. Without
    meta_init the parameters are then made on the meta device and allocated without
    values (buffers are computed as usual), and the init is returned instead of run:
    it builds the model exactly as without ``restoring`` and loads it (collective), for
    a run that restores nothing. At 113M parameters on 2 ranks this skips about 1.5 s of
    a restart (the constructor's init and FSDP's copy into shards). A model that cannot
    be built without values is built the usual way (returned init None)."""
    factory = cfg.model.factories["factory"]
    if restoring and not cfg.model.meta_init:
        torch.manual_seed(cfg.seed)
        try:
            with parallel.parameters_on_meta():
                model = factory(job=cfg)
            _expect(model, nn.Module, "model.factory", "a torch.nn.Module")
            freeze(model, cfg.model.freeze)
            if any(b.is_meta for b in model.buffers()):
                raise parallel.NeedsValues("a buffer was computed from a parameter")
        except parallel.NeedsValues as exc:
            log.info("model: built with its init (%s)", exc)
        else:
            model = parallel.parallelize(model, cfg.parallel, env, on_meta=True, seed=cfg.seed, init=False)
            return model, lambda: _load_initial_weights(cfg, model)
    torch.manual_seed(cfg.seed)
    with torch.device("meta") if cfg.model.meta_init else contextlib.nullcontext():
        model = factory(job=cfg)
    _expect(model, nn.Module, "model.factory", "a torch.nn.Module")
    freeze(model, cfg.model.freeze)
    return parallel.parallelize(model, cfg.parallel, env, on_meta=cfg.model.meta_init, seed=cfg.seed), None


def freeze(model: nn.Module, patterns: list[str]) -> None:
    """``model.freeze``: the parameters whose names match a pattern stop requiring
    gradients. ConfigError for a pattern that matches none (a typo would train them)."""
    if not patterns:
        return
    names = [name for name, _ in model.named_parameters()]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
            raise ConfigError(
                f"model.freeze: {pattern!r} matches no parameter; use names as named_parameters() "
                f"gives them, e.g. {names[0]!r}"
                if names
                else f"model.freeze: {pattern!r}: the model has no parameters"
            )
    for name, param in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            param.requires_grad_(False)


def _load_initial_weights(cfg: JobConfig, model: nn.Module) -> None:
    """What a build without ``restoring`` gives ``model``: the factory's model under the
    same seed (identical on every rank), loaded into the parallel one in place. The
    RNGs, already seeded for training, are left as they were."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        initial = cfg.model.factories["factory"](job=cfg)
    set_model_state_dict(model, initial.state_dict(), options=StateDictOptions(full_state_dict=True))


def build_dataset(cfg: JobConfig, model: nn.Module) -> Any:
    dataset = cfg.data.factories["factory"](job=cfg)
    check_dataset(dataset, model, "data.factory", cfg.data.factory)
    return dataset


def check_dataset(dataset: Any, model: nn.Module, key: str, spec: str) -> None:
    """What a dataset factory (``key`` = ``spec``) returned can be read, and its token ids
    fit the model's embedding; ConfigError otherwise."""
    if not (callable(getattr(dataset, "__getitem__", None)) or isinstance(dataset, torch.utils.data.IterableDataset)):
        raise ConfigError(
            f"{key}={spec} returned {type(dataset).__name__}: return a map-style dataset "
            "(__getitem__, and __len__ when sized) or a torch.utils.data.IterableDataset"
        )
    vocab = getattr(dataset, "vocab_size", None)
    embedding = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    if isinstance(vocab, int) and embedding is not None and vocab > embedding.num_embeddings:
        section = key.split(".")[0]
        raise ConfigError(
            f"{section}: token ids go up to {vocab - 1} but the model's embedding has {embedding.num_embeddings} rows: "
            f"give the model a vocabulary of at least {vocab}"
        )


def warm_up() -> None:
    """Import now what building a run would import lazily: torch.optim's first
    optimizer imports ``torch._dynamo``, which takes about a second. A warm spare
    calls this while it waits, so that taking over does not pay for it."""
    import torch._dynamo  # noqa: F401


def _expect(obj: Any, kind: type, key: str, what: str) -> Any:
    if not isinstance(obj, kind):
        raise ConfigError(f"{key} returned {type(obj).__name__}, not {what}: check what it returns")
    return obj


def train(cfg: JobConfig, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
    preflight(cfg)  # bad input fails here, before init_process_group
    huge = cfg.train.huge_pages and use_huge_pages()  # before the model, its optimizer and the first step allocate
    allocator = active_allocator()
    hint = ""
    jemalloc = find_jemalloc() if allocator == "glibc" and TrainerEnvironment().host_allocator != "system" else None
    if jemalloc:
        hint = f" (jemalloc is installed: the image's entrypoint preloads it; elsewhere LD_PRELOAD={jemalloc})"
    # Said when there is something to do (a faster malloc to preload), else for debugging.
    log.log(
        logging.INFO if hint else logging.DEBUG,
        "host memory: %s malloc%s%s",
        allocator,
        ", transparent huge pages" if huge else "",
        hint,
    )
    t_start = time.monotonic()
    start_for(cfg)  # the entry points started it already; a library caller's starts here
    run = build(cfg)
    held = lease.hold(cfg, run.ckpt.comm)  # one region trains the run: refused here, before any work
    parts = Resilience(run)
    completed = False
    try:
        result = _train(run, parts, parts.callbacks(callbacks), t_start)
        completed = result["status"] == "completed"
        return result
    except BaseException:
        run.data.abort()  # now, not when the loader is collected (an in-process restart)
        raise
    finally:
        parts.close()
        lease.let_go(held, completed)


def _train(run: Run, parts: Resilience, callbacks: list[Callback], t_start: float) -> dict[str, Any]:
    progress, ckpt, preemption = run.progress, run.ckpt, parts.preemption
    # Every rank's pid, so that the event log says which processes a restart kept (an
    # in-process restart) and which it replaced.
    pids = [os.getpid()] * run.env.world_size
    if run.env.world_size > 1:
        dist.all_gather_object(pids, os.getpid(), group=run.env.ckpt_group)
    shape = {}
    if run.cfg.parallel.replicas > 1:  # HSDP: how many replica groups of how many ranks train now
        groups, size = parallel.hsdp_shape(run.cfg.parallel.replicas, run.env.world_size)
        shape = {"replica_groups": groups, "group_size": size}
    parts.events.emit("start", world_size=run.env.world_size, pids=pids, **shape)
    parts.start()
    # A model built for a restore holds no values yet: each file is checked as it is copied.
    run.restored = ckpt.restore(blank=run.deferred_init is not None)
    if run.restored is None:
        run.initialize()
        run.load_pretrained()
    parts.restored(run.restored, progress.step)
    for cb in callbacks:
        cb.on_train_start(run)
    stop, loss = _loop(run, parts.anomalies, callbacks)

    # The final (or emergency) checkpoint, committed; the uploads; the commit marker.
    with parts.draining():
        parts.anomalies.settle()
        preemption.finish(
            progress.step,
            save=stop is None or stop.save,
            reason="emergency" if stop and stop.exit_code else "stop" if stop else "final",
            wait_for_upload=stop is None or stop.exit_code == EXIT_OK,
            release=False,
            drain_timeout_s=run.cfg.resilience.watchdog.drain_timeout_s,
        )
    run.data.close()
    result = {**summarize(run, stop, loss.item(), time.monotonic() - t_start), **parts.summary()}
    if run.env.is_rank0:
        write_summary(Path(run.cfg.run_dir), result)
    parts.events.emit("exit", code=result["exit_code"], reason=result["stop_reason"], step=progress.step)
    for cb in callbacks:
        cb.on_train_end(run, result)
    if preemption.drained:  # an upload still in a collective would make the teardown hang
        distributed.shutdown()
    preemption.release_node()  # the last thing a preempted node does
    return result


def _loop(run: Run, anomalies: AnomalyGuard, callbacks: list[Callback]) -> tuple[StopRequest | None, torch.Tensor]:
    """Train until train.steps or a stop request: the request and the last loss."""
    cfg, progress, ckpt, model, optimizer = run.cfg, run.progress, run.ckpt, run.model, run.optimizer
    loss = torch.tensor(math.nan)
    while progress.step < cfg.train.steps:
        if stop := first_stop(callbacks, run):
            return stop, loss
        t0, step, busy, snap = time.monotonic(), progress.step + 1, ckpt.save_in_flight, ckpt.snapshot_in_flight
        if anomalies.skips(step):  # a rollback decided this batch is poison
            _advance(run)
            continue
        for cb in callbacks:
            cb.on_step_start(run, step)
        batch = run.data.get(progress.samples_seen, step)
        loss = run.loss_fn(model, batch.data)
        for cb in callbacks:
            loss = cb.on_loss(run, step, loss)
        loss.backward()
        # The norm is computed (not clipped) when clipping is off: the anomaly check uses it.
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or math.inf)
        verdict = anomalies.judge(step, loss, grad_norm)  # collective; stays on the device
        if verdict.rollback and anomalies.rollback(step):
            continue
        ckpt.wait_for_staging()  # the last save's copy must be done before the weights change
        anomalies.apply(verdict)  # the optimizer step, unless the step is anomalous
        optimizer.zero_grad(set_to_none=True)
        _advance(run)
        saving, snapshotting = busy or ckpt.save_in_flight, snap or ckpt.snapshot_in_flight
        info = StepInfo(
            progress.step, loss.detach(), progress.samples_seen, time.monotonic() - t0, saving, snapshotting
        )
        for cb in callbacks:
            cb.on_step_end(run, info)
    return None, loss


def _advance(run: Run) -> None:
    """One step consumed: its batch, its place in the LR schedule, its step number,
    whether or not its update was applied."""
    run.scheduler.step()
    run.progress.step += 1
    run.progress.samples_seen += run.cfg.train.global_batch_size


def summarize(run: Run, stop: StopRequest | None, loss: float, wall_s: float) -> dict[str, Any]:
    """The run's summary (the caller writes it to <run_dir>/summary.json on rank 0).
    With ``train.state_hash``, collective: it gathers the unsharded state onto rank 0."""
    state_hash = None
    if run.cfg.train.state_hash:
        state = full_state(run.model, run.optimizer)
        state_hash = state_sha256(state) if state is not None else None
    ckpt = run.ckpt
    return {
        "status": "stopped" if stop else "completed",
        "stop_reason": stop.reason if stop else None,
        "exit_code": stop.exit_code if stop else EXIT_OK,
        "run_id": run.cfg.run_id,
        "config_hash": run.cfg.config_hash(),
        "step": run.progress.step,
        "samples_seen": run.progress.samples_seen,
        "world_size": run.env.world_size,
        "device": run.env.device.type,
        "parallel": run.cfg.parallel.mode,
        "loss": loss,
        "state_sha256": state_hash,
        "resumed_from": run.restored.to_json() if run.restored else None,
        "committed": [{"step": s, "path": str(ckpt.local.step_dir(s))} for s in ckpt.committed],
        "durable": [{"step": s, "uri": f"{ckpt.stores['primary'].uri}/step-{s}"} for s in ckpt.durable_steps],
        "checkpoint_blocked_s": round(ckpt.stats.blocked_s, 4),
        "wall_s": round(wall_s, 2),
    }


def write_summary(run_dir: Path, result: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / ".summary.json.tmp"
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, run_dir / "summary.json")
