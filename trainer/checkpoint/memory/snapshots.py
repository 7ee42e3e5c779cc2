"""Taking and restoring the in-memory snapshots (:mod:`~ftfleet.trainer.checkpoint.memory`).

Taking one (collective over the snapshot group), in two parts:

* on the training thread, :meth:`Snapshots.take` serializes the header and copies the
  state's tensors straight into the snapshot's file in this node's shared memory (a
  retired snapshot's file, mapped and kept mapped: no new pages, no ``write`` after):
  all that must happen before the weights change;
* on the snapshot thread, the rest: the CRC32C and the manifest; then the file's bytes
  go to the rank holding this rank's copy on the previous node (ring) while the copy
  of the next node's arrives straight into its file beside the own, and is checked.
  One snapshot is in flight at a time: the next :meth:`~Snapshots.take` waits for it.
  (On a GPU the copy goes into a pinned buffer instead, asynchronously, and the
  thread writes the file.)

Under HSDP (:func:`~ftfleet.trainer.checkpoint.memory.peers.replica_sets`) the ranks
holding the same shards also send each other, at each snapshot, their own small entries
(RNG states, buffers, data readers' positions: :func:`~ftfleet.trainer.checkpoint.state.rank_entries`),
which each keeps in its snapshot under :data:`REPLICA_ENTRIES`. A replica's own snapshot
of a step then holds everything a rank lost with its node needs for that step.

A failed write (shared memory full) is logged and costs that snapshot only; the disk
tiers stay the durable ones. A snapshot counts once its manifest is written, after
every byte; a process killed before that leaves a directory that is never listed.
After an in-process restart the new iteration's :class:`Snapshots` supersedes the
old one's thread (a generation number under a lock): whatever that thread still does
afterwards, it no longer writes a file or a manifest.

Restoring (collective), like the disk tiers' search:

1. each rank lists its own complete snapshots and the copies it holds (manifests that
   belong to this run and config, at this world size);
2. rank 0 picks the newest step that every rank can get, each rank from its own
   snapshot, else from a live replica's own snapshot (HSDP: the same shards, and this
   rank's entries beside them), else from its holder's copy, and broadcasts the plan;
3. replicas and holders send the bytes over gloo, point to point; every rank reads its
   snapshot once (each tensor into its own storage, the CRC32C on the way), checks it
   against the manifest and the live state (nothing is loaded yet);
4. rank 0 gathers the problems: any problem excludes that rank's source for that step,
   and the plan is made again; none, and every rank loads.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import torch

from ftfleet.trainer.checkpoint.manifest import Manifest
from ftfleet.trainer.checkpoint.memory import (
    EMPTY,
    MemoryTier,
    SnapshotMismatch,
    Staged,
    Stager,
    buffer_reader,
    check,
    decode,
    encode,
    exchange,
    merge_views,
    prepare,
    replica_sets,
    snapshot_file,
)
from ftfleet.trainer.checkpoint.restore import Identity, Restored
from ftfleet.trainer.checkpoint.state import rank_entries
from ftfleet.trainer.resilience import fencing

log = logging.getLogger("ftfleet.ckpt")

OWN, PEER, REPLICA = "own", "peer", "replica"
#: The key under which a snapshot keeps its replicas' own entries of the same step, by
#: rank (HSDP): never loaded, never written to a durable tier.
REPLICA_ENTRIES = "__replica_entries__"
#: The training thread waits for a snapshot in slices of this many seconds.
WAIT_SLICE_S = 0.1

# The newest Snapshots of this process; the threads of older ones write nothing more.
_GENERATION_LOCK = threading.Lock()
_generation = 0
_current: Snapshots | None = None


def wait_in_slices(future: Future[Any], once: bool = False) -> None:
    """Wait for ``future`` to finish (its result or exception is the caller's to read),
    in waits of :data:`WAIT_SLICE_S`: an in-process restart interrupts the training thread
    with an exception raised between two bytecodes, which a thread blocked in one long
    lock wait never reaches. ``once``: one slice at most."""
    while True:
        try:
            future.exception(timeout=WAIT_SLICE_S)
            return
        except FutureTimeout:
            if once:
                return


class Superseded(Exception):
    """A snapshot thread of an iteration that an in-process restart replaced."""


class Snapshots:
    def __init__(
        self,
        tier: MemoryTier,
        app_state: Any,
        identity: Identity,
        comm: Any,
        group: Any,
        peer_every: int = 1,
        timeout_s: float = 20.0,
    ) -> None:
        global _generation, _current
        self.tier = tier
        self.app_state = app_state
        self.identity = identity
        self.comm = comm
        self.group = group
        self.taken = 0
        self.peer_every = peer_every
        #: Seconds the training thread waits for a replica's entries (checkpoint.memory_timeout_s).
        self.timeout_s = timeout_s
        #: The generation whose snapshots these are: checked before each manifest.
        self.fence = fencing.current()
        #: The newest step whose copy went to the peer: its own snapshot is kept.
        self.copied_step: int | None = None
        #: Each rank's replicas (the other ranks holding its shards), found at first use.
        self._replicas: dict[int, list[int]] | None = None
        #: The step of the newest snapshot completed by its thread, and the seconds that
        #: thread took (the background part).
        self.last_complete: tuple[int, float] | None = None
        self._stager = Stager()
        self._received: torch.Tensor | None = None
        #: The newest snapshot taken: step, staged bytes, the state dict it copied, its job.
        self._latest: tuple[int, Staged, Any, Future[None]] | None = None
        # One long-lived thread: a thread started per snapshot would be created and torn
        # down while the data loader forks its workers, and CPython 3.11's fork can then
        # deadlock the child (seen: a worker stuck in _PyThreadState_DeleteExcept).
        # A daemon: a thread blocked in a transfer with a peer of a superseded iteration
        # must not keep the process from exiting (ThreadPoolExecutor joins at exit).
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._job: Future[None] | None = None
        self._worker = threading.Thread(target=self._serve, name="ftfleet-snapshot", daemon=True)
        self._worker.start()
        with _GENERATION_LOCK:  # waits for an older thread's write in progress
            _generation += 1
            self._generation = _generation
            if _current is not None:  # its thread (and the state it holds) goes after its job
                _current._queue.put(None)
            _current = self

    # -- taking --------------------------------------------------------------------

    @property
    def in_flight(self) -> bool:
        return self._job is not None and not self._job.done()

    def wait(self) -> None:
        """Wait for the snapshot in flight (its copy sent and received). In short waits:
        an in-process restart interrupts the training thread with an exception raised
        between two bytecodes, which a thread blocked in one long lock wait never reaches."""
        if self._job is not None:
            wait_in_slices(self._job)  # _finish logs its own failures
            self._job = None

    def close(self) -> None:
        """Wait for the snapshot in flight, then let the thread go."""
        global _current
        self.wait()
        self._queue.put(None)
        with _GENERATION_LOCK:
            if _current is self:
                _current = None

    def _serve(self) -> None:
        while (job := self._queue.get()) is not None:
            future, work = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as exc:  # noqa: BLE001 - the waiter raises it
                    future.set_exception(exc)
        self.tier.close()  # closed or superseded: its files' mappings go

    def take(self, step: int) -> None:
        """Collective: snapshot the current state as ``step``. Returns once the state is
        copied (into its file in shared memory, mapped); the rest runs on the snapshot
        thread."""
        self.wait()
        # The first snapshot of an iteration goes through a buffer (new huge pages, quick)
        # and is written by the thread, which then prepares the file for the next one: a
        # new file in /dev/shm (4 KiB pages) costs more than the copy, and that cost must
        # not fall on the training thread. Unless a file of the right size waits already
        # (this rank's, from before an in-process restart): then it goes straight in.
        mapped = self._file(False, step)

        def into(n: int) -> torch.Tensor | None:
            return mapped(n) if self.taken or self.tier.ready(False, step, n) else None

        self._latest = None
        state = self.app_state.state_dict()
        if self.replicas:
            state = {**state, REPLICA_ENTRIES: self._share_entries(state)}
        staged = self._stager.stage(state, into=into)
        # The same decision on every rank: each takes the same snapshots, counted from 0
        # in every iteration (the first one after a restart goes to the peer).
        copy = self.tier.has_peer and self.peer_every > 0 and self.taken % self.peer_every == 0
        self._job = Future()
        self._queue.put((self._job, lambda: self._finish(step, staged, copy)))
        self._latest = (step, staged, state, self._job)
        self.taken += 1

    @property
    def replicas(self) -> dict[int, list[int]]:
        """Each rank's replicas, by rank of the snapshot group; empty without HSDP."""
        if self._replicas is None:
            model = getattr(self.app_state, "model", None)
            sets = replica_sets(model, self.group) if self.comm.world_size > 1 else []
            self._replicas = {r: [p for p in ranks if p != r] for ranks in sets for r in ranks}
        return self._replicas

    def _share_entries(self, state: dict[str, Any]) -> dict[int, Any]:
        """Collective among replicas: send this rank's own entries to each of its
        replicas and return theirs, by rank. The transfers run on the snapshot thread
        (idle between snapshots), and the training thread waits in slices: a gloo
        receive waits without end for a replica that has gone on to a restart, and an
        in-process restart must still reach this thread. A failed or late exchange
        raises (TimeoutError after twice ``timeout_s``): a late message would pair with
        the next exchange, so only new groups (a restart) can go on. On a GPU the
        buffers among the entries are copied to the host here, which waits for the
        GPU's queued work."""
        rank = self.comm.rank
        own = encode(rank_entries(state, rank))
        body = torch.frombuffer(bytearray(own), dtype=torch.uint8)
        transfers = [(r, p) for r, others in sorted(self.replicas.items()) for p in others]
        outgoing = {p: (b"entries", body) for p in self.replicas.get(rank, [])}
        job: Future[dict[int, Any]] = Future()
        self._queue.put((job, lambda: exchange(transfers, rank, outgoing, self.group)))
        # Two gloo phases (sizes, then bytes), each bounded by the group's timeout.
        deadline = time.monotonic() + 2 * self.timeout_s + 1
        while not job.done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"memory: the replicas' entries did not come within {self.timeout_s:g} s")
            wait_in_slices(job, once=True)
        received = job.result()
        out = {}
        for src, (head, data) in received.items():
            if head != b"entries":
                raise SnapshotMismatch(f"rank {src} sent no entries for the snapshot")
            out[src] = decode(buffer_reader(data), data.numel())
        return out

    @property
    def latest_step(self) -> int | None:
        """The step of the newest snapshot taken (its bytes staged) in this iteration."""
        return self._latest[0] if self._latest is not None else None

    def durable_source(self, step: int) -> Future[Any] | None:
        """For a durable save written from the snapshot of ``step`` (the newest taken): a
        future of ``{"app": state}``, the state dict whose tensors are views of the
        snapshot's bytes (DTensors around host shards), resolved once the snapshot's
        background part is done (on a GPU its copies are complete then). None when the
        newest snapshot is not of ``step``. The views hold until the next snapshot is
        staged: the caller finishes its write before the next :meth:`take`."""
        if self._latest is None or self._latest[0] != step:
            return None
        _, staged, template, job = self._latest
        out: Future[Any] = Future()

        def build(_: Any) -> None:
            try:
                staged.wait()
                state = merge_views(template, staged.data)
                state.pop(REPLICA_ENTRIES, None)  # the replicas' entries are theirs to save
                out.set_result({"app": state})
            except BaseException as exc:  # noqa: BLE001 - the save reports it
                out.set_exception(exc)

        job.add_done_callback(build)
        return out

    def _file(self, held: bool, step: int) -> Callable[[int], torch.Tensor | None]:
        """``into(n)`` for the stager and the receiver: ``step``'s snapshot file, mapped,
        or None (the caller's buffer) when it cannot be (shared memory full): the file
        is then written after, or fails there."""

        def into(n: int) -> torch.Tensor | None:
            try:
                with self._writing():  # a superseded thread changes no file
                    out = self.tier.mapped(held, step, n)
            except Superseded:
                return None  # its thread stops at the manifest
            except OSError as exc:
                log.warning("memory: step %d's file not mapped in %s: %s", step, self.tier.describe(held), exc)
                return None
            return out

        return into

    def _finish(self, step: int, staged: Staged, copy: bool) -> None:
        t0 = time.monotonic()
        try:
            self._persist(step, staged, copy)
        except Superseded:
            return
        except Exception as exc:  # noqa: BLE001 - the training thread's collectives report a broken group
            log.warning("memory: snapshot of step %d failed: %s: %s", step, type(exc).__name__, exc)
            return
        self.last_complete = (step, time.monotonic() - t0)

    def _persist(self, step: int, staged: Staged, copy: bool) -> None:
        rank, ring = self.comm.rank, self.tier.ring
        staged.wait()
        crc = staged.crc()
        manifest = Manifest(
            step=step,
            run_id=self.identity.run_id,
            config_hash=self.identity.config_hash,
            world_size=self.comm.world_size,
            files={snapshot_file(rank): crc.entry()},
            torch_version=torch.__version__,
        )
        try:
            with self._writing():
                if not staged.in_place:
                    staged.write_to(self.tier.slot(False, step) / snapshot_file(rank))
                # The newest step whose copy reached the peer keeps its own snapshot until
                # this one's copy has gone too: a node lost meanwhile still finds a step
                # that its rank's holder and every other rank have.
                fencing.check(self.fence, f"snapshot of step {step}")  # one generation commits
                self.tier.commit(False, step, manifest, protect=self.copied_step)
        except OSError as exc:
            log.warning("memory: snapshot of step %d not written to %s: %s", step, self.tier.describe(), exc)
        self._prepare(False, staged.data.numel())
        if not copy:
            return
        # The peer's copy is received straight into its file here, mapped.
        transfers = [(r, ring.holder_of(r)) for r in range(self.comm.world_size)]
        outgoing = {ring.holder_of(rank): (manifest.to_json().encode(), staged.data)}
        into, placed = self._file(True, step), False

        def receive_into(n: int) -> torch.Tensor:
            nonlocal placed
            out = into(n)
            if out is None:
                return self._receive_buffer(n)
            placed, self._received = True, None  # a fallback's buffer is not kept once mapping works
            return out

        received = exchange(transfers, rank, outgoing, self.group, into=receive_into)
        self.copied_step = step
        peer = self.tier.peer_rank
        head, body = received[peer]
        try:
            if not head:
                raise SnapshotMismatch("the peer sent nothing")
            try:
                peer_manifest = Manifest.from_json(head)
            except ValueError as exc:
                raise SnapshotMismatch(f"not a snapshot message: {exc}") from None
            if peer_manifest.step != step:
                raise SnapshotMismatch(f"it is of step {peer_manifest.step}, this snapshot's is {step}")
            check(body, peer_manifest, snapshot_file(peer), f"rank {peer}'s snapshot of step {step}")
            with self._writing():
                if not placed:
                    Staged(body).write_to(self.tier.slot(True, step) / snapshot_file(peer))
                fencing.check(self.fence, f"copy of rank {peer}'s snapshot of step {step}")
                self.tier.commit(True, step, peer_manifest)
        except (SnapshotMismatch, OSError) as exc:
            log.warning("memory: copy of rank %d's snapshot not kept: %s", peer, exc)
        self._prepare(True, body.numel())

    def _prepare(self, held: bool, size: int) -> None:
        """The next snapshot's file, allocated and mapped now (see MemoryTier.prepare);
        if that fails, the next take finds out and falls back."""
        try:
            with self._writing():
                self.tier.prepare(held, size)
        except OSError as exc:
            log.info("memory: next snapshot file not prepared in %s: %s", self.tier.describe(held), exc)

    def _receive_buffer(self, n: int) -> torch.Tensor:
        if self._received is None or self._received.numel() < n:
            self._received = None
            self._received = torch.empty(n, dtype=torch.uint8)
        return self._received

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Held while this thread changes files: a newer iteration's Snapshots waits for
        it, and after that this one changes nothing."""
        with _GENERATION_LOCK:
            if self._generation != _generation:
                raise Superseded
            yield

    # -- restoring -----------------------------------------------------------------

    def restore(self, min_step: int | None = None) -> Restored | None:
        """Collective: load the newest step at or after ``min_step`` that every rank can
        get from memory. None (nothing loaded) when there is none."""
        world = self.comm.world_size
        own = self.tier.listing(False, world, self.identity)
        held = self.tier.listing(True, world, self.identity) if self.tier.has_peer else []
        listings = self.comm.gather((own, held))
        # Held until the load: the template's optimizer state is made once (AppState).
        self.app_state.loading = True
        try:
            return self._restore(listings, min_step)
        finally:
            self.app_state.loading = False

    def _restore(self, listings: list[tuple[list[int], list[int]]], min_step: int | None) -> Restored | None:
        rank = self.comm.rank
        excluded: set[tuple[int, int, tuple[str, int]]] = set()
        while True:
            plan = self._plan(listings, excluded, min_step) if rank == 0 else None
            plan = self.comm.broadcast(plan)
            if plan is None:
                if rank == 0:
                    log.info("memory: no snapshot every rank can restore%s", _from(min_step))
                return None
            step, sources = plan
            state, manifest, problem = self._fetch(step, sources)
            problems = self.comm.gather(problem)
            if rank == 0:
                for r, p in enumerate(problems):
                    if p is not None:
                        kind, src = sources[r]
                        where = kind if kind == OWN else f"{kind} of rank {src}"
                        log.warning("memory: step %d of rank %d (%s) skipped: %s", step, r, where, p)
                        excluded.add((step, r, sources[r]))
            if not any(self.comm.broadcast([p is not None for p in problems] if rank == 0 else None)):
                break
        self.app_state.load_state_dict(state)
        peers = sorted(r for r, (kind, _) in sources.items() if kind == PEER)
        healed = sorted(r for r, (kind, _) in sources.items() if kind == REPLICA)
        if rank == 0:
            how = [f"ranks {healed} from their live replicas" if healed else ""]
            how.append(f"ranks {peers} from their peers' copies" if peers else "")
            log.info("memory: restored step %d, %s", step, ", ".join(h for h in how if h) or "every rank from its own")
        tier = "memory-replica" if healed else "memory-peer" if peers else "memory"
        return Restored(step, tier, str(self.tier.root), manifest)

    def _plan(
        self,
        listings: list[tuple[list[int], list[int]]],
        excluded: set[tuple[int, int, tuple[str, int]]],
        min_step: int | None,
    ) -> tuple[int, dict[int, tuple[str, int]]] | None:
        """The newest step (at or after ``min_step``) that every rank can get, and where
        each gets it: its own snapshot, else a replica's own (the same shards), else its
        holder's copy. Sources in ``excluded`` failed a fetch of that step before."""
        ring, replicas = self.tier.ring, self.replicas
        steps = sorted({s for own, held in listings for s in (*own, *held)}, reverse=True)
        for step in steps:
            if min_step is not None and step < min_step:
                break
            sources: dict[int, tuple[str, int]] = {}
            for r in range(len(listings)):
                holder = ring.holder_of(r)
                options = [(OWN, r)] if step in listings[r][0] else []
                options += [(REPLICA, p) for p in replicas.get(r, []) if step in listings[p][0]]
                options += [(PEER, holder)] if holder != r and step in listings[holder][1] else []
                source = next((o for o in options if (step, r, o) not in excluded), None)
                if source is None:
                    break
                sources[r] = source
            if len(sources) == len(listings):
                return step, sources
        return None

    def _fetch(self, step: int, sources: dict[int, tuple[str, int]]) -> tuple[Any, Manifest | None, str | None]:
        """This rank's state for ``step`` (checked, not loaded), its manifest, or the problem."""
        rank, tier = self.comm.rank, self.tier
        sent = sorted((src, r, kind) for r, (kind, src) in sources.items() if kind != OWN)
        outgoing: dict[int, Any] = {}
        read: dict[str, Any] = {}  # each file read once, however many ranks it goes to
        for src, dst, kind in sent:
            if src == rank:
                if kind not in read:
                    try:  # a holder sends its copy, a replica its own snapshot
                        data, manifest = tier.read(kind == PEER, step)
                        read[kind] = (manifest.to_json().encode(), data)
                    except Exception as exc:  # noqa: BLE001 - every receiver must still get a message
                        log.warning("memory: cannot send rank %d its %s: %s: %s", dst, kind, type(exc).__name__, exc)
                        read[kind] = EMPTY
                outgoing[dst] = read[kind]
        received = exchange([(src, dst) for src, dst, _ in sent], rank, outgoing, self.group)
        kind, src = sources[rank]
        try:
            if kind == OWN:
                saved, manifest = tier.load(False, step)
            else:
                what = "the copy" if kind == PEER else "the replica's snapshot"
                head, body = received.get(src, EMPTY)
                if not head:
                    raise SnapshotMismatch(f"rank {src} had no valid {kind} snapshot to send")
                manifest = Manifest.from_json(head)
                written_by = rank if kind == PEER else src
                check(body, manifest, snapshot_file(written_by), f"{what} from rank {src}")
                if manifest.step != step:
                    raise SnapshotMismatch(f"{what} from rank {src} is of step {manifest.step}")
                saved = decode(buffer_reader(body), body.numel())
            saved = as_rank(saved, src if kind == REPLICA else rank, rank)
            return prepare(self.app_state, saved), manifest, None
        except SnapshotMismatch as exc:
            return None, None, str(exc)
        except ValueError as exc:  # a manifest that does not parse (ManifestError)
            return None, None, f"the copy from rank {src}: {exc}"
        except (RuntimeError, MemoryError) as exc:  # every rank must reach the gather
            return None, None, f"{type(exc).__name__}: {exc}"


def as_rank(saved: Any, owner: int, rank: int) -> Any:
    """A snapshot's decoded state, written by rank ``owner``, as ``rank``'s state: the
    replicas' entries dropped; from a replica (``owner`` != ``rank``), the owner's own
    entries replaced by those of ``rank`` that it kept. Raises SnapshotMismatch when it
    kept none."""
    if not isinstance(saved, dict):
        return saved
    saved = dict(saved)
    entries = saved.pop(REPLICA_ENTRIES, None)
    if owner == rank:
        return saved
    mine = entries.get(rank) if isinstance(entries, dict) else None
    if not isinstance(mine, dict):
        raise SnapshotMismatch(f"rank {owner}'s snapshot holds no entries of rank {rank}: not its replica then")
    theirs = rank_entries(saved, owner)
    out = {k: v for k, v in saved.items() if k not in theirs}
    out.update(mine)
    return out


def _from(min_step: int | None) -> str:
    return "" if min_step is None else f" at or after step {min_step} (the newest on disk)"
