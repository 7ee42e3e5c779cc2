"""CheckpointManager: what a training loop calls.

    state = AppState(model, optimizer, scheduler)      # + extras / per_rank Statefuls
    ckpt = CheckpointManager("/fsx/ckpt/run", state, run_id="run")   # or a CheckpointConfig
    restored = ckpt.restore()              # loads the newest valid checkpoint, or None
    for step in ...:
        loss = forward_backward(...)
        ckpt.wait_for_staging()            # before the weights change
        optimizer.step()
        if step == next_save:              # the loop's schedule (trainer/resilience)
            ckpt.save(step)                # returns once the state is being copied
    ckpt.save(step, blocking=True)         # the final (or emergency) save: committed
    ckpt.close()                           # waits for the last upload

A save is: DCP ``async_save`` into ``<dir>/step-N/`` on a dedicated gloo group, with a
stager that copies the state into buffers kept between saves (pinned memory and
non-blocking copies on GPU, on a side stream that first waits for the training stream:
:mod:`ftfleet.trainer.checkpoint.staging`); training is blocked only until that copy is
done, and not even that long when :meth:`wait_for_staging` is called just before the
optimizer step.
DCP's writer threads take each shard's CRC32C as they write it
(:mod:`ftfleet.trainer.checkpoint.writer`). A background thread then runs the commit protocol
(:mod:`ftfleet.trainer.checkpoint.commit`), retention, and hands the checkpoint to the uploader
(:mod:`ftfleet.trainer.checkpoint.upload`).
At most one save is in flight: the next one waits for the previous commit.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import AsyncStager, StagingOptions

from ftfleet.contract import memory_dir
from ftfleet.errors import ConfigError, interrupt_in
from ftfleet.trainer.checkpoint import retention
from ftfleet.trainer.checkpoint.comm import DistComm, LocalComm
from ftfleet.trainer.checkpoint.commit import CommitError, Notes, commit_step, storage_records
from ftfleet.trainer.checkpoint.incremental import Base, IncrementalWriter
from ftfleet.trainer.checkpoint.manifest import Manifest
from ftfleet.trainer.checkpoint.memory import MemoryTier, Ring
from ftfleet.trainer.checkpoint.memory.snapshots import Snapshots, wait_in_slices
from ftfleet.trainer.checkpoint.reader import CorruptFile
from ftfleet.trainer.checkpoint.restore import (
    Identity,
    Restored,
    find_and_prepare,
    list_candidates,
    refuse_over_history,
)
from ftfleet.trainer.checkpoint.safe_load import CheckpointMismatch, load_into, read_metadata_file
from ftfleet.trainer.checkpoint.staging import OrderedStager
from ftfleet.trainer.checkpoint.state import AppState, borrowed_buffers, optimizer_layout
from ftfleet.trainer.checkpoint.tiers import LocalTier, ObjectStore, open_store
from ftfleet.trainer.checkpoint.upload import Uploader
from ftfleet.trainer.config import CheckpointConfig
from ftfleet.trainer.resilience import fencing

log = logging.getLogger("ftfleet.ckpt")


@dataclasses.dataclass
class SaveStats:
    saves: int = 0
    blocked_s: float = 0.0
    """Time the training thread spent in save() and wait_for_staging()."""
    last_blocked_s: float = 0.0
    last_commit_s: float = 0.0
    """From save() to the manifest being written, for the last commit."""
    last_async: bool = False
    """Whether the last save started wrote in the background (dcp.async_save)."""


class _Prestaged(AsyncStager):
    """An async stager whose staging is done already: ``dcp.async_save`` writes the state
    dict ``source`` resolves to (a snapshot's, :meth:`Snapshots.durable_source`) and
    ignores the one it was given."""

    _synchronize_after_execute = False

    def __init__(self, source: Future[Any]) -> None:
        self.source = source

    def stage(self, state_dict: Any) -> Future[Any]:
        return self.source

    def synchronize_staging(self) -> None:
        pass


def staging_options(cuda: bool) -> StagingOptions:
    """GPU: pinned buffers and non-blocking device-to-host copies on a side stream. CPU:
    those options fail ("Non-blocking copy requires ... accelerator") and pinning means
    nothing, so plain buffers and blocking copies, still in a background thread. Shared
    memory only serves DCP's process mode; saves here run in a thread."""
    return StagingOptions(
        use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda
    )


class CheckpointManager:
    """``cfg``: a :class:`~ftfleet.trainer.config.CheckpointConfig`, or just the fast
    tier's directory. ``app_state``: the :class:`~ftfleet.trainer.checkpoint.state.AppState`
    to save and load. ``run_id`` and ``config_hash`` go into every manifest; a checkpoint
    of another run or config is refused on restore (``checkpoint.force_load``).

    Under an initialised ``torch.distributed``, the manager needs its own gloo groups
    (DCP's background save and the upload run collectives while training runs its own):
    without ``ckpt_group``/``upload_group`` it creates them, which is collective, so
    every rank builds its manager at the same point of the program."""

    def __init__(
        self,
        cfg: CheckpointConfig | str | os.PathLike[str],
        app_state: AppState,
        *,
        run_id: str = "run",
        config_hash: str = "",
        ckpt_group: Any = None,
        upload_group: Any = None,
        stores: dict[str, ObjectStore] | None = None,
    ):
        if not isinstance(cfg, CheckpointConfig):
            cfg = CheckpointConfig(dir=os.fspath(cfg))
        if not cfg.dir:
            raise ConfigError("checkpoint.dir is empty: name the fast tier's directory (every rank must see it)")
        self.cfg = cfg
        self.app_state = app_state
        self.identity = Identity(run_id, config_hash)
        if stores is None:
            stores = {}
            for name, uri in (("primary", cfg.uri), ("replica", cfg.replica_uri)):
                if uri:
                    stores[name] = open_store(
                        uri,
                        endpoint_url=cfg.s3_endpoint_url or None,
                        retries=cfg.retries,
                        chunk_mb=cfg.multipart_chunk_mb,
                        workers=cfg.transfer_workers,
                    )
        self.stores = stores
        uploads = cfg.enabled and cfg.upload == "trainer" and "primary" in stores
        if dist.is_available() and dist.is_initialized():
            timeout = datetime.timedelta(seconds=cfg.timeout_s)
            if ckpt_group is None:
                ckpt_group = dist.new_group(backend="gloo", timeout=timeout)
            if upload_group is None and uploads:
                upload_group = dist.new_group(backend="gloo", timeout=timeout)
        self.ckpt_group = ckpt_group
        self.comm = DistComm(ckpt_group) if ckpt_group is not None else LocalComm()
        #: The in-memory snapshot tier (checkpoint.memory), on a gloo group of its own:
        #: its transfers run on the training thread while a save may use ckpt_group.
        self.snapshots: Snapshots | None = None
        if cfg.memory:
            bounded = datetime.timedelta(seconds=cfg.memory_timeout_s)
            group = dist.new_group(backend="gloo", timeout=bounded) if dist.is_initialized() else None
            comm = DistComm(group) if group is not None else LocalComm()
            per_node = cfg.node_size(comm.world_size)
            if comm.world_size % per_node:
                raise ConfigError(
                    f"checkpoint.ranks_per_node={per_node} does not divide the world size {comm.world_size}: "
                    "use 0 (torchrun's LOCAL_WORLD_SIZE) or a divisor"
                )
            ring = Ring(comm.rank, comm.world_size, per_node)
            tier = MemoryTier(memory_dir(cfg.memory_root, run_id), ring, keep=cfg.memory_keep)
            self.snapshots = Snapshots(
                tier, app_state, self.identity, comm, group, cfg.memory_peer_every, cfg.memory_timeout_s
            )
        self.local = LocalTier(cfg.dir)
        #: The generation whose checkpoints these are (trainer/resilience/fencing).
        self.fence = fencing.current()
        self.stats = SaveStats()
        self.committed: list[int] = []
        self.on_commit: list[Callable[[Manifest], None]] = []
        self._stager = OrderedStager(staging_options(torch.cuda.is_available())) if cfg.async_save else None
        self._commit_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftfleet-ckpt-commit")
        self._inflight: Future[Manifest] | None = None
        #: The step of the newest save started (committed or still in flight).
        self.last_saved_step: int | None = None
        #: The step the state was last loaded from (restore or rollback): it is committed.
        self.restored_step: int | None = None
        #: The newest step on a disk tier when the restore looked (listed, not verified;
        #: None: nothing, or not looked): what a restore from memory leaves durable.
        self.newest_on_disk: int | None = None
        self._staging: Future[None] | None = None
        #: What the manifest of a step to be saved records (:meth:`annotate`), and the
        #: retention policy every manifest records.
        self._notes: tuple[int, Notes] | None = None
        self.policy = retention.Policy(tuple(cfg.retention), tuple(cfg.pinned_steps))
        #: The fast tier keeps every milestone as marked only where it is the only tier.
        self._local_milestones = retention.BEST_ONLY if "primary" in stores else retention.AS_MARKED
        self._memory_write: Future[Any] | None = None  # a save written from a snapshot
        #: The newest checkpoint this process committed, as the next save's base
        #: (checkpoint.incremental); None after a load: the state came from elsewhere.
        self._base: Base | None = None
        self.uploader: Uploader | None = None
        if uploads:
            up_comm = DistComm(upload_group) if upload_group is not None else LocalComm()
            self.uploader = Uploader(
                stores["primary"],
                self.local,
                up_comm,
                workers=cfg.transfer_workers,
                schedule=retention.parse_schedule(cfg.retention),
                pinned=cfg.pinned_steps,
            )

    # --- restore -------------------------------------------------------------
    def restore(self, *, blank: bool = False) -> Restored | None:
        """Collective. Find the newest valid checkpoint (local, primary, replica), verify
        it, and load it into the app state. None when there is nothing to resume: no
        committed step in any tier. Committed steps of which none loads raise
        :class:`~ftfleet.trainer.checkpoint.restore.HistoryUnreadable` on every rank, and
        nothing is changed: a fresh start would train over the run's history.

        ``blank``: the model's tensors hold no values yet (built for a restore, the init
        deferred) and the optimizer no state: a file is then checked as it is copied
        into them (one pass over its bytes). A checkpoint found corrupt midway may leave
        some weights overwritten, so the caller must initialise them when this returns
        None (``Run.initialize``); a later checkpoint that loads overwrites them all."""
        if not self.cfg.load:
            return None
        if self.snapshots is not None and self.cfg.load_step is None:
            found = self._load_from_memory()
            if found is not None:
                return found
        found = self._load(self.cfg.load_step, blank=blank)
        if found is None and self.snapshots is not None and self.cfg.load_step is None:
            found = self._load_from_memory(any_step=True)  # nothing on disk loads
        if found is None:
            self._refuse_over_history()
            if self.comm.rank == 0:
                log.info("restore: no checkpoint in any tier; starting from step 0")
        return found

    def _refuse_over_history(self) -> None:
        """Collective. Raise ``HistoryUnreadable`` on every rank when a tier holds a
        committed step (none of which loaded): a run with history does not start over."""
        candidates = None
        if self.comm.rank == 0:
            stores = [(n, self.stores[n]) for n in ("primary", "replica") if n in self.stores]
            names, tiers = ["local", *(n for n, _ in stores)], [self.local, *(t for _, t in stores)]
            candidates = [(step, names[i], tiers[i].describe()) for step, i in list_candidates(self.local, stores)]
        candidates = self.comm.broadcast(candidates)
        if candidates:
            raise refuse_over_history(candidates)

    def _load_from_memory(self, any_step: bool = False) -> Restored | None:
        """The newest snapshot in memory, when no disk tier has a newer step (or with
        ``any_step``, whatever its step). The disk tiers are listed (rank 0), not
        verified: a newer step there is tried first, and memory is asked again, for any
        step, when nothing on disk loads."""
        newest = None
        if self.comm.rank == 0 and not any_step:
            stores = [(n, self.stores[n]) for n in ("primary", "replica") if n in self.stores]
            candidates = list_candidates(self.local, stores)
            newest = candidates[0][0] if candidates else None
        newest = self.comm.broadcast(newest)
        if not any_step:
            self.newest_on_disk = newest
        t0 = time.monotonic()
        found = self.snapshots.restore(min_step=newest)
        if found is not None:
            self._after_load(found, [], t0)
        return found

    def snapshot(self, step: int, *, blocking: bool = False) -> float:
        """Collective: snapshot the current state into memory (checkpoint.memory) as
        ``step``. Returns the seconds it blocked training (waiting for the previous
        snapshot, copying the state); the rest runs in the background
        (:attr:`snapshot_in_flight`) unless ``blocking``."""
        if self.snapshots is None:
            raise ConfigError("checkpoint.memory is off: no in-memory snapshots to take")
        t0 = time.monotonic()
        self._wait_memory_write()
        self.snapshots.take(step)
        if blocking:
            self.snapshots.wait()
        return time.monotonic() - t0

    def rollback(self) -> Restored | None:
        """Collective. Reload the newest valid checkpoint (after an anomalous step),
        whatever ``checkpoint.load`` and ``load_step`` say. None when there is none."""
        self.wait()
        return self._load(None)

    def _load(self, load_step: int | None, blank: bool = False) -> Restored | None:
        stores = [(n, self.stores[n]) for n in ("primary", "replica") if n in self.stores]
        invalid: set[tuple[int, str]] = set()
        while True:
            # Local files are checked by size here and by CRC32C as they are loaded (one
            # read per byte); a download is checked as before, then loaded the same way.
            found = find_and_prepare(
                self.comm,
                self.local,
                stores,
                self.identity,
                force=self.cfg.force_load,
                load_step=load_step,
                workers=self.cfg.transfer_workers,
                local_crc=False,
                exclude=invalid,
            )
            if found is None:
                return None
            t0 = time.monotonic()
            try:
                absent = self._load_found(found, blank)
            except CorruptFile as exc:  # raised on every rank before any state changed
                if self.comm.rank == 0:
                    log.warning("restore: step-%d in %s is invalid, skipping it: %s", found.step, found.location, exc)
                invalid.add((found.step, found.tier))
                continue
            break
        self._after_load(found, absent, t0)
        return found

    def _load_found(self, found: Restored, blank: bool = False) -> list[str]:
        # A rank beyond the writer's world size has no RNG entry to load.
        self.app_state.include_rng = self.comm.rank < found.manifest.world_size
        self.app_state.loading = True
        try:
            if not self.cfg.force_load:  # the same config: the same optimizer
                self._adopt_layout(self.local.step_dir(found.step))
            return load_into(
                {"app": self.app_state},
                self.local.step_dir(found.step),
                self.ckpt_group,
                expected=found.manifest.every_file(),
                blank=blank,
            )
        except CheckpointMismatch as exc:
            raise CheckpointMismatch(
                f"checkpoint step-{found.step} in {found.location} does not fit: {exc}; load it into the "
                "state that wrote it, or start without it (checkpoint.load=false)"
            ) from None
        finally:
            self.app_state.include_rng = True
            self.app_state.loading = False

    def _adopt_layout(self, step_dir: Path) -> None:
        """Give a new optimizer the checkpoint's state layout as the load's template
        (``optimizer_layout``), instead of the zero-lr step that would make its state
        (a full optimizer step's work). Anything unexpected leaves the step
        to make it: the load itself reads and checks the metadata."""
        app = self.app_state
        if getattr(app, "optimizer", None) is None or app.optimizer.state:
            return
        try:
            metadata = read_metadata_file(step_dir / ".metadata")
            layout = optimizer_layout(metadata, app.model, app.optimizer, ("app", "optim"))
        except Exception:  # noqa: BLE001 - a shortcut only; the load reports what is wrong
            return
        if layout is not None:
            app.adopt_optimizer_state(layout)

    def _after_load(self, found: Restored, absent: list[str], t0: float) -> None:
        self._base = None  # the next save may be of an earlier step than the last commit
        if absent and self.comm.rank == 0:
            log.info(
                "restore: step-%d has no %s: kept as they are",
                found.step,
                ", ".join(a.removeprefix("app.") for a in absent),
            )
        if self.app_state.progress.step != found.step:
            raise CommitError(f"step-{found.step} holds the state of step {self.app_state.progress.step}")
        if self.comm.rank == 0:
            borrowed = borrowed_buffers(self.app_state.model, found.manifest.world_size, self.comm.world_size)
            if borrowed:
                log.warning("restore: step-%d %s", found.step, borrowed)
        # A step restored from memory is not on disk: a stop right after it still saves.
        self.restored_step = None if found.tier.startswith("memory") else found.step
        if self.comm.rank == 0:
            log.info(
                "restore: loaded step-%d (written by %d ranks, %d now) in %.2f s",
                found.step,
                found.manifest.world_size,
                self.comm.world_size,
                time.monotonic() - t0,
            )
        self._resubmit_if_not_durable(found)

    def _resubmit_if_not_durable(self, found: Restored) -> None:
        """A checkpoint committed locally but killed before its upload finished becomes
        durable on the next start."""
        if self.uploader is None or found.tier != "local":
            return
        missing = None
        if self.comm.rank == 0:
            try:
                # (A rollback may find a step the uploader still has queued.)
                missing = (
                    found.step not in self.uploader.pending_steps()
                    and found.step not in self.stores["primary"].committed_steps()
                )
            except Exception as exc:  # noqa: BLE001
                log.warning("cannot list %s: %s", self.stores["primary"].uri, exc)
                missing = False
        if self.comm.broadcast(missing):
            log.info("step-%d is not in the durable tier yet: uploading it", found.step)
            self.uploader.submit(found.manifest)

    # --- save ----------------------------------------------------------------
    def annotate(self, step: int, notes: Notes) -> None:
        """Record ``notes`` in the manifest of ``step`` if it is saved next (a later save
        drops them)."""
        self._notes = (step, notes)

    def save(self, step: int, *, blocking: bool = False, asynchronous: bool | None = None) -> Manifest | None:
        """Start saving the current state as ``step-N``. Collective. Non-blocking: returns
        once staging started (call :meth:`wait_for_staging` before changing the weights).
        Blocking: returns the committed manifest, or raises CommitError.
        ``asynchronous``: write in the background (dcp.async_save) or in this call
        (dcp.save; the commit still follows in the background); None: as configured
        (``async_save``). Every rank must pass the same."""
        t0 = time.monotonic()
        self.wait()
        noted = self._notes[1] if self._notes is not None and self._notes[0] == step else Notes()
        notes, self._notes = dataclasses.replace(noted, retention=self.policy), None
        step_dir = self.local.step_dir(step)
        if self.comm.rank == 0:
            # A directory of this step is debris of a crash, or of a run that rolled back
            # past it: it goes, manifest first (not by an older generation: it may be a newer one's).
            fencing.check(self.fence, f"removal of step-{step}")
            self.local.remove_step(step)
            step_dir.mkdir(parents=True, exist_ok=True)
        self.comm.barrier()
        state = {"app": self.app_state}
        use_async = self._stager is not None and (asynchronous is None or asynchronous)
        self.stats.last_async = use_async
        source = self._memory_source(step) if use_async and not blocking else None
        writer = IncrementalWriter(
            step_dir,
            single_file_per_rank=True,
            sync_files=True,
            thread_count=self.cfg.thread_count,
            overwrite=True,
            direct_io=self.cfg.direct_io,
            base=self._incremental_base(step),
            track=self.cfg.incremental,
        )
        if source is not None:
            # The snapshot's bytes are the staged copy: nothing for training to wait for.
            response = dcp.async_save(
                {}, storage_writer=writer, process_group=self.ckpt_group, async_stager=_Prestaged(source)
            )
            self._staging, written = None, response.upload_completion
            self._memory_write = written
        elif use_async:
            response = dcp.async_save(
                state, storage_writer=writer, process_group=self.ckpt_group, async_stager=self._stager
            )
            self._staging, written = response.staging_completion, response.upload_completion
        else:
            written = Future()
            try:
                written.set_result(dcp.save(state, storage_writer=writer, process_group=self.ckpt_group))
            except (Exception, CheckpointException) as exc:  # a CommitError on every rank
                # An in-process restart's request, delivered inside DCP's collective and
                # wrapped by it, goes on (a failed save in its place left the wrapper
                # without its signal: the rank gave up instead of restarting).
                if (interrupt := interrupt_in(exc, self.comm.rank)) is not None:
                    raise interrupt from None
                written.set_exception(exc)
        self._inflight = self._commit_pool.submit(self._commit, step, written, writer, t0, notes)
        self.last_saved_step = step
        self.stats.saves += 1
        self.stats.last_blocked_s = time.monotonic() - t0
        self.stats.blocked_s += self.stats.last_blocked_s
        if blocking:
            self.wait_for_staging()
            return self.wait(raise_on_error=True)
        return None

    def _incremental_base(self, step: int) -> Base | None:
        """What the save of ``step`` may reference: the previous commit, unless the chain is
        as long as ``incremental_full_every`` allows, or that checkpoint is gone or not older."""
        base = self._base
        if not self.cfg.incremental or base is None or base.chain + 1 >= self.cfg.incremental_full_every:
            return None
        if base.step >= step:
            return None
        return base if base.still_there(self.local.root) else None

    def _memory_source(self, step: int) -> Future[Any] | None:
        """The state of ``step`` for a background save, from its in-memory snapshot
        (``checkpoint.save_from_memory``); one is taken now when the newest is older."""
        if self.snapshots is None or not self.cfg.save_from_memory:
            return None
        if self.snapshots.latest_step != step:
            self._wait_memory_write()
            self.snapshots.take(step)
        return self.snapshots.durable_source(step)

    def _wait_memory_write(self) -> None:
        """Before a snapshot is staged: the save written from the previous one has read
        its bytes (a later snapshot may be staged into them)."""
        written, self._memory_write = self._memory_write, None
        if written is not None:  # interruptible: a write stuck with a dead rank holds on
            wait_in_slices(written)

    @property
    def snapshot_in_flight(self) -> bool:
        """An in-memory snapshot is being written or sent in the background."""
        return self.snapshots is not None and self.snapshots.in_flight

    @property
    def save_in_flight(self) -> bool:
        """A save is being staged, written or committed in the background."""
        return self._inflight is not None and not self._inflight.done()

    def wait_for_staging(self) -> None:
        """Block until the state of the last save is copied: after this the weights may
        change. Cheap when the copy already finished."""
        if self._staging is None:
            return
        t0 = time.monotonic()
        try:
            self._staging.result()
        finally:
            self._staging = None
            dt = time.monotonic() - t0
            self.stats.blocked_s += dt
            self.stats.last_blocked_s += dt

    def wait(self, raise_on_error: bool = False) -> Manifest | None:
        """Wait for the save in flight to be committed (or fail). Returns its manifest."""
        fut, self._inflight = self._inflight, None
        if fut is None:
            return None
        try:
            return fut.result()
        except CommitError as exc:
            if raise_on_error:
                raise
            log.error("%s", exc)
            return None

    def _commit(
        self, step: int, written: Future, writer: IncrementalWriter, t0: float, notes: Notes | None = None
    ) -> Manifest:
        metadata, error = None, None
        try:
            metadata = written.result()
        except (Exception, CheckpointException) as exc:  # DCP raises the same on every rank
            error = f"DCP save failed: {type(exc).__name__}: {exc}"
        # DCP's writes (all its writer threads) are done once ``written`` is: the
        # writer's records are complete.
        try:
            manifest = commit_step(
                self.comm,
                self.local.step_dir(step),
                step,
                metadata,
                error,
                run_id=self.identity.run_id,
                config_hash=self.identity.config_hash,
                torch_version=torch.__version__,
                streamed=writer.streamed(),
                fence=self.fence,
                notes=notes,
                references=writer.references,
                reused_bytes=writer.reused_bytes,
            )
        except CommitError:
            self._base = None  # the next save writes every tensor, whatever failed here
            raise
        self.stats.last_commit_s = time.monotonic() - t0
        self.committed.append(step)
        if writer.track:
            chain = writer.base.chain + 1 if writer.base is not None and writer.references else 0
            try:
                storage = storage_records(metadata, self.local.step_dir(step))
                self._base = Base.of(manifest, storage, writer.prints, chain)
            except Exception as exc:  # noqa: BLE001 - the next save writes every tensor
                log.warning("step-%d: the next save writes every tensor (%s)", step, exc)
                self._base = None
        if self.comm.rank == 0:
            log.info(
                "committed step-%d: %d files, %.1f MB written, %.1f MB of it referenced, %.2f s after save()",
                step,
                len(manifest.files),
                manifest.total_bytes / 1e6,
                manifest.reused_bytes / 1e6,
                self.stats.last_commit_s,
            )
            protected = {step} | (self.uploader.pending_steps() if self.uploader else set())
            retention.prune(self.local, self.cfg.keep, self.cfg.pinned_steps, protected, self._local_milestones)
        if self.uploader is not None:
            self.uploader.submit(manifest)
        for callback in self.on_commit:
            callback(manifest)
        return manifest

    # --- shutdown ------------------------------------------------------------
    @property
    def durable_steps(self) -> list[int]:
        return list(self.uploader.durable_steps) if self.uploader else []

    def close(self, wait_for_upload: bool = True, upload_deadline: float | None = None) -> bool:
        """Finish the save in flight and (``wait_for_upload``) the uploads. Collective.
        ``upload_deadline`` (epoch seconds) bounds the wait for the uploads. Returns
        whether the uploads were drained."""
        self.wait_for_staging()
        self.wait()
        if self.snapshots is not None:
            self.snapshots.close()
        drained = True
        if self.uploader is not None:
            timeout = None if upload_deadline is None else max(0.0, upload_deadline - time.time())
            drained = self.uploader.close(wait=wait_for_upload, timeout=timeout)
            if not drained and wait_for_upload:
                log.warning(
                    "uploads not finished %s: the newest checkpoint is on the fast tier only "
                    "(the next start from it uploads it)",
                    "by the deadline" if upload_deadline is not None else "at close",
                )
        self._commit_pool.shutdown(wait=True)
        if self._stager is not None:
            self._stager.close()
        return drained
