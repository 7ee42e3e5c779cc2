"""Background upload of committed checkpoints to the durable object tier.

One thread per rank, on its own gloo group, so uploads never block training or the next
local save. For each checkpoint:

1. rank 0 picks the newest committed step still queued (older queued ones are skipped:
   a durable tier only needs the newest) and tells the other ranks;
2. the files are split over ranks by size; each rank uploads its share in parallel (the
   files of earlier checkpoints an incremental one references go under their own
   checkpoint's prefix, skipped where the bucket holds them as committed there or as
   this process uploaded them: a size alone does not tell a step's files from those of
   another save of the same step);
3. rank 0 gathers the results, lists the step's objects and checks every file is there
   with its size, and only then uploads ``manifest.json``, last, once its generation
   is still the newest (:mod:`~ftfleet.trainer.resilience.fencing`): an interrupted
   upload leaves objects without a manifest, which no restore counts;
4. rank 0 applies retention to the bucket and broadcasts the outcome.

The writes made after a check of the run lease (the manifest, retention's deletions) go
through the store's bounded view (:data:`FENCED_REQUEST_S`, one attempt per request, the
check made again before each attempt and each step deleted), so that each lands within
the lease's write margin of its check or not at all: the store's own retries could land
a manifest minutes after the lease was lost.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ftfleet.contract import MANIFEST_NAME, parse_step_dir, step_dir_name
from ftfleet.trainer.checkpoint import retention
from ftfleet.trainer.checkpoint.manifest import FileEntry, Manifest, assign_files, object_key
from ftfleet.trainer.checkpoint.tiers import LocalTier, ObjectStore
from ftfleet.trainer.resilience import fencing

log = logging.getLogger("ftfleet.ckpt")

#: How long one request of a write made after a lease check may take (a GCS manifest is
#: two requests: the generation read, then the conditional write). Within the lease's
#: WRITE_MARGIN_S (trainer/resilience/fencing/lease.py) with room for the connection.
FENCED_REQUEST_S = 6.0
#: Attempts at a manifest's upload, each after its own check of the lease.
MANIFEST_ATTEMPTS = 3


class ReferenceClash(RuntimeError):
    """A referenced file the bucket holds as part of another save of its step."""


class Uploader:
    def __init__(
        self,
        store: ObjectStore,
        local: LocalTier,
        comm: Any,
        *,
        workers: int,
        schedule: Sequence[retention.Rule] | None = None,
        pinned: Iterable[int] = (),
        on_durable: Callable[[int], None] | None = None,
    ):
        self.store = store
        self.local = local
        self.comm = comm
        self.workers = workers
        #: The bucket's retention (``checkpoint.retention``), applied after each upload.
        self.schedule = retention.parse_schedule(retention.DEFAULT_SCHEDULE) if schedule is None else tuple(schedule)
        self.pinned = list(pinned)
        self.on_durable = on_durable
        #: The generation whose checkpoints these are: checked before each manifest.
        self.fence = fencing.current()
        self.durable_steps: list[int] = []
        #: The same bucket, one bounded attempt per request: for writes after a lease check.
        self.fenced_store = store.bounded(FENCED_REQUEST_S)
        #: The bucket's manifests of referenced steps, read during the current upload.
        self._manifests: dict[int | None, Manifest | None] = {}
        #: Object key -> entry, of the referenced files this rank uploaded.
        self._sent: dict[str, FileEntry] = {}
        self._items: collections.deque[Manifest] = collections.deque()
        self._cv = threading.Condition()
        self._current: int | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="ftfleet-ckpt-upload", daemon=True)
        self._thread.start()

    # --- called from the training side --------------------------------------
    def submit(self, manifest: Manifest) -> None:
        """Queue a committed checkpoint. Every rank submits the same steps in order."""
        with self._cv:
            self._items.append(manifest)
            self._cv.notify_all()

    def pending_steps(self) -> set[int]:
        """Steps queued or being uploaded: local retention must not delete them."""
        with self._cv:
            steps = {m.step for m in self._items}
            if self._current is not None:
                steps.add(self._current)
            return steps

    def idle(self) -> bool:
        with self._cv:
            return not self._items and self._current is None

    def close(self, wait: bool = True, timeout: float | None = None) -> bool:
        """Stop after the queue is drained (``wait``), or at once. Returns whether the
        queue was drained. Every rank must call it with the same ``wait``."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        if wait:
            self._thread.join(timeout)
        return self.idle()

    # --- the upload thread --------------------------------------------------
    def _next(self) -> Manifest | None:
        with self._cv:
            while not self._items and not self._closing:
                self._cv.wait()
            if not self._items:
                return None
            item = self._items.popleft()
            self._current = item.step
            return item

    def _run(self) -> None:
        while True:
            item = self._next()
            if self.comm.rank == 0:
                with self._cv:
                    while item is not None and self._items:
                        log.info("upload: skipping step-%d, step-%d is newer", item.step, self._items[-1].step)
                        item = self._items.popleft()
                        self._current = item.step
            chosen = self.comm.broadcast(item.step if item is not None else None)
            if chosen is None:  # rank 0 is closing with nothing left to upload
                return
            # The other ranks submit the same commits, perhaps a moment later: catch up.
            while item is None or item.step < chosen:
                item = self._next()
                if item is None:
                    log.error("upload: closing before step-%d was submitted here", chosen)
                    return
            try:
                self._upload(item)
            except Exception:  # noqa: BLE001 - never kill the thread; the next commit retries
                log.exception("upload of step-%d failed", item.step)
            finally:
                with self._cv:
                    self._current = None

    def _present(self, step: int, paths: Iterable[str]) -> dict[str, int]:
        """Object key -> size, for the objects under the prefixes of ``paths`` (files
        :meth:`Manifest.every_file` lists for ``step``)."""
        out: dict[str, int] = {}
        for prefix in sorted({object_key(step, p).rpartition("/")[0] for p in paths}):
            out.update(self.store.list(f"{prefix}/"))
        return out

    def _held(self, step: int, path: str, entry: FileEntry, present: dict[str, int]) -> bool:
        """Whether the bucket holds the referenced file ``path`` of ``step``'s manifest
        with the bytes of ``entry``: it is there with its size (``present``), and this
        process uploaded it so or the manifest of its own checkpoint in the bucket lists
        it so. ReferenceClash where that manifest lists other bytes under the name (the
        bucket's step is another save of it: not overwritten)."""
        key = object_key(step, path)
        there = present.get(key) == entry.size
        if not there:
            self._sent.pop(key, None)  # gone since (a sweep, an expiry): send it again
        elif self._sent.get(key) == entry:
            return True
        owner, name = key.split("/", 1)
        committed = self._bucket_manifest(parse_step_dir(owner))
        listed = None if committed is None else committed.files.get(name)
        if listed not in (None, entry):
            raise ReferenceClash(f"{key}: the bucket's step lists other bytes under that name; not overwritten")
        return there and listed == entry

    def _bucket_manifest(self, step: int | None) -> Manifest | None:
        """The bucket's manifest of ``step``, read once per upload (None: none there, or
        none that reads)."""
        if step not in self._manifests:
            try:
                self._manifests[step] = self.store.read_manifest(step) if step is not None else None
            except Exception:  # noqa: BLE001 - not readable: no claim either way
                self._manifests[step] = None
        return self._manifests[step]

    def _put_manifest(self, manifest: Manifest) -> None:
        """Upload ``manifest.json`` last, each attempt right after a check of the lease and
        bounded by :data:`FENCED_REQUEST_S`; the last attempt's error is raised."""
        key = f"{step_dir_name(manifest.step)}/{MANIFEST_NAME}"
        for attempt in range(1, MANIFEST_ATTEMPTS + 1):
            fencing.check(self.fence, f"durable copy of step-{manifest.step}")
            try:
                self.fenced_store.put_bytes(key, manifest.to_json().encode())
                return
            except Exception as exc:  # noqa: BLE001 - checked again, then tried again
                if attempt == MANIFEST_ATTEMPTS:
                    raise
                log.warning("step-%d: manifest upload attempt %d failed (%s); again", manifest.step, attempt, exc)

    def _upload(self, manifest: Manifest) -> None:
        t0 = time.monotonic()
        step = manifest.step
        src = self.local.step_dir(step)
        listed = manifest.every_file()
        self._manifests.clear()
        mine = assign_files({n: e.size for n, e in listed.items()}, self.comm.world_size)[self.comm.rank]
        error = None
        try:
            present = self._present(step, [n for n in mine if n.startswith("../")])
            todo = [n for n in mine if not n.startswith("../") or not self._held(step, n, listed[n], present)]

            def send(name: str) -> None:
                self.store.upload_file(src / name, object_key(step, name))
                self._sent[object_key(step, name)] = listed[name]

            with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(todo) or 1))) as pool:
                list(pool.map(send, todo))
        except Exception as exc:  # noqa: BLE001 - reported to rank 0
            error = f"rank {self.comm.rank}: {type(exc).__name__}: {exc}"
        gathered = self.comm.gather(error)

        outcome: str | None = None
        if self.comm.rank == 0:
            problems = [e for e in gathered if e]
            if not problems:
                try:
                    present = self._present(step, listed)
                    for name, entry in listed.items():
                        got = present.get(object_key(step, name))
                        if got != entry.size:
                            problems.append(f"{name}: {got} bytes in the bucket, expected {entry.size}")
                    if not problems:
                        self._put_manifest(manifest)
                except Exception as exc:  # noqa: BLE001
                    problems.append(f"{type(exc).__name__}: {exc}")
            outcome = "; ".join(problems)
        outcome = self.comm.broadcast(outcome)
        if outcome:
            log.error("step-%d is not durable in %s: %s", step, self.store.uri, outcome)
            return
        self.durable_steps.append(step)
        if self.comm.rank == 0:
            log.info(
                "step-%d durable in %s (%.1f MB in %.2f s)",
                step,
                self.store.uri,
                manifest.total_bytes / 1e6,
                time.monotonic() - t0,
            )
            held = fencing.problem_of(self.fence)  # deleting is writing: one generation, the lease's holder
            if held is None:
                retention.prune_by_schedule(
                    self.store,  # read with the store's retries: a manifest missed is a step unprotected
                    self.schedule,
                    self.pinned,
                    protected=[step],
                    guard=lambda: fencing.problem_of(self.fence),
                    writer=self.fenced_store,
                )
            else:
                log.warning("retention of %s skipped: %s", self.store.uri, held)
        if self.on_durable is not None:
            self.on_durable(step)
