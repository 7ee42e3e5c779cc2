"""The host-memory tier: each rank's latest snapshots in shared memory, and a copy of the
next node's.

A snapshot is this rank's whole :class:`~ftfleet.trainer.checkpoint.state.AppState`
(model and optimizer shards, LR schedule, step, data reader, RNGs, extras) in one file
(:mod:`.format`) under the run's shared-memory directory (:func:`ftfleet.contract.memory_dir`)::

    <root>/node-<i>/rank-<r>/step-N/{__<r>.snap, manifest.json}        own snapshot
    <root>/node-<i>/peer/rank-<q>/step-N/{__<q>.snap, manifest.json}   copy of node i+1's rank q

``/dev/shm`` outlives the training process (a SIGKILL, a crash, torchrun's restart of
the group) but not the node, so node ``i`` also holds node ``i + 1``'s latest snapshot
(:mod:`.peers`). A snapshot is complete only once its manifest exists: the same
:class:`~ftfleet.trainer.checkpoint.manifest.Manifest` as the disk tiers (size and
CRC32C of the file, step, run, config hash, world size), written last, atomically. A
directory without a manifest (a kill mid-write) is never listed; a file whose size or
CRC does not match its manifest is skipped with a warning. The file is named after the
rank (``__<r>.snap``), so a snapshot is never loaded into another rank. Snapshots are
per rank and valid only at the world size that wrote them: after a world-size change
the restore goes to the disk tiers, where DCP reshards. Retired snapshot directories
are reused (their manifest removed first), since overwriting a file in ``/dev/shm``
costs far less than allocating a new one.
"""

from __future__ import annotations

import logging
import mmap
import os
import shutil
import threading
import weakref
from pathlib import Path
from typing import Any

import torch

from ftfleet.contract import RESERVE_DIR, reserved_name, step_dir_name
from ftfleet.trainer.checkpoint.manifest import (
    Crc32c,
    Manifest,
    ManifestError,
    read_manifest,
    write_manifest,
)
from ftfleet.trainer.checkpoint.memory.format import (
    SnapshotMismatch,
    check,
    compare_crc,
    decode,
    expected_entry,
    snapshot_file,
)
from ftfleet.trainer.checkpoint.memory.peers import Ring

log = logging.getLogger("ftfleet.ckpt")

_FREE = ".free-"


def _map_populated(fd: int, size: int) -> mmap.mmap:
    """``size`` bytes of ``fd`` mapped shared and writable, their pages faulted in."""
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def reserve_files(root: str | Path, size: int, count: int, local_rank: int, stop: threading.Event | None = None) -> int:
    """Allocate ``count`` files of ``size`` bytes in ``root``'s reserve for snapshots yet
    to be taken (named :func:`~ftfleet.contract.reserved_name`, for ``local_rank``): what a
    warm spare node's local rank does while it waits. A file of that name and at least
    that size is there already, and counted. The tier makes a new
    snapshot file out of a reserved one that is big enough (moved, cut to size), so the
    spare's first snapshots after it takes over find their pages allocated: a new
    file's pages cost far more than the copy into them (``bench/snapshot_bench.py``).
    A file is listed once allocated (made under a
    hidden name). Stops between files when ``stop`` is set, and at the first file that
    does not fit. Returns how many reserved files of at least ``size`` bytes there are."""
    where = Path(root) / RESERVE_DIR
    where.mkdir(parents=True, exist_ok=True)
    made = 0
    for i in range(count):
        if stop is not None and stop.is_set():
            break
        final = where / reserved_name(local_rank, i)
        if final.exists() and final.stat().st_size >= size:
            made += 1
            continue
        hidden = where / f".{final.name}"
        fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            os.posix_fallocate(fd, 0, size)
            # tmpfs allocates on fallocate but clears each page at its first touch (the
            # slow part): touch them all now, writable, through a populated mapping.
            _map_populated(fd, size).close()
        except OSError as exc:
            log.info("memory: reserved %d of %d snapshot files in %s: %s", made, count, where, exc)
            hidden.unlink(missing_ok=True)
            break
        finally:
            os.close(fd)
        os.replace(hidden, final)
        made += 1
    return made


class MemoryTier:
    """The snapshot directories of one rank: its own, and the copy it holds for its peer."""

    def __init__(self, root: str | Path, ring: Ring, keep: int = 2) -> None:
        self.root = Path(root)
        self.ring = ring
        self.keep = keep
        node = self.root / f"node-{ring.node_of(ring.rank)}"
        self.own_dir = node / f"rank-{ring.rank}"
        self.peer_rank = ring.peer_of(ring.rank)
        self.held_dir = node / "peer" / f"rank-{self.peer_rank}"
        #: Files mapped by :meth:`mapped`, by inode: (an open fd, which keeps the inode
        #: from being reused while it is cached; the mapping; a tensor over it).
        self._maps: dict[tuple[int, int], tuple[int, mmap.mmap, torch.Tensor]] = {}
        self._maps_lock = threading.Lock()
        # An iteration that fails never closes its tier: its fds go with the object.
        self._finalizer = weakref.finalize(self, _close_fds, self._maps, self._maps_lock)
        # Directories a writer left without a manifest (killed mid-write, or an older
        # iteration's thread whose transfer may still land in them): never reused.
        for base in (self.own_dir, self.held_dir):
            for p in base.glob("step-*") if base.is_dir() else ():
                if not (p / "manifest.json").exists():
                    shutil.rmtree(p, ignore_errors=True)

    @property
    def has_peer(self) -> bool:
        return self.ring.nodes > 1

    def describe(self, held: bool = False) -> str:
        return str(self.held_dir if held else self.own_dir)

    def path(self, held: bool, step: int) -> Path:
        base = self.held_dir if held else self.own_dir
        return base / step_dir_name(step) / snapshot_file(self.peer_rank if held else self.ring.rank)

    # -- writing ---------------------------------------------------------------

    def slot(self, held: bool, step: int) -> Path:
        """The directory to write ``step`` into, without a manifest: a retired one
        reused (renamed), else a new one. An older directory of the same step loses its
        manifest first."""
        base = self.held_dir if held else self.own_dir
        step_dir = base / step_dir_name(step)
        (step_dir / "manifest.json").unlink(missing_ok=True)
        source = self._slot_source(base, step)
        if source is None:
            step_dir.mkdir(parents=True, exist_ok=True)
        elif source != step_dir:
            os.replace(source, step_dir)
        return step_dir

    def _slot_source(self, base: Path, step: int) -> Path | None:
        """The directory :meth:`slot` makes ``step``'s: the step's own if it exists, else
        the first retired one, else None (a new one)."""
        step_dir = base / step_dir_name(step)
        return step_dir if step_dir.exists() else next(iter(self._retired(base)), None)

    def mapped(self, held: bool, step: int, size: int) -> torch.Tensor:
        """``size`` writable bytes that are ``step``'s snapshot file (``MAP_SHARED``): what
        is copied into them is in the file, no ``write`` after. The file is the slot's (a
        retired one reused: its pages exist already, and :meth:`prepare` mapped it), its
        space reserved first (``posix_fallocate``: a full ``/dev/shm`` is an OSError
        here, not a SIGBUS on a store into the mapping). A mapping is kept while its file
        exists, so that the next snapshot into it does not fault its page tables in."""
        name = snapshot_file(self.peer_rank if held else self.ring.rank)
        with self._maps_lock:
            return self._map_file(self.slot(held, step) / name, size)

    def ready(self, held: bool, step: int, size: int) -> bool:
        """Whether :meth:`mapped` would give ``step`` a file of ``size`` bytes that exists
        already (a retired one: an earlier iteration's, a process's that died, or
        :meth:`prepare`'s), so that a copy into it allocates no new pages."""
        where = self._slot_source(self.held_dir if held else self.own_dir, step)
        if where is None:
            return self._reserved(size) is not None
        try:
            return (where / snapshot_file(self.peer_rank if held else self.ring.rank)).stat().st_size == size
        except OSError:
            return False

    def _reserved(self, size: int) -> list[Path] | None:
        """The reserved files (:func:`reserve_files`) of at least ``size`` bytes,
        smallest first; None when there is none."""
        try:
            entries = list((self.root / RESERVE_DIR).iterdir())
        except OSError:  # no reserve
            return None
        found = []
        for p in entries:
            try:
                n = p.stat().st_size
            except OSError:  # another rank of the node took it meanwhile
                continue
            if n >= size and not p.name.startswith("."):
                found.append((n, p))
        return [p for _, p in sorted(found)] or None

    def _take_reserved(self, path: Path, size: int) -> None:
        """Make ``path`` (not there yet) a reserved file cut to ``size`` bytes, if one is
        big enough: its pages are allocated already."""
        for source in self._reserved(size) or ():
            try:
                os.replace(source, path)
            except FileNotFoundError:  # another rank of the node took it
                continue
            os.truncate(path, size)
            return

    def prepare(self, held: bool, size: int) -> None:
        """Have a retired file of ``size`` bytes allocated and mapped for the next
        snapshot (a new one when none is retired yet): the snapshot thread calls this
        after a commit, so that the training thread's next copy finds its pages."""
        base = self.held_dir if held else self.own_dir
        name = snapshot_file(self.peer_rank if held else self.ring.rank)
        with self._maps_lock:
            retired = self._retired(base)
            spare = retired[0] if retired else base / f"{_FREE}next"
            spare.mkdir(parents=True, exist_ok=True)
            self._map_file(spare / name, size)

    def _map_file(self, path: Path, size: int) -> torch.Tensor:
        if path.exists() and path.stat().st_size != size:
            # Another size: a new file, never this one truncated, which would make a
            # store or a read through an older mapping of it a SIGBUS.
            path.unlink()
        self._prune()
        if not path.exists():
            self._take_reserved(path, size)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        keep = False
        try:
            st = os.fstat(fd)
            if st.st_size != size:
                os.ftruncate(fd, size)  # a new file: it grows
            os.posix_fallocate(fd, 0, size)
            key = (st.st_dev, st.st_ino)
            cached = self._maps.get(key)
            if cached is not None and len(cached[1]) == size:
                return cached[2]
            if cached is not None:
                self._drop(key)
            mm = _map_populated(fd, size)
            self._maps[key] = (fd, mm, torch.frombuffer(mm, dtype=torch.uint8))
            keep = True
            return self._maps[key][2]
        finally:
            if not keep:
                os.close(fd)

    def _prune(self) -> None:
        """Forget the mappings of files deleted since (their memory goes with them)."""
        for key, (fd, _, _) in list(self._maps.items()):
            if os.fstat(fd).st_nlink == 0:
                self._drop(key)

    def _drop(self, key: tuple[int, int]) -> None:
        fd, _, _ = self._maps.pop(key)
        os.close(fd)  # the mapping is unmapped once no view of it is left

    def close(self) -> None:
        """Forget every mapping (the files stay)."""
        with self._maps_lock:
            for key in list(self._maps):
                self._drop(key)

    def commit(self, held: bool, step: int, manifest: Manifest, protect: int | None = None) -> None:
        """Make ``step`` complete (its manifest, atomically), then retire the steps
        beyond ``keep`` other than ``protect``: manifest first, the directory kept for
        the next snapshot."""
        base = self.held_dir if held else self.own_dir
        write_manifest(base / step_dir_name(step), manifest)
        for old in [s for s in self.steps(base) if s != protect][self.keep :]:
            old_dir = base / step_dir_name(old)
            (old_dir / "manifest.json").unlink(missing_ok=True)
            os.replace(old_dir, base / f"{_FREE}{old}")
        for extra in self._retired(base)[1:]:  # one spare directory is all a writer needs
            shutil.rmtree(extra, ignore_errors=True)
        with self._maps_lock:  # a deleted file's memory goes now, not at the next snapshot
            self._prune()

    @staticmethod
    def _retired(base: Path) -> list[Path]:
        """Directories to reuse: retired ones, and step directories without a manifest
        (a writer killed mid-write)."""
        if not base.is_dir():
            return []
        out = [p for p in base.iterdir() if p.name.startswith(_FREE)]
        out += [p for p in base.glob("step-*") if not (p / "manifest.json").exists()]
        return sorted(out)

    # -- reading ---------------------------------------------------------------

    @staticmethod
    def steps(base: Path) -> list[int]:
        """Steps with a manifest under ``base``, newest first (unverified)."""
        out = []
        for p in base.glob("step-*") if base.is_dir() else ():
            try:
                step = int(p.name.removeprefix("step-"))
            except ValueError:
                continue
            if (p / "manifest.json").exists():
                out.append(step)
        return sorted(out, reverse=True)

    def listing(self, held: bool, world_size: int, identity: Any) -> list[int]:
        """Steps whose manifest parses, belongs to this run and config, and was written
        at ``world_size``; the others are logged and left out."""
        base = self.held_dir if held else self.own_dir
        rank = self.peer_rank if held else self.ring.rank
        good = []
        for step in self.steps(base):
            where = base / step_dir_name(step)
            try:
                manifest = read_manifest(where)
            except ManifestError as exc:
                log.warning("memory: %s has a malformed manifest, skipping it: %s", where, exc)
                continue
            if manifest is None:
                continue
            why = identity.mismatch(manifest)
            if why is None and manifest.world_size != world_size:
                why = f"written by {manifest.world_size} ranks, {world_size} now (the disk tiers reshard)"
            if why is None and (manifest.step != step or set(manifest.files) != {snapshot_file(rank)}):
                why = f"manifest of step {manifest.step} listing {sorted(manifest.files)}"
            if why:
                log.warning("memory: skipping %s: %s", where, why)
                continue
            good.append(step)
        return good

    def manifest(self, held: bool, step: int) -> Manifest:
        where = self.path(held, step).parent
        try:
            manifest = read_manifest(where)
        except ManifestError as exc:
            raise SnapshotMismatch(f"{where}: {exc}") from None
        if manifest is None:
            raise SnapshotMismatch(f"{where}: manifest gone")
        return manifest

    def load(self, held: bool, step: int) -> tuple[Any, Manifest]:
        """The state dict of a snapshot, read once: each tensor into its own storage,
        the CRC32C taken on the way. Raises SnapshotMismatch (one line) when the file is
        missing, torn, corrupt or not a snapshot."""
        manifest = self.manifest(held, step)
        path = self.path(held, step)
        expected = expected_entry(manifest, path.name, str(path.parent))
        crc = Crc32c()
        try:
            with open(path, "rb", buffering=0) as f:
                state = decode(f.readinto, expected.size, crc)
                if f.read(1):
                    raise SnapshotMismatch(f"longer than the manifest's {expected.size} bytes (torn)")
        except OSError as exc:
            raise SnapshotMismatch(f"{path}: {type(exc).__name__}: {exc}") from None
        except SnapshotMismatch as exc:
            raise SnapshotMismatch(f"{path}: {exc}") from None
        compare_crc(crc, expected, f"{path}")
        return state, manifest

    def read(self, held: bool, step: int) -> tuple[torch.Tensor, Manifest]:
        """A snapshot's file as bytes (uint8 tensor), checked against its manifest."""
        manifest = self.manifest(held, step)
        path = self.path(held, step)
        expected = expected_entry(manifest, path.name, str(path.parent))
        data = torch.empty(expected.size, dtype=torch.uint8)
        view, got = (memoryview(data.numpy()) if expected.size else memoryview(b"")), 0
        try:
            with open(path, "rb", buffering=0) as f:
                # One read() returns at most 2 GiB on Linux: loop.
                while got < expected.size and (n := f.readinto(view[got:])):
                    got += n
        except OSError as exc:
            raise SnapshotMismatch(f"{path}: {type(exc).__name__}: {exc}") from None
        check(data[:got], manifest, path.name, str(path.parent))
        return data, manifest


def _close_fds(maps: dict[tuple[int, int], tuple[int, mmap.mmap, torch.Tensor]], lock: threading.Lock) -> None:
    """At exit (or when a tier is collected): close the cached fds, under the tier's lock.
    A snapshot thread may still be closing the same tier at exit, and an fd closed twice
    can close a file opened since under the same number. If that thread holds the lock
    for long, the fds are left for the process's end to close."""
    if not lock.acquire(timeout=5):
        return
    try:
        for fd, _, _ in maps.values():
            try:
                os.close(fd)
            except OSError:
                pass
        maps.clear()
    finally:
        lock.release()
