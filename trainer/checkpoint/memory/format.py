"""The snapshot file: one rank's whole state in one file, raw tensor bytes behind a
small header.

::

    b"FTFSNAP1" | u64 header length | header | padding | tensor bytes, each 64-aligned

The header is the state dict saved with ``torch.save`` with every tensor replaced by a
reference ``(TENSOR, offset, dtype, shape)`` into the bytes that follow (DTensors as
their local shards), so it loads with ``weights_only=True`` and the tensor bytes are
raw: a snapshot is one copy of the tensors straight into the file (:class:`Stager`,
into the file mapped by the tier; on a GPU into a pinned buffer, then written), and a
restore (:func:`decode`) reads each tensor straight into its own new storage,
checksumming it slice by slice as it reads. ``torch.save`` of the whole state costs
far more: fresh pages for the serialized bytes and their copies
(``bench/snapshot_bench.py``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ftfleet.trainer.checkpoint.manifest import (
    Crc32c,
    Manifest,
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


class SnapshotMismatch(RuntimeError):
    """A snapshot that does not fit the live state (another model, another layout), or
    bytes that are not a complete snapshot."""


def snapshot_file(rank: int) -> str:
    return f"__{rank}.snap"


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
        crc.update(as_bytes(self.data))
        return crc

    def write_to(self, path: Path) -> None:
        """Write the file at ``path``, over the old bytes when it exists (no new pages)."""
        with open(path, "r+b" if path.exists() else "wb", buffering=0) as f:
            _write_all(f, as_bytes(self.data))
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
    :func:`ftfleet.hostenv.host_memory_env` lowers to 4 MiB for trainers: the
    snapshot blocks training for less (``bench/snapshot_bench.py``). Anything else (a
    device tensor, a view that is not contiguous, a conjugate or negative bit, a
    quantized tensor, a subclass) goes through ``copy_``. ctypes releases the GIL for
    the call, as ``copy_`` does."""
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
    return bytes(as_bytes(staged.data))


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
    raw = as_bytes(data)
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
    view = as_bytes(data) if isinstance(data, torch.Tensor) else memoryview(data).cast("B")
    pos = 0

    def read(into: memoryview) -> int:
        nonlocal pos
        n = min(into.nbytes, view.nbytes - pos)
        into[:n] = view[pos : pos + n]
        pos += n
        return n

    return read


def expected_entry(manifest: Manifest, name: str, where: str) -> Any:
    expected = manifest.files.get(name)
    if expected is None:
        raise SnapshotMismatch(f"{where}: the manifest does not list {name}")
    return expected


def compare_crc(crc: Crc32c, expected: Any, where: str) -> None:
    got = crc.entry()
    if got.size != expected.size:
        raise SnapshotMismatch(f"{where}: size {got.size} bytes, manifest says {expected.size} (torn)")
    if got.crc32c != expected.crc32c:
        raise SnapshotMismatch(f"{where}: crc32c {got.crc32c}, manifest says {expected.crc32c} (corrupt)")


def check(payload: bytes | memoryview | torch.Tensor | Staged, manifest: Manifest, name: str, where: str) -> None:
    """Raises SnapshotMismatch unless ``payload`` (a file's bytes, or staged) has the
    size and CRC32C the manifest lists for ``name``."""
    expected = expected_entry(manifest, name, where)
    if isinstance(payload, Staged):
        crc = payload.crc()
    else:
        crc = Crc32c()
        crc.update(as_bytes(payload) if isinstance(payload, torch.Tensor) else payload)
    compare_crc(crc, expected, f"{where}/{name}")


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


def as_bytes(data: Any) -> memoryview:
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
