"""The host-memory tier: each rank's latest snapshots in shared memory, and a copy of the
next node's.

A snapshot is this rank's whole :class:`~ftfleet.trainer.checkpoint.state.AppState`
(model and optimizer shards, LR schedule, step, data reader, RNGs, extras) in one file
under the run's shared-memory directory (:func:`ftfleet.contract.memory_dir`)::

    <root>/node-<i>/rank-<r>/step-N/{__<r>.snap, manifest.json}        own snapshot
    <root>/node-<i>/peer/rank-<q>/step-N/{__<q>.snap, manifest.json}   copy of node i+1's rank q

``/dev/shm`` outlives the training process (a SIGKILL, a crash, torchrun's restart of
the group) but not the node. So node ``i`` also keeps the latest snapshot of node
``(i + 1) mod N`` (a ring): after a snapshot, each rank sends its bytes to the rank with
the same local rank on the previous node (gloo point-to-point on a group of its own).
A lost node's ranks then restore from their holders' RAM.

The file (:class:`Stager` writes it, :func:`decode` reads it)::

    b"FTFSNAP1" | u64 header length | header | padding | tensor bytes, each 64-aligned

The header is the state dict saved with ``torch.save`` with every tensor replaced by a
reference ``(TENSOR, offset, dtype, shape)`` into the bytes that follow (DTensors as
their local shards), so it loads with ``weights_only=True`` and the tensor bytes are
raw: a snapshot is one copy of the tensors straight into the file, mapped
(:meth:`MemoryTier.mapped`; on a GPU into a pinned buffer, then written), and a
restore reads each tensor straight into its own new storage. (``torch.save`` of the
whole state, the first version, cost 1.79 s a snapshot on the 679 MB per rank of
the goodput bench; on this machine most of it was the kernel handing out fresh pages
for the serialized bytes, their copies, and each new file; docs/BENCHMARKS.md.)

A snapshot is complete only once its manifest exists: the same
:class:`~ftfleet.trainer.checkpoint.manifest.Manifest` as the disk tiers (size and
CRC32C of the file, step, run, config hash, world size), written last, atomically. A
directory without a manifest (a kill mid-write) is never listed; a file whose size or
CRC does not match its manifest is skipped with a warning. The file is named after the
rank (``__<r>.snap``), so a snapshot is never loaded into another rank. Snapshots are
per rank and valid only at the world size that wrote them: after a world-size change
the restore goes to the disk tiers, where DCP reshards. Retired snapshot directories
are reused (their manifest removed first): overwriting a file in ``/dev/shm`` costs a
quarter of writing a new one here.
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import logging
import mmap
import os
import shutil
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ftfleet.contract import RESERVE_DIR, reserved_name, step_dir_name
from ftfleet.trainer.checkpoint.manifest import (
    Crc32c,
    Manifest,
    ManifestError,
    read_manifest,
    write_manifest,
)
from ftfleet.trainer.checkpoint.state import placed_like

log = logging.getLogger("ftfleet.ckpt")

MAGIC = b"FTFSNAP1"
#: Offset alignment of each tensor's bytes (a view of another dtype needs its element
#: size; 64 is a cache line).
ALIGN = 64
#: A restore reads a snapshot in slices of this many bytes, each checksummed right after
#: it is read (:func:`decode`): half an L2, and below the 4 MiB from which glibc's copies
#: stream past the cache (``ftfleet.contract.NON_TEMPORAL_THRESHOLD``).
READ_SLICE = 1 << 20
#: The first item of a tensor reference in the header.
TENSOR = "\x00ftfleet.snapshot.tensor"
_FREE = ".free-"


class SnapshotMismatch(RuntimeError):
    """A snapshot that does not fit the live state (another model, another layout), or
    bytes that are not a complete snapshot."""


def snapshot_file(rank: int) -> str:
    return f"__{rank}.snap"


@dataclasses.dataclass(frozen=True)
class Ring:
    """Which ranks form a node, and who holds whose copy. ``ranks_per_node`` ranks per
    node, in rank order (torchrun's numbering); node ``i`` holds node ``i + 1``'s."""

    rank: int
    world_size: int
    ranks_per_node: int

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.ranks_per_node)

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def peer_of(self, rank: int) -> int:
        """The rank whose snapshot ``rank`` holds (same local rank, next node)."""
        node, local = divmod(rank, self.ranks_per_node)
        return ((node + 1) % self.nodes) * self.ranks_per_node + local

    def holder_of(self, rank: int) -> int:
        """The rank that holds ``rank``'s copy (same local rank, previous node)."""
        node, local = divmod(rank, self.ranks_per_node)
        return ((node - 1) % self.nodes) * self.ranks_per_node + local


@dataclasses.dataclass
class Staged:
    """A snapshot file's bytes, ``data`` (uint8): the magic, the header, the tensors."""

    data: torch.Tensor
    """A view of the snapshot's file mapped in memory (``in_place``), or of the stager's
    buffer: valid until the next :meth:`Stager.stage`."""
    in_place: bool = False
    """The bytes are in their file already (mapped); else :meth:`write_to` writes them."""
    ready: Any = None
    """A CUDA event the copies into ``data`` complete at (None: complete already)."""

    def wait(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()

    def crc(self) -> Crc32c:
        crc = Crc32c()
        crc.update(_bytes(self.data))
        return crc

    def write_to(self, path: Path) -> None:
        """Write the file at ``path``, over the old bytes when it exists (no new pages)."""
        with open(path, "r+b" if path.exists() else "wb", buffering=0) as f:
            _write_all(f, _bytes(self.data))
            f.truncate()


class Stager:
    """Copies a state dict into a snapshot file's layout: straight into the file, mapped
    (``into``, host tensors), or into one buffer kept between snapshots (pinned when the
    state is on a GPU: the copies are then asynchronous on the current stream, ordered
    before the next optimizer step, and :meth:`Staged.wait` waits for them)."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def stage(self, state_dict: Any, into: Callable[[int], torch.Tensor | None] | None = None) -> Staged:
        """``into(n)``: n writable bytes of the file (None: use the buffer)."""
        tensors: list[torch.Tensor] = []
        skeleton = _strip(state_dict, tensors)
        offsets, size = _layout(tensors)
        cuda = any(t.is_cuda for t in tensors)
        refs = [(TENSOR, off, _dtype_name(t.dtype), tuple(t.shape)) for t, off in zip(tensors, offsets, strict=True)]
        header = io.BytesIO()
        torch.save(_fill(skeleton, refs), header)
        head = header.getvalue()
        prefix = MAGIC + len(head).to_bytes(8, "little") + head
        prefix += bytes(-len(prefix) % ALIGN)  # the tensors start aligned
        total = len(prefix) + size
        data = into(total) if into is not None and not cuda else None
        in_place = data is not None
        if in_place:
            self.buffer = None  # a fallback's buffer is not kept once mapping works
        else:
            if self.buffer is None or self.buffer.numel() < total or self.buffer.is_pinned() != cuda:
                self.buffer = None  # the old one goes first: two would be twice the memory
                self.buffer = torch.zeros(max(total, 1), dtype=torch.uint8, pin_memory=cuda)
            data = self.buffer[:total]
        data[: len(prefix)].copy_(torch.frombuffer(bytearray(prefix), dtype=torch.uint8))
        blob = data[len(prefix) :]
        for t, off in zip(tensors, offsets, strict=True):
            if t.numel():
                copy_into(blob[off : off + _nbytes(t)], t, non_blocking=cuda)
        ready = None
        if cuda:
            ready = torch.cuda.Event()
            ready.record()
        return Staged(data, in_place, ready)


def copy_into(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> None:
    """Copy ``src``'s elements into ``dst``, a uint8 tensor of exactly its byte size.

    A dense host tensor (the snapshot's usual case) is one ``memmove`` of its bytes, not
    ``Tensor.copy_``, when torch runs one thread per process (torchrun's default with
    several processes; ``copy_`` spreads a large copy over torch's threads, ``memmove``
    does not): torch's copy kernel stores through the cache, so each destination line
    is read from memory before it is written, while glibc's ``memmove`` streams a block
    past the cache (non-temporal stores) once it is past glibc's threshold, which
    :func:`ftfleet.contract.host_memory_env` lowers to 4 MiB for trainers. On the test
    machine a snapshot of 679 MB per rank then blocked training 0.083-0.101 s instead
    of 0.152-0.159 s (docs/BENCHMARKS.md, "Snapshot copies streamed past the cache").
    Anything else (a device tensor, a view that is not contiguous, a conjugate or
    negative bit, a quantized tensor, a subclass) goes through ``copy_``. ctypes
    releases the GIL for the call, as ``copy_`` does."""
    if (
        type(src) is torch.Tensor
        and src.device.type == "cpu"
        and src.layout == torch.strided
        and src.is_contiguous()
        and not src.is_conj()
        and not src.is_neg()
        and not src.is_quantized
        and dst.device.type == "cpu"
        and dst.dtype == torch.uint8
        and dst.is_contiguous()
        and dst.numel() == _nbytes(src)
        and torch.get_num_threads() == 1
    ):
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), dst.numel())
    else:
        dst.view(src.dtype).view(src.shape).copy_(src, non_blocking=non_blocking)


def encode(state_dict: Any) -> bytes:
    """A state dict as a snapshot file's bytes (a fresh stager: for tools and tests)."""
    staged = Stager().stage(state_dict)
    staged.wait()
    return bytes(_bytes(staged.data))


def decode(read: Callable[[memoryview], int], size: int, crc: Crc32c | None = None) -> Any:
    """The state dict of a snapshot of ``size`` bytes, each tensor read into a storage of
    its own by ``read`` (``readinto``-like: fills the view, returns the bytes it read),
    in file order; ``crc`` is fed every byte. Raises SnapshotMismatch (one line) for
    bytes that are not a snapshot or end early (torn); the CRC is the caller's to check."""
    crc = crc if crc is not None else Crc32c()
    pos = 0

    def take(view: memoryview) -> None:
        # In slices of READ_SLICE, each checksummed as soon as it is read, while its
        # bytes are still in the core's cache: the bytes cross the memory bus once
        # on the way in, not again for the CRC.
        nonlocal pos
        got = 0
        while got < view.nbytes:
            piece = view[got : got + READ_SLICE]
            filled = 0
            while filled < piece.nbytes:
                n = read(piece[filled:])
                if not n:
                    raise SnapshotMismatch(f"ends after {pos + got + filled} of {size} bytes (torn)")
                filled += n
            crc.update(piece)
            got += filled
        pos += got

    start = bytearray(len(MAGIC) + 8)
    take(memoryview(start))
    n = int.from_bytes(start[len(MAGIC) :], "little")
    if bytes(start[: len(MAGIC)]) != MAGIC or n > size:
        raise SnapshotMismatch("not a snapshot file (bad magic or header length)")
    head = bytearray(n)
    take(memoryview(head))
    try:
        skeleton = torch.load(io.BytesIO(head), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - bytes that do not unpickle: a foreign file
        raise SnapshotMismatch(f"does not load: {type(exc).__name__}: {exc}") from None
    base = pos + (-pos % ALIGN)
    out: dict[int, torch.Tensor] = {}
    for off, ref in sorted(_refs(skeleton), key=lambda r: r[0]):
        dtype, shape, nbytes = _ref_layout(ref)
        if base + off < pos or base + off + nbytes > size:  # before allocating it
            raise SnapshotMismatch(f"a tensor at offset {off} lies outside the {size}-byte file")
        t = torch.empty(shape, dtype=dtype)
        if base + off > pos:
            take(memoryview(bytearray(base + off - pos)))
        if t.numel():
            take(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        out[id(ref)] = t
    if pos < size:
        take(memoryview(bytearray(size - pos)))
    return _fill_refs(skeleton, out)


def views(data: torch.Tensor) -> Any:
    """The state dict of staged snapshot bytes (:attr:`Staged.data`, on the host) with
    each tensor a view of those bytes, not a copy: for a durable save written from the
    snapshot. Each tensor's storage is exactly its own bytes (DCP's writer copies a
    tensor whose storage is larger than it). Valid while ``data`` is: until the next
    snapshot is staged into the same bytes."""
    raw = _bytes(data)
    if raw.nbytes < len(MAGIC) + 8 or bytes(raw[: len(MAGIC)]) != MAGIC:
        raise SnapshotMismatch("not a snapshot file (bad magic)")
    n = int.from_bytes(raw[len(MAGIC) : len(MAGIC) + 8], "little")
    start = len(MAGIC) + 8
    if start + n > raw.nbytes:
        raise SnapshotMismatch("not a snapshot file (bad header length)")
    skeleton = torch.load(io.BytesIO(raw[start : start + n]), weights_only=True)
    base = start + n + (-(start + n) % ALIGN)
    out: dict[int, torch.Tensor] = {}
    for off, ref in _refs(skeleton):
        dtype, shape, nbytes = _ref_layout(ref)
        if base + off + nbytes > raw.nbytes:
            raise SnapshotMismatch(f"a tensor at offset {off} lies outside the {raw.nbytes}-byte snapshot")
        if not nbytes:
            out[id(ref)] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(raw, dtype=torch.uint8, count=nbytes, offset=base + off)
        out[id(ref)] = flat.view(dtype).view(shape)
    return _fill_refs(skeleton, out)


def merge_views(template: Any, data: torch.Tensor) -> Any:
    """The state dict ``template`` (the one a snapshot copied) with its tensors replaced
    by :func:`views` of the snapshot's bytes ``data``; DTensors keep their placement
    around a host shard."""
    return _merge(template, views(data), "", host=True)


def buffer_reader(data: bytes | bytearray | memoryview | torch.Tensor) -> Callable[[memoryview], int]:
    """A ``read`` for :func:`decode` over bytes in memory (copies out of them)."""
    view = _bytes(data) if isinstance(data, torch.Tensor) else memoryview(data).cast("B")
    pos = 0

    def read(into: memoryview) -> int:
        nonlocal pos
        n = min(into.nbytes, view.nbytes - pos)
        into[:n] = view[pos : pos + n]
        pos += n
        return n

    return read


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
    file's pages cost far more than the copy into them (1.5 s for 679 MB on the 2-core
    machine's tmpfs, docs/BENCHMARKS.md). A file is listed once allocated (made under a
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
        expected = _expected(manifest, path.name, str(path.parent))
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
        _compare(crc, expected, f"{path}")
        return state, manifest

    def read(self, held: bool, step: int) -> tuple[torch.Tensor, Manifest]:
        """A snapshot's file as bytes (uint8 tensor), checked against its manifest."""
        manifest = self.manifest(held, step)
        path = self.path(held, step)
        expected = _expected(manifest, path.name, str(path.parent))
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


def _expected(manifest: Manifest, name: str, where: str) -> Any:
    expected = manifest.files.get(name)
    if expected is None:
        raise SnapshotMismatch(f"{where}: the manifest does not list {name}")
    return expected


def _compare(crc: Crc32c, expected: Any, where: str) -> None:
    got = crc.entry()
    if got.size != expected.size:
        raise SnapshotMismatch(f"{where}: size {got.size} bytes, manifest says {expected.size} (torn)")
    if got.crc32c != expected.crc32c:
        raise SnapshotMismatch(f"{where}: crc32c {got.crc32c}, manifest says {expected.crc32c} (corrupt)")


def check(payload: bytes | memoryview | torch.Tensor | Staged, manifest: Manifest, name: str, where: str) -> None:
    """Raises SnapshotMismatch unless ``payload`` (a file's bytes, or staged) has the
    size and CRC32C the manifest lists for ``name``."""
    expected = _expected(manifest, name, where)
    if isinstance(payload, Staged):
        crc = payload.crc()
    else:
        crc = Crc32c()
        crc.update(_bytes(payload) if isinstance(payload, torch.Tensor) else payload)
    _compare(crc, expected, f"{where}/{name}")


# ---------------------------------------------------------------------------
# The state dict <-> header and tensors
# ---------------------------------------------------------------------------


_WALK = object()


def _tree_map(node: Any, leaf: Callable[[Any], Any]) -> Any:
    """``node`` (dicts, lists, tuples) with each item for which ``leaf`` returns something
    other than ``_WALK`` replaced by that; the others are walked into, or kept."""
    out = leaf(node)
    if out is not _WALK:
        return out
    if isinstance(node, dict):
        return {k: _tree_map(v, leaf) for k, v in node.items()}
    if isinstance(node, list):
        return [_tree_map(v, leaf) for v in node]
    if isinstance(node, tuple):
        return tuple(_tree_map(v, leaf) for v in node)
    return node


def _strip(node: Any, tensors: list[torch.Tensor]) -> Any:
    """``node`` with each tensor replaced by its index in ``tensors`` (appended)."""

    def leaf(n: Any) -> Any:
        if not isinstance(n, torch.Tensor):
            return _WALK
        tensors.append(n.to_local().detach() if isinstance(n, DTensor) else n.detach())
        return _Slot(len(tensors) - 1)

    return _tree_map(node, leaf)


@dataclasses.dataclass(frozen=True)
class _Slot:
    index: int


def _fill(node: Any, refs: list[tuple[Any, ...]]) -> Any:
    return _tree_map(node, lambda n: refs[n.index] if isinstance(n, _Slot) else _WALK)


def _is_ref(node: Any) -> bool:
    return isinstance(node, tuple) and len(node) == 4 and node[0] == TENSOR


def _refs(node: Any) -> list[tuple[int, Any]]:
    """The tensor references of a header, with their offsets, checked for shape."""
    out: list[tuple[int, Any]] = []

    def leaf(n: Any) -> Any:
        if not _is_ref(n):
            return _WALK
        if not isinstance(n[1], int) or n[1] < 0 or not all(isinstance(d, int) and d >= 0 for d in n[3]):
            raise SnapshotMismatch(f"a malformed tensor reference {n[1:]!r}")
        out.append((n[1], n))
        return n

    _tree_map(node, leaf)
    return out


def _ref_layout(ref: tuple[Any, ...]) -> tuple[torch.dtype, torch.Size, int]:
    """A tensor reference's dtype, shape and size in bytes."""
    dtype, shape = _dtype(ref[2]), torch.Size(ref[3])
    return dtype, shape, shape.numel() * torch.empty((), dtype=dtype).element_size()


def _fill_refs(node: Any, tensors: dict[int, torch.Tensor]) -> Any:
    return _tree_map(node, lambda n: tensors[id(n)] if _is_ref(n) else _WALK)


def _layout(tensors: list[torch.Tensor]) -> tuple[list[int], int]:
    offsets, pos = [], 0
    for t in tensors:
        pos += -pos % ALIGN
        offsets.append(pos)
        pos += _nbytes(t)
    return offsets, pos


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: Any) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise SnapshotMismatch(f"unknown dtype {name!r}")
    return dtype


def _bytes(data: Any) -> memoryview:
    """The bytes of a CPU uint8 tensor (or any buffer), without a copy."""
    if isinstance(data, torch.Tensor):
        return memoryview(data.numpy()) if data.numel() else memoryview(b"")
    return memoryview(data).cast("B")


def _write_all(f: Any, view: memoryview) -> None:
    while view.nbytes:
        n = f.write(view)
        view = view[n:]


def _merge(template: Any, saved: Any, path: str, host: bool = False) -> Any:
    """``saved`` shaped as ``template``: DTensors rebuilt around the saved local shards;
    keys, tensor shapes and dtypes must agree. On ``template``'s devices, or with
    ``host`` where ``saved`` is (DTensors with host shards, as DCP's stager makes them)."""
    if isinstance(template, DTensor):
        local = template.to_local()
        if not isinstance(saved, torch.Tensor) or saved.shape != local.shape or saved.dtype != local.dtype:
            raise SnapshotMismatch(f"{path}: {_describe(saved)} in the snapshot, the live shard is {_describe(local)}")
        # from_local would move a host shard to the mesh's device.
        return DTensor(saved, template._spec, requires_grad=False) if host else placed_like(saved, template)
    if isinstance(template, torch.Tensor):
        if not isinstance(saved, torch.Tensor) or saved.shape != template.shape or saved.dtype != template.dtype:
            raise SnapshotMismatch(f"{path}: {_describe(saved)} in the snapshot, live {_describe(template)}")
        return saved if host else saved.to(template.device)
    if isinstance(template, dict):
        if not isinstance(saved, dict) or set(saved) != set(template):
            keys = sorted(map(str, saved)) if isinstance(saved, dict) else type(saved).__name__
            raise SnapshotMismatch(f"{path or '/'}: keys {keys} in the snapshot, live {sorted(map(str, template))}")
        return {k: _merge(template[k], saved[k], f"{path}/{k}", host) for k in template}
    if isinstance(template, (list, tuple)):
        if not isinstance(saved, (list, tuple)) or len(saved) != len(template):
            raise SnapshotMismatch(f"{path}: {_describe(saved)} in the snapshot, live has {len(template)} items")
        items = enumerate(zip(template, saved, strict=True))
        return type(template)(_merge(t, s, f"{path}/{i}", host) for i, (t, s) in items)
    return saved


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape)}"
    return type(value).__name__


def prepare(app_state: Any, saved: Any) -> dict[str, Any]:
    """The state dict to load into ``app_state`` from a snapshot's decoded state dict;
    raises SnapshotMismatch when it does not fit. Changes nothing, unless the caller
    holds ``app_state.loading`` (then a fresh optimizer's state made for the template
    stays until the load, or until ``loading`` is reset)."""
    was = app_state.loading
    app_state.loading = True
    try:
        if isinstance(saved, dict) and hasattr(app_state, "adopt_optimizer_state"):
            app_state.adopt_optimizer_state(saved.get("optim"))  # no init step for the template
        template = app_state.state_dict()
    finally:
        app_state.loading = was
    return _merge(template, saved, "")


# ---------------------------------------------------------------------------
# Moving bytes between ranks (gloo point-to-point)
# ---------------------------------------------------------------------------

_SIZES, _HEAD, _BODY = 1, 2, 3  # p2p tags
#: What one rank sends another: a small head (bytes) and a body (a uint8 tensor).
Message = tuple[bytes, torch.Tensor]
EMPTY: Message = (b"", torch.empty(0, dtype=torch.uint8))


def exchange(
    transfers: list[tuple[int, int]],
    rank: int,
    outgoing: dict[int, Message],
    group: Any,
    into: Callable[[int], torch.Tensor] | None = None,
) -> dict[int, Message]:
    """Point-to-point transfers ``(src, dst)``, the same list on every rank: this rank
    sends ``outgoing[dst]`` for each of its own and returns what it received, by
    source. A sender with nothing to send (:data:`EMPTY`) makes its receiver get an
    empty message. ``into(n)``: the uint8 tensor of at least ``n`` bytes to receive a
    body into (a buffer kept between calls); default a new one."""
    mine_out = [(s, d) for s, d in transfers if s == rank]
    mine_in = [(s, d) for s, d in transfers if d == rank]
    if not mine_out and not mine_in:
        return {}
    peer = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
    sent = {d: outgoing.get(d, EMPTY) for _, d in mine_out}
    sizes_out = {d: torch.tensor([len(h), b.numel()], dtype=torch.int64) for d, (h, b) in sent.items()}
    sizes_in = {s: torch.zeros(2, dtype=torch.int64) for s, _ in mine_in}
    ops = [dist.P2POp(dist.isend, t, peer(d), group, _SIZES) for d, t in sizes_out.items()]
    ops += [dist.P2POp(dist.irecv, t, peer(s), group, _SIZES) for s, t in sizes_in.items()]
    _run(ops)
    heads_in = {s: torch.empty(int(t[0]), dtype=torch.uint8) for s, t in sizes_in.items()}
    bodies_in = {}
    for s, t in sizes_in.items():
        n = int(t[1])
        bodies_in[s] = (into(n) if into is not None and n else torch.empty(n, dtype=torch.uint8))[:n]
    ops = []
    for d, (head, body) in sent.items():
        if head:
            head_t = torch.frombuffer(bytearray(head), dtype=torch.uint8)
            ops.append(dist.P2POp(dist.isend, head_t, peer(d), group, _HEAD))
        if body.numel():
            ops.append(dist.P2POp(dist.isend, body, peer(d), group, _BODY))
    for s in sizes_in:
        if heads_in[s].numel():
            ops.append(dist.P2POp(dist.irecv, heads_in[s], peer(s), group, _HEAD))
        if bodies_in[s].numel():
            ops.append(dist.P2POp(dist.irecv, bodies_in[s], peer(s), group, _BODY))
    _run(ops)
    return {s: (bytes(_bytes(heads_in[s])), bodies_in[s]) for s in sizes_in}


def _run(ops: list[Any]) -> None:
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
