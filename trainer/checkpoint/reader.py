"""DCP's file reader, checking each file's CRC32C as it reads it: one read per byte.

The reading twin of :mod:`ftfleet.trainer.checkpoint.writer`. Before, a restore from
the fast tier read every shard twice: a CRC pass over the files, then DCP's own read,
which lets ``torch.load`` parse each item out of the shard (1.5-1.8x, up to 3x, the
time to read the bytes once). Here:

* ``.metadata`` is read once, checked, and unpickled from those bytes by the
  restricted unpickler of :mod:`~ftfleet.trainer.checkpoint.safe_load`;
* every shard this rank's plan reads is mapped and its CRC32C taken over the mapping
  (sequential read-ahead, the GIL released) in ``prepare_local_plan``: that runs inside
  DCP's planning collective, so a file that is missing, of another size or another CRC
  fails the load on every rank **before any rank copies a byte into its state**;
* each tensor item is then copied from the (now cached) mapped pages straight into its
  destination (on a GPU: through two pinned buffers, each chunk's device copy
  overlapping the next chunk's host copy) when the stored record is exactly that
  tensor: torch.save's zip record holds the raw storage uncompressed, and its
  ``data.pkl`` is read by an unpickler that
  knows four names (the tensor rebuild function, legacy storage classes, OrderedDict)
  and builds nothing. Anything else (resharded slices, non-contiguous or offset
  storage, another dtype, transforms) goes DCP's way, ``torch.load(weights_only=True)``
  on the mapped bytes. Byte items go to the planner's ``load_bytes`` (the safe planner
  loads them with ``weights_only=True``).

What this reader does not read, it does not check: a shard no item of this rank's plan
needs is left alone (another rank checks what it reads).
"""

from __future__ import annotations

import collections
import io
import math
import mmap
import os
import pickle
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy
import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from ftfleet.trainer.checkpoint.manifest import FileEntry, crc32c_extend
from ftfleet.trainer.checkpoint.safe_load import SafeFileSystemReader, UnsafeCheckpointError, _MetadataUnpickler

_CHUNK = 16 << 20
#: Bytes per pinned buffer of a restore into device tensors (two of them).
DEVICE_CHUNK = 16 << 20
#: Aggressive read-ahead for the sequential CRC pass over each mapped shard.
_ADVICE = (mmap.MADV_SEQUENTIAL,)
METADATA = ".metadata"


class CorruptFile(RuntimeError):
    """A checkpoint file that does not match its manifest entry. The message is one
    line, starting with the file's name."""

    def __init__(self, message: str):
        super().__init__(message)


def _check_crc(name: str, view: memoryview, expected: FileEntry) -> None:
    if len(view) != expected.size:
        raise CorruptFile(f"{name}: size {len(view)} bytes, manifest says {expected.size} (truncated or overwritten)")
    crc = 0
    for off in range(0, len(view), _CHUNK):
        crc = crc32c_extend(crc, view[off : off + _CHUNK])
    if f"{crc:08x}" != expected.crc32c:
        raise CorruptFile(f"{name}: crc32c {crc:08x}, manifest says {expected.crc32c} (corrupt)")


def read_checked(path: Path, expected: FileEntry) -> bytes:
    """A small file's bytes, once they match ``expected``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorruptFile(f"{path.name}: missing") from None
    _check_crc(path.name, memoryview(data), expected)
    return data


class _Mapped:
    """A file mapped read-only, its CRC checked."""

    def __init__(self, path: Path, expected: FileEntry):
        self.view = memoryview(b"")
        self._file = None
        self._map: mmap.mmap | None = None
        try:
            self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        except FileNotFoundError:
            raise CorruptFile(f"{path.name}: missing") from None
        try:
            size = os.fstat(self._file.fileno()).st_size
            if size:
                self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
                for advice in _ADVICE:
                    self._map.madvise(advice)
                self.view = memoryview(self._map)
            _check_crc(path.name, self.view, expected)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.view.release()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # an array over it is still alive: unmapped when collected
                pass
        if self._file is not None:
            self._file.close()


class _ViewStream(io.RawIOBase):
    """A seekable read-only stream over a memoryview, without copying it (zipfile and
    torch.load read only the parts they need)."""

    def __init__(self, view: memoryview):
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n


class _NotPlain(Exception):
    """The record is not a plain tensor over a whole storage: load it DCP's way."""


_Storage = collections.namedtuple("_Storage", "dtype key numel")
_Tensor = collections.namedtuple("_Tensor", "storage offset size stride")


def _rebuild(storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> _Tensor:
    return _Tensor(storage, offset, tuple(size), tuple(stride))


class _RecordUnpickler(pickle.Unpickler):
    """Reads what a torch.save of one tensor says about it, and builds nothing."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage") and "." not in name:
            cls = getattr(torch, name, None)
            if isinstance(cls, type) and issubclass(cls, torch.storage.TypedStorage):
                return cls
        raise _NotPlain(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _NotPlain("storage id")
        _, cls, key, _location, numel = pid
        return _Storage(cls._dtype, str(key), int(numel))  # .dtype warns of deprecation


def _contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for dim in reversed(size):
        strides.append(acc)
        acc *= max(dim, 1)
    return tuple(reversed(strides))


def raw_record(item: memoryview, target: torch.Tensor) -> memoryview:
    """The bytes of ``item`` (one torch.save'd tensor) that are exactly ``target``'s
    contents in its layout, or :class:`_NotPlain`."""
    if not target.is_contiguous():
        raise _NotPlain("target not contiguous")
    zf = zipfile.ZipFile(_ViewStream(item))
    names = zf.namelist()
    prefix = names[0].split("/", 1)[0]
    if f"{prefix}/byteorder" in names and zf.read(f"{prefix}/byteorder") != b"little":
        raise _NotPlain("byte order")
    try:
        record = _RecordUnpickler(io.BytesIO(zf.read(f"{prefix}/data.pkl"))).load()
    except _NotPlain:
        raise
    except Exception as exc:  # noqa: BLE001 - let torch.load judge (and name) it
        raise _NotPlain(f"data.pkl: {exc}") from None
    if not isinstance(record, _Tensor):
        raise _NotPlain("not a tensor")
    storage = record.storage
    if (
        record.offset != 0
        or storage.dtype != target.dtype
        or record.size != tuple(target.shape)
        or storage.numel != math.prod(record.size)
        or (record.stride != _contiguous_strides(record.size) and target.numel() > 1)
    ):
        raise _NotPlain("layout")
    info = zf.getinfo(f"{prefix}/data/{storage.key}")
    nbytes = target.numel() * target.element_size()
    if info.compress_type != zipfile.ZIP_STORED or info.file_size != nbytes:
        raise _NotPlain("record")
    # the local file header: 30 bytes, then the name and the extra field, then the data
    h = info.header_offset
    start = h + 30 + int.from_bytes(item[h + 26 : h + 28], "little") + int.from_bytes(item[h + 28 : h + 30], "little")
    if start + nbytes > len(item):
        raise _NotPlain("bounds")
    return item[start : start + nbytes]


class _ToDevice:
    """Copies host bytes into CUDA tensors through two pinned buffers of ``chunk``
    bytes, in turns: a chunk's copy to the device (non-blocking, on the
    current stream) overlaps the host copy of the next one into the other buffer.
    :meth:`finish` waits for the last copies (before the buffers or the source go)."""

    def __init__(self, chunk: int | None = None):
        self.chunk = chunk or DEVICE_CHUNK
        self._buffers: list[torch.Tensor] = []
        self._done: list[Any] = [None, None]
        self._turn = 0

    def copy(self, raw: memoryview, target: torch.Tensor) -> None:
        if not self._buffers:
            self._buffers = [torch.empty(self.chunk, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
        dest = target.reshape(-1).view(torch.uint8)
        for off in range(0, len(raw), self.chunk):
            n = min(self.chunk, len(raw) - off)
            turn, self._turn = self._turn, self._turn ^ 1
            if self._done[turn] is not None:
                self._done[turn].synchronize()  # that buffer's previous copy has left it
            buffer = self._buffers[turn]
            numpy.copyto(buffer.numpy()[:n], numpy.frombuffer(raw[off : off + n], dtype=numpy.uint8))
            dest[off : off + n].copy_(buffer[:n], non_blocking=True)
            self._done[turn] = torch.cuda.Event()
            self._done[turn].record()

    def finish(self) -> None:
        for event in self._done:
            if event is not None:
                event.synchronize()
        self._done = [None, None]


class VerifyingReader(SafeFileSystemReader):
    """A :class:`SafeFileSystemReader` that checks every file it reads against
    ``expected`` (the manifest's entries) as it reads it. ``direct`` and ``fallback``
    count the tensor items copied raw and those parsed by torch.load."""

    def __init__(self, path: str | os.PathLike[str], expected: dict[str, FileEntry], workers: int = 4):
        super().__init__(path)
        self.expected = expected
        self.workers = workers
        self.direct = 0
        self.fallback = 0
        self._mapped: dict[str, _Mapped] = {}
        self._metadata: bytes | None = None
        self._to_device: _ToDevice | None = None

    def _entry(self, name: str) -> FileEntry:
        if name not in self.expected:
            raise CorruptFile(f"{name}: not listed in the manifest")
        return self.expected[name]

    def check_metadata(self) -> None:
        """Read and check ``.metadata`` now. Called before ``dcp.load``: DCP takes a
        failing ``read_metadata`` for a missing file and buries the reason in its own."""
        path = Path(self._get_metadata_path())
        self._metadata = read_checked(path, self._entry(path.name))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        data = self._metadata if path.name == METADATA else None
        if data is None:
            data = read_checked(path, self._entry(path.name))
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        if not isinstance(metadata, Metadata):
            raise UnsafeCheckpointError(f"{path} does not hold DCP metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _files(self, plan: LoadPlan) -> list[str]:
        return sorted({self.storage_data[item.storage_index].relative_path for item in plan.items})

    def _map(self, names: list[str]) -> None:
        todo = [n for n in names if n not in self._mapped]
        if not todo:
            return

        def one(name: str) -> _Mapped:
            return _Mapped(Path(self.path) / name, self._entry(name))

        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(todo)))) as pool:
            futures = [(n, pool.submit(one, n)) for n in todo]
        errors = []
        for name, fut in futures:
            try:
                self._mapped[name] = fut.result()
            except BaseException as exc:  # noqa: BLE001 - reported below, the first one
                errors.append(exc)
        if errors:
            self.close()
            raise errors[0]

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        self._map(self._files(plan))
        return super().prepare_local_plan(plan)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        try:
            self._map(self._files(plan))  # the plan DCP settled on may name more files
            for item in plan.items:
                md = self.storage_data[item.storage_index]
                view = self._mapped[md.relative_path].view[md.offset : md.offset + md.length]
                if item.type == LoadItemType.BYTE_IO:
                    stream = self._stream(item, md, view)
                    planner.load_bytes(item, io.BytesIO(stream.read()))
                else:
                    self._read_tensor(item, view, md, planner)
        finally:
            if self._to_device is not None:
                self._to_device.finish()
            self.close()
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _stream(self, item: ReadItem, md: Any, view: memoryview) -> Any:
        return self.transforms.transform_load_stream(item, md.transform_descriptors or (), _ViewStream(view))

    def _read_tensor(self, item: ReadItem, view: memoryview, md: Any, planner: LoadPlanner) -> None:
        target = planner.resolve_tensor(item).detach()
        raw = None
        if not md.transform_descriptors and not any(item.storage_offsets):
            try:
                raw = raw_record(view, target)
            except (_NotPlain, zipfile.BadZipFile, KeyError, ValueError):
                raw = None
        if raw is not None:
            if len(raw) and target.device.type == "cpu":
                destination = target.reshape(-1).view(torch.uint8).numpy()
                numpy.copyto(destination, numpy.frombuffer(raw, dtype=numpy.uint8))
            elif len(raw) and target.device.type == "cuda":
                self._to_device = self._to_device or _ToDevice()
                self._to_device.copy(raw, target)
            elif len(raw):  # another accelerator: one blocking copy from host memory
                target.reshape(-1).view(torch.uint8).copy_(torch.from_numpy(numpy.frombuffer(raw, numpy.uint8).copy()))
            self.direct += 1
        else:
            stream = self._stream(item, md, view)
            if not stream.seekable():
                stream = io.BytesIO(stream.read())
            tensor = narrow_tensor_by_index(
                torch.load(stream, map_location="cpu", weights_only=True), item.storage_offsets, item.lengths
            )
            if target.size() != tensor.size():
                raise CorruptFile(
                    f"{md.relative_path}: item {item.storage_index.fqn} has shape {list(tensor.size())}, "
                    f"the metadata says {list(target.size())}"
                )
            target.copy_(tensor)
            self.fallback += 1
        planner.commit_tensor(item, target)

    def close(self) -> None:
        mapped, self._mapped = self._mapped, {}
        for m in mapped.values():
            m.close()
