"""How a rank reads its share of each global batch.

Position in the data is one number, the count of global samples consumed. Step ``s``
of a run with global batch ``B`` consumes global positions ``[s*B, (s+1)*B)``, rank ``r``
of ``W`` taking the ``r``-th contiguous slice of ``B/W``; position ``i`` reads the
dataset index :class:`~ftfleet.trainer.data.order.GlobalOrder` gives it. So a checkpoint
written by N ranks resumes on M ranks at exactly the next sample, and nothing in the
data path draws from the training RNGs: a map-style dataset's samples are fetched under
RNGs seeded per sample (:mod:`~ftfleet.trainer.data.seeded`), so random augmentation is
a function of the sample, the same at any worker count and world size.

Reading is a :class:`torchdata.stateful_dataloader.StatefulDataLoader` with worker
processes, over a batch sampler that yields this rank's positions from a start. Its
state (sampler position, worker and dataset states) goes into the checkpoint per rank
(``data_rank<r>``), as one opaque value: ``torch.save`` bytes, read back with
``weights_only=True``. Its nested shape varies with the worker count and the dataset,
and DCP loads only the keys of the state it loads into, which a reader that has not
read yet cannot know. A map-style dataset resumes from that state when the world size and
worker count are unchanged, and otherwise from the sample count alone, which is
enough. An IterableDataset has no global positions: its state is the only record of
where it stood, so it resumes only on the same world size and worker count.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import multiprocessing
import os
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from ftfleet.errors import ConfigError, UserError, interrupt_in
from ftfleet.trainer.data.order import GlobalOrder
from ftfleet.trainer.data.seeded import by_position
from ftfleet.trainer.data.workers import (
    drop_inherited_sockets,
    exit_with,
    in_own_group,
    resolve_start_method,
    start_worker_server,
    starts_in_own_group,
)

log = logging.getLogger("ftfleet.data")

STATE_VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    data: Any
    """What the collate function made of this rank's samples, on the training device."""
    sample_ids: range
    """The global positions behind it (empty for an IterableDataset)."""


class RankBatches:
    """The StatefulDataLoader's batch sampler: this rank's dataset indices, one global
    batch after another, from ``next_position`` on. Its state is that position, which
    the loader snapshots right after producing each batch's indices."""

    def __init__(self, order: GlobalOrder, global_batch_size: int, rank: int, world_size: int):
        self.order = order
        self.global_batch_size = global_batch_size
        self.micro_batch_size = global_batch_size // world_size
        self.rank = rank
        self.next_position = 0

    def positions(self, samples_seen: int) -> range:
        start = samples_seen + self.rank * self.micro_batch_size
        return range(start, start + self.micro_batch_size)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        """Each step's ``(epoch, index)`` keys (:func:`~ftfleet.trainer.data.seeded.by_position`)."""
        while True:
            ids = self.positions(self.next_position)
            self.next_position += self.global_batch_size
            positions = np.arange(ids.start, ids.stop)
            epochs = positions // self.order.length if self.order.length else np.zeros_like(positions)
            yield list(zip(epochs.tolist(), self.order.indices(positions).tolist(), strict=True))

    def state_dict(self) -> dict[str, int]:
        return {"next_position": self.next_position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_position = int(state["next_position"])


class GlobalBatches:
    """This rank's share of each global batch, addressed by the global sample count:
    ``get(samples_seen, step)`` returns the batch of the step that starts there, from
    wherever the reader stood before (a restore, a rollback or a skipped batch moves
    the position; the reader follows)."""

    def __init__(
        self,
        dataset: Any,
        global_batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device,
        *,
        seed: int = 0,
        shuffle: bool = True,
        num_workers: int = 0,
        start_method: str = "auto",
        collate_fn: Any = None,
        trace_dir: Path | None = None,
    ):
        if global_batch_size % world_size:
            raise ConfigError(
                f"train.global_batch_size={global_batch_size} is not divisible by the world "
                f"size {world_size}: choose a multiple of {world_size}"
            )
        self.dataset = dataset
        self.iterable = isinstance(dataset, IterableDataset)
        self.global_batch_size = global_batch_size
        self.micro_batch_size = global_batch_size // world_size
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.seed = seed
        self.num_workers = num_workers
        self.start_method = resolve_start_method(start_method)
        self.collate_fn = collate_fn
        if num_workers:
            start_worker_server(start_method, [type(dataset).__module__])
        length = None
        if not self.iterable and hasattr(dataset, "__len__"):
            length = len(dataset)
            if length == 0:
                raise ConfigError("data.factory returned an empty dataset: check the data section")
        self.order = GlobalOrder(length, seed, shuffle)
        self.sampler: RankBatches | None = None
        self.loader: StatefulDataLoader | None = None
        self._it: Iterator[Any] | None = None
        self._next: int | None = None  # the position the open iterator stands at
        self._loaded: dict[str, Any] | None = None  # state restored, not yet used
        self._unusable: str | None = None  # why a restored state cannot be used
        self._trace = None
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
            # One file per process lifetime and rank; lines are "step first-last".
            self._trace = open(trace_dir / f"rank{rank}-pid{os.getpid()}.txt", "a", buffering=1)

    # -- reading ---------------------------------------------------------------

    def sample_ids(self, samples_seen: int) -> range:
        if self.iterable:
            return range(0)
        start = samples_seen + self.rank * self.micro_batch_size
        return range(start, start + self.micro_batch_size)

    def get(self, samples_seen: int, step: int) -> Batch:
        """The batch of the step that starts after ``samples_seen`` global samples."""
        if self._it is not None and self.iterable and self._next is not None and samples_seen > self._next:
            # Batches skipped by the loop (a poisoned batch): an iterable moves past them.
            for _ in range((samples_seen - self._next) // self.global_batch_size):
                next(self._it)
            self._next = samples_seen
        if self._it is None or self._next != samples_seen:
            self._open(samples_seen)
        data = next(self._it)
        self._next = samples_seen + self.global_batch_size
        ids = self.sample_ids(samples_seen)
        if self._trace is not None and ids:
            self._trace.write(f"{step} {ids.start} {ids.stop - 1}\n")
        return Batch(_to_device(data, self.device), ids)

    def _new_loader(self) -> StatefulDataLoader:
        # The loader's own generator: iter() would otherwise draw the workers' base seed
        # from the global torch RNG, which the checkpoint restores at another moment.
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.rank)
        common = {
            "num_workers": self.num_workers,
            "pin_memory": self.device.type == "cuda",
            "generator": generator,
            "collate_fn": self.collate_fn,
        }
        if self.num_workers:
            common["multiprocessing_context"] = self.start_method
            if self.start_method == "fork":
                common["worker_init_fn"] = in_own_group(drop_inherited_sockets)
            else:
                common["worker_init_fn"] = in_own_group(functools.partial(exit_with, os.getpid()))
        if self.iterable:
            self.sampler = None
            return StatefulDataLoader(self.dataset, batch_size=self.micro_batch_size, **common)
        self.sampler = RankBatches(self.order, self.global_batch_size, self.rank, self.world_size)
        return StatefulDataLoader(by_position(self.dataset, self.seed), batch_sampler=self.sampler, **common)

    def _open(self, samples_seen: int) -> None:
        """Position the reader at ``samples_seen``: from the restored loader state when
        it stands there, else (map-style) from the position alone."""
        self._it = None  # shuts down the previous iterator's workers
        self.loader = self._new_loader()
        loaded, self._loaded = self._loaded, None
        skip = 0
        if loaded is not None and self.iterable and samples_seen > loaded["next"]:
            skip = (samples_seen - loaded["next"]) // self.global_batch_size  # skipped after a rollback
        if loaded is not None and loaded["next"] + skip * self.global_batch_size == samples_seen:
            self.loader.load_state_dict(loaded["loader"])
        elif self.iterable and samples_seen > 0:
            raise UserError(
                f"data: cannot resume an IterableDataset at sample {samples_seen}: "
                f"{self._unusable or 'no reader state was restored'}; resume with the world size and "
                "data.num_workers that wrote the checkpoint, or make the dataset map-style"
            )
        elif self.sampler is not None:
            self.sampler.next_position = samples_seen
        try:
            self._it = iter(self.loader)
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            if self.start_method == "fork" or "pickle" not in str(exc):
                raise
            raise ConfigError(
                f"data: the loader's workers start by data.start_method={self.start_method}, which sends them the "
                f"dataset by pickle, and it cannot be pickled ({exc}): make the dataset (and its collate_fn) "
                "picklable, or set data.start_method=fork"
            ) from None
        for _ in range(skip):
            next(self._it)

    # -- checkpoint --------------------------------------------------------------

    def state_dict(self) -> dict[str, bytes]:
        buf = io.BytesIO()
        torch.save(self._state(), buf)
        return {"reader": buf.getvalue()}

    def load_state_dict(self, packed: dict[str, bytes]) -> None:
        blob = packed.get("reader", b"")
        self._restore(torch.load(io.BytesIO(blob), weights_only=True) if blob else None)

    def _state(self) -> dict[str, Any]:
        if self._it is None:  # nothing read since a restore: keep what was restored
            return self._loaded if self._loaded is not None else {}
        return {
            "version": STATE_VERSION,
            "world_size": self.world_size,
            "rank": self.rank,
            "global_batch_size": self.global_batch_size,
            "num_workers": self.num_workers,
            "next": self._next,
            "loader": self.loader.state_dict(),
        }

    def _restore(self, state: dict[str, Any] | None) -> None:
        self._it, self._next, self._loaded, self._unusable = None, None, None, None
        if not state:
            self._unusable = "the checkpoint holds no reader state for this rank"
            return
        mine = (STATE_VERSION, self.world_size, self.rank, self.global_batch_size, self.num_workers)
        theirs = tuple(state.get(k) for k in ("version", "world_size", "rank", "global_batch_size", "num_workers"))
        if theirs != mine:
            self._unusable = (
                f"it was written by rank {theirs[2]} of {theirs[1]} with {theirs[4]} workers, "
                f"this is rank {self.rank} of {self.world_size} with {self.num_workers}"
            )
            if not self.iterable:
                log.info("data: %s; continuing from the sample count", self._unusable)
            return
        self._loaded = state

    def abort(self) -> None:
        """After a failure: kill the loader's worker processes, then close. An orderly
        shutdown joins each worker for up to 5 s, and an in-process restart drops the
        failed attempt's loader on its critical path; the batches are thrown away
        anyway."""
        from torch.utils.data._utils import signal_handling

        iterators = {id(obj): obj for obj in (self._it, getattr(self.loader, "_iterator", None)) if obj is not None}
        for key, obj in iterators.items():
            workers = [w for w in getattr(obj, "_workers", None) or () if w.is_alive()]
            if not workers:
                continue
            try:
                # Unwatched first: the loader's SIGCHLD handler would raise "worker killed"
                # over the failure being handled.
                signal_handling._remove_worker_pids(key)
            except ValueError:  # not watched (any more)
                pass
            # ... and marked so: its shutdown unwatches them again in a `finally`, and the
            # ValueError it raised there replaced whatever was in flight (an in-process
            # restart's RankShouldRestart, delivered while the workers were joined, was
            # caught below as that ValueError: the wrapper then gave up on the process).
            obj._worker_pids_set = False
            for worker in workers:
                worker.kill()
        try:
            self.close()
        except Exception as exc:  # noqa: BLE001 - the failure being handled is the one to report
            interrupt = interrupt_in(exc)
            if interrupt is not None:
                raise interrupt from None
            log.warning("data loader: closing after a failure: %s: %s", type(exc).__name__, exc)

    def close(self) -> None:
        """Stop the loader's worker processes now. The loader keeps its iterator (for
        its state dict), so dropping ours would leave them running: a SIGTERM to the
        process group (torchrun stopping the workers) would then kill a worker while this
        process still runs, and the loader's SIGCHLD handler would raise."""
        it, self._it = self._it, None
        for obj in (it, getattr(self.loader, "_iterator", None)):
            shutdown = getattr(obj, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
        if self._trace is not None:
            self._trace.close()


def adopt(loader: torch.utils.data.DataLoader, seed: int) -> list[str]:
    """Make a loop's own ``loader`` (registered in an AppState) resume exactly and
    survive a stop; returns what was changed, for the log.

    * Without a ``generator`` of its own, every ``iter(loader)`` draws its workers' base
      seed from torch's global RNG: after a restore, from the RNG state the restore just
      set, which shifts everything the loop draws after it. It gets one, seeded ``seed``.
    * Its workers (if any) start in process groups of their own
      (:func:`~ftfleet.trainer.data.workers.in_own_group`, around its own
      ``worker_init_fn``), and a forkserver it uses is started so (if it is not running
      yet): a signal to the rank's group (torchrun stopping it) no longer kills them.
    """
    changed = []
    if loader.generator is None:
        loader.generator = torch.Generator().manual_seed(seed)
        changed.append("a generator of its own")
    if loader.num_workers:
        if not starts_in_own_group(loader.worker_init_fn):
            loader.worker_init_fn = in_own_group(loader.worker_init_fn)
            changed.append("workers in process groups of their own")
        context = loader.multiprocessing_context
        # Without one, the process's start method; unset, the platform's default (the
        # first listed), read without fixing it (a later set_start_method must work).
        method = (
            context.get_start_method()
            if context is not None
            else multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
        )
        if method == "forkserver":
            start_worker_server("forkserver", [type(loader.dataset).__module__])
    return changed


def _to_device(data: Any, device: torch.device) -> Any:
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, Mapping):
        return {k: _to_device(v, device) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_to_device(v, device) for v in data)
    return data
