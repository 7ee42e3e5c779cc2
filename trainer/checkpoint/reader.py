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

A restore into a state that holds no values yet (``blank``: a model built for a restore,
its init deferred; a new optimizer) takes one pass instead of two: each file's CRC32C is
taken in pieces of half a MiB, and each piece's bytes that a tensor wants are copied
into it while the core's cache still holds them (into a CUDA tensor through the pinned
buffers, gathered to their size). The storage's place in each
item is read from the item's first bytes (:func:`leading_span`), which the pass reaches
first; once the file checks out, its central directory confirms each place
(:func:`raw_span`), and an item placed elsewhere is read again the usual way. A file
that fails its check still fails the load on every rank, but may leave those tensors
partly overwritten: the caller initialises them if nothing loads. Byte items, parsed
items and tensors on other accelerators still wait for every file's check.

What this reader does not read, it does not check: a shard no item of this rank's plan
needs is left alone (another rank checks what it reads).
"""

from __future__ import annotations

import collections
import contextlib
import io
import math
import mmap
import os
import pickle
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy
import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from ftfleet.trainer.checkpoint.manifest import FileEntry, crc32c_extend
from ftfleet.trainer.checkpoint.safe_load import SafeFileSystemReader, _MetadataUnpickler

_CHUNK = 16 << 20
#: Bytes per piece of a one-pass restore: CRC'd, then copied out while the core's cache
#: still holds them (the L2 here is 1 MiB per core).
_PIECE = 512 << 10
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


def _check_size(name: str, view: memoryview, expected: FileEntry) -> None:
    if len(view) != expected.size:
        raise CorruptFile(f"{name}: size {len(view)} bytes, manifest says {expected.size} (truncated or overwritten)")


def _check_value(name: str, crc: int, expected: FileEntry) -> None:
    if f"{crc:08x}" != expected.crc32c:
        raise CorruptFile(f"{name}: crc32c {crc:08x}, manifest says {expected.crc32c} (corrupt)")


def _check_crc(name: str, view: memoryview, expected: FileEntry) -> None:
    _check_size(name, view, expected)
    crc = 0
    for off in range(0, len(view), _CHUNK):
        crc = crc32c_extend(crc, view[off : off + _CHUNK])
    _check_value(name, crc, expected)


def read_checked(path: Path, expected: FileEntry) -> bytes:
    """A small file's bytes, once they match ``expected``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorruptFile(f"{path.name}: missing") from None
    _check_crc(path.name, memoryview(data), expected)
    return data


class _Mapped:
    """A file mapped read-only, its size checked and (``check``) its CRC."""

    def __init__(self, path: Path, expected: FileEntry, check: bool = True):
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
            (_check_crc if check else _check_size)(path.name, self.view, expected)
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
    start, nbytes = raw_span(item, target)
    return item[start : start + nbytes]


def raw_span(item: memoryview, target: torch.Tensor) -> tuple[int, int]:
    """Where in ``item`` :func:`raw_record`'s bytes are: (offset, length)."""
    if not target.is_contiguous():
        raise _NotPlain("target not contiguous")
    zf = zipfile.ZipFile(_ViewStream(item))
    names = zf.namelist()
    prefix = names[0].split("/", 1)[0]
    if f"{prefix}/byteorder" in names and _stored(item, zf, f"{prefix}/byteorder") != b"little":
        raise _NotPlain("byte order")
    key = _plain_storage(_stored(item, zf, f"{prefix}/data.pkl"), target)
    start, nbytes = _stored_span(item, zf, f"{prefix}/data/{key}")
    if nbytes != target.numel() * target.element_size():
        raise _NotPlain("record")
    return start, nbytes


def _stored_span(item: memoryview, zf: zipfile.ZipFile, name: str) -> tuple[int, int]:
    """Where in ``item`` the bytes of the record ``name`` are, stored uncompressed:
    (offset, length), or :class:`_NotPlain`."""
    info = zf.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise _NotPlain("record")
    start = _data_start(item, info.header_offset)
    if start + info.file_size > len(item):
        raise _NotPlain("bounds")
    return start, info.file_size


def _stored(item: memoryview, zf: zipfile.ZipFile, name: str) -> bytes:
    """The bytes of the record ``name`` without zipfile's check of its CRC32: the
    checkpoint's writer has torch.save leave it out (writer.py), and the file's CRC32C
    covers these bytes."""
    start, size = _stored_span(item, zf, name)
    return bytes(item[start : start + size])


def _data_start(item: memoryview | bytes, header: int) -> int:
    """Where the data of the record whose local header is at ``header`` starts: 30
    bytes, then the name and the extra field."""
    return (
        header
        + 30
        + int.from_bytes(item[header + 26 : header + 28], "little")
        + int.from_bytes(item[header + 28 : header + 30], "little")
    )


def _plain_storage(pickled: bytes, target: torch.Tensor) -> str:
    """The storage key of a torch.save'd tensor's ``data.pkl`` (``pickled``, or a
    stream of bytes that begins with it) that holds exactly ``target``'s contents in
    its layout, or :class:`_NotPlain`."""
    try:
        record = _RecordUnpickler(io.BytesIO(pickled)).load()
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
    return storage.key


#: How far into an item :func:`leading_span` looks for its storage's record.
_LEAD = 64 << 10
_LOCAL = b"PK\x03\x04"


def leading_span(item: memoryview, target: torch.Tensor) -> tuple[int, int]:
    """:func:`raw_span`'s answer, read from the first bytes of ``item`` only (what a
    sequential pass over the file has reached), or :class:`_NotPlain`. raw_span reads
    the zip's central directory at the item's end; here the local headers at its start
    are searched instead: torch.save writes ``data.pkl`` first, then the storage's
    record, and its writer puts the sizes after each record (in a data descriptor), so
    the storage's record is found by its name. A guess from unchecked bytes: a caller
    compares it with raw_span once the file's CRC has checked out."""
    if not target.is_contiguous():
        raise _NotPlain("target not contiguous")
    window = bytes(item[:_LEAD])
    if window[:4] != _LOCAL:
        raise _NotPlain("local header")
    name = window[30 : 30 + int.from_bytes(window[26:28], "little")]
    if not name.endswith(b"/data.pkl"):
        raise _NotPlain("data.pkl first")
    prefix = name[: -len(b"/data.pkl")]
    key = _plain_storage(window[_data_start(window, 0) :], target)
    wanted = prefix + b"/data/" + key.encode()
    header = _find_record(window, wanted)
    order = _find_record(window, prefix + b"/byteorder", end=header)
    if order >= 0 and not window[_data_start(window, order) :].startswith(b"little"):
        raise _NotPlain("byte order")
    nbytes = target.numel() * target.element_size()
    start = _data_start(window, header)
    if start + nbytes > len(item):
        raise _NotPlain("bounds")
    return start, nbytes


def _find_record(window: bytes, name: bytes, end: int | None = None) -> int:
    """The offset of the local header of the record ``name`` in ``window`` (before
    ``end``); -1 when ``end`` is given and there is none, else :class:`_NotPlain`."""
    at = window.find(name, 30, None if end is None else end + 30 + len(name))
    while at >= 0:
        header = at - 30
        if window[header : header + 4] == _LOCAL and int.from_bytes(window[header + 26 : header + 28], "little") == len(
            name
        ):
            return header
        at = window.find(name, at + 1, None if end is None else end + 30 + len(name))
    if end is not None:
        return -1
    raise _NotPlain("storage record not in the item's first bytes")


class _ToDevice:
    """Copies host bytes into CUDA tensors through two pinned buffers of ``chunk``
    bytes, in turns: a buffer's copy to the device (non-blocking, on the destination
    device's current stream) overlaps the host copy into the other buffer. Bytes
    :meth:`put` in order for one destination gather in a buffer until it is full or the
    run breaks; :meth:`finish` sends what is gathered and waits for every copy (before
    the buffers or the destination are used)."""

    def __init__(self, chunk: int | None = None):
        self.chunk = chunk or DEVICE_CHUNK
        self._buffers: list[torch.Tensor] = []
        self._done: list[Any] = [None, None]
        self._turn = 0
        self._fill = 0  # bytes gathered in the current buffer
        self._dest: torch.Tensor | None = None  # where they go: _dest[_at : _at + _fill]
        self._at = 0

    def copy(self, raw: memoryview, target: torch.Tensor) -> None:
        self.put(target.reshape(-1).view(torch.uint8), 0, raw)
        self.flush()

    def put(self, dest: torch.Tensor, at: int, data: memoryview) -> None:
        """Queue ``data`` for ``dest[at : at + len(data)]`` (``dest``: a flat uint8
        device tensor, the same object for every piece of one destination)."""
        while len(data):
            if self._fill and (dest is not self._dest or at != self._at + self._fill):
                self.flush()
            if not self._fill:
                if not self._buffers:
                    self._buffers = [torch.empty(self.chunk, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
                if self._done[self._turn] is not None:
                    self._done[self._turn].synchronize()  # that buffer's previous copy has left it
                    self._done[self._turn] = None
                self._dest, self._at = dest, at
            n = min(len(data), self.chunk - self._fill)
            buffer = self._buffers[self._turn].numpy()
            numpy.copyto(buffer[self._fill : self._fill + n], numpy.frombuffer(data[:n], dtype=numpy.uint8))
            self._fill += n
            data, at = data[n:], at + n
            if self._fill == self.chunk:
                self.flush()

    def flush(self) -> None:
        """Send the gathered bytes on their way (non-blocking)."""
        if not self._fill or self._dest is None:
            return
        dest, n = self._dest, self._fill
        # The copy goes on the destination device's current stream; the event follows it.
        dest[self._at : self._at + n].copy_(self._buffers[self._turn][:n], non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(dest.device))
        self._done[self._turn] = event
        self._turn ^= 1
        self._fill, self._dest = 0, None

    def finish(self) -> None:
        self.flush()
        for event in self._done:
            if event is not None:
                event.synchronize()
        self._done = [None, None]


class _Job(NamedTuple):
    """A tensor item of a one-pass read: where the item is in its file, and where its
    bytes go."""

    offset: int
    length: int
    target: torch.Tensor
    item: ReadItem


def _crc_and_copy(
    name: str, view: memoryview, expected: FileEntry, jobs: list[_Job], to_device: _ToDevice | None = None
) -> dict[int, int]:
    """Check ``view``'s CRC32C against ``expected``, piece by piece. When the pass
    reaches a job's item, :func:`leading_span` locates its storage's bytes; each piece's
    bytes that a job wants are copied into its target right after the CRC took them,
    while the core's cache holds them (a CUDA target's through ``to_device``'s pinned
    buffers; the caller waits for those copies). Returns, by job index (``jobs`` sorted
    by offset), where in the file each located job's bytes began."""
    located: dict[int, int] = {}
    copies: list[tuple[int, int, Any]] = []  # (start, end, put(offset, bytes)) in file order
    crc, todo, i = 0, 0, 0
    for off in range(0, len(view), _PIECE):
        end = min(off + _PIECE, len(view))
        crc = crc32c_extend(crc, view[off:end])
        while todo < len(jobs) and jobs[todo].offset < end:
            job = jobs[todo]
            try:
                start, nbytes = leading_span(view[job.offset : job.offset + job.length], job.target)
            except (_NotPlain, ValueError):
                pass  # read after the check, the usual way
            else:
                located[todo] = job.offset + start
                copies.append((job.offset + start, job.offset + start + nbytes, _sink(job.target, to_device)))
            todo += 1
        while i < len(copies) and copies[i][0] < end:
            first, last, put = copies[i]
            lo, hi = max(first, off), min(last, end)
            if hi > lo:
                put(lo - first, view[lo:hi])
            if last > end:
                break
            i += 1
    _check_value(name, crc, expected)
    return located


def _sink(target: torch.Tensor, to_device: _ToDevice | None) -> Any:
    """``put(offset, bytes)``: writes bytes into ``target``'s storage at ``offset``."""
    flat = target.reshape(-1).view(torch.uint8)
    if target.device.type == "cuda":
        if to_device is None:
            raise ValueError("a CUDA target needs a _ToDevice")
        return lambda at, data: to_device.put(flat, at, data)
    dest = flat.numpy()
    return lambda at, data: numpy.copyto(dest[at : at + len(data)], numpy.frombuffer(data, dtype=numpy.uint8))


@contextlib.contextmanager
def _unloadable(relative_path: str, item: ReadItem) -> Iterator[None]:
    """An item whose bytes checked out but that ``torch.load(weights_only=True)`` cannot
    load (a record that is no tensor, a global it refuses) makes its file corrupt: the
    checkpoint is skipped like one of the wrong CRC, instead of failing the restore."""
    try:
        yield
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile, KeyError) as exc:
        # Of torch's RuntimeErrors only its archive reader's says the bytes are bad; any
        # other (out of memory) is no verdict on the checkpoint.
        if type(exc) is RuntimeError and "PytorchStreamReader" not in str(exc):
            raise
        raise CorruptFile(
            f"{relative_path}: item {item.storage_index.fqn} does not load ({type(exc).__name__}: {str(exc)[:200]})"
        ) from None


class VerifyingReader(SafeFileSystemReader):
    """A :class:`SafeFileSystemReader` that checks every file it reads against
    ``expected`` (the manifest's entries) as it reads it. ``direct`` and ``fallback``
    count the tensor items copied raw and those parsed by torch.load.

    ``blank``: the state's tensors hold no values yet: one pass per file instead of a
    check, then a copy (the module's docstring says what that gives up)."""

    def __init__(
        self, path: str | os.PathLike[str], expected: dict[str, FileEntry], workers: int = 4, blank: bool = False
    ):
        super().__init__(path)
        self.expected = expected
        self.workers = workers
        self.blank = blank
        self.direct = 0
        self.fallback = 0
        self._mapped: dict[str, _Mapped] = {}
        self._metadata: bytes | None = None
        self._parsed: Metadata | None = None
        self._to_device: _ToDevice | None = None

    def _entry(self, name: str) -> FileEntry:
        if name not in self.expected:
            raise CorruptFile(f"{name}: not listed in the manifest")
        return self.expected[name]

    def check_metadata(self) -> None:
        """Read, check and unpickle ``.metadata`` now, before ``dcp.load``, on every rank
        alike: DCP takes a failing ``read_metadata`` for a missing file and buries the
        reason in its own. Metadata the safe unpickler refuses, or that does not
        unpickle at all, fails like a file of the wrong CRC (:class:`CorruptFile`):
        restore skips that checkpoint, as it skips any other it cannot trust."""
        path = Path(self._get_metadata_path())
        self._metadata = read_checked(path, self._entry(path.name))
        self._parsed = self._unpickle(path, self._metadata)

    @staticmethod
    def _unpickle(path: Path, data: bytes) -> Metadata:
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except Exception as exc:  # noqa: BLE001 - refused, truncated or not a pickle at all
            raise CorruptFile(f"{path.name}: not DCP metadata ({type(exc).__name__}: {str(exc)[:200]})") from None
        if not isinstance(metadata, Metadata):
            raise CorruptFile(f"{path.name}: not DCP metadata ({type(metadata).__name__})")
        return metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self._get_metadata_path(kwargs.get("rank")))
        metadata = self._parsed if path.name == METADATA else None
        if metadata is None:
            metadata = self._unpickle(path, read_checked(path, self._entry(path.name)))
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
            return _Mapped(Path(self.path) / name, self._entry(name), check=not self.blank)

        for name, mapped in self._each(one, todo).items():
            self._mapped[name] = mapped

    def _each(self, fn: Any, names: list[str]) -> dict[str, Any]:
        """``fn(name)`` for each name, on up to ``workers`` threads; the first error is
        raised (after closing every mapping) once all are done."""
        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(names)))) as pool:
            futures = [(n, pool.submit(fn, n)) for n in names]
        done, errors = {}, []
        for name, fut in futures:
            try:
                done[name] = fut.result()
            except BaseException as exc:  # noqa: BLE001 - reported below, the first one
                errors.append(exc)
        if errors:
            for value in done.values():
                if isinstance(value, _Mapped):
                    value.close()
            self.close()
            raise errors[0]
        return done

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        self._map(self._files(plan))
        return super().prepare_local_plan(plan)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        try:
            self._map(self._files(plan))  # the plan DCP settled on may name more files
            items = self._read_in_one_pass(plan, planner) if self.blank else plan.items
            for item in items:
                md = self.storage_data[item.storage_index]
                view = self._mapped[md.relative_path].view[md.offset : md.offset + md.length]
                if item.type == LoadItemType.BYTE_IO:
                    stream = self._stream(item, md, view)
                    with _unloadable(md.relative_path, item):
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

    def _read_in_one_pass(self, plan: LoadPlan, planner: LoadPlanner) -> list[ReadItem]:
        """Check every file of ``plan`` and copy its raw tensor items (host or CUDA) as
        the check reads them (``blank``). Returns the items left for after the check: those the
        pass could not locate or copy, and any whose location, read again from the
        checked file's central directory, is not where the pass copied from."""
        jobs: dict[str, list[_Job]] = {name: [] for name in self._files(plan)}
        rest = []
        for item in plan.items:
            md = self.storage_data[item.storage_index]
            if item.type == LoadItemType.TENSOR and not md.transform_descriptors and not any(item.storage_offsets):
                target = planner.resolve_tensor(item).detach()
                if target.device.type in ("cpu", "cuda"):
                    jobs[md.relative_path].append(_Job(md.offset, md.length, target, item))
                    continue
            rest.append(item)

        def one(name: str) -> tuple[list[_Job], dict[int, int]]:
            batch = sorted(jobs[name], key=lambda job: job.offset)
            to_device = None
            devices = [job.target.device for job in batch if job.target.device.type == "cuda"]
            if devices:
                # This file's pass has a thread of its own, whose current device starts
                # at 0: make it the rank's, or CUDA calls here would make a context on
                # GPU 0 for every rank. One set of pinned buffers per file.
                torch.cuda.set_device(devices[0])
                to_device = _ToDevice()
            try:
                return batch, _crc_and_copy(name, self._mapped[name].view, self._entry(name), batch, to_device)
            finally:
                if to_device is not None:
                    to_device.finish()

        passed = self._each(one, list(jobs))
        for name, (batch, located) in passed.items():
            view = self._mapped[name].view
            for index, job in enumerate(batch):
                start = located.get(index)
                try:
                    exact = (
                        start is not None
                        and raw_span(view[job.offset : job.offset + job.length], job.target)[0] == start - job.offset
                    )
                except (_NotPlain, zipfile.BadZipFile, KeyError, ValueError):
                    exact = False
                if not exact:
                    rest.append(job.item)
                    continue
                planner.commit_tensor(job.item, job.target)
                self.direct += 1
        return rest

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
                _sink(target, None)(0, raw)
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
            with _unloadable(md.relative_path, item):
                loaded = torch.load(stream, map_location="cpu", weights_only=True)
            tensor = narrow_tensor_by_index(loaded, item.storage_offsets, item.lengths)
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
