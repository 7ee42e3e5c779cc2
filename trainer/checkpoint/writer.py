"""DCP's file writer, taking the CRC32C of each file as it writes it.

The manifest needs the size and CRC32C of every file of a checkpoint. Reading the shards
back after DCP wrote them puts a second pass over every byte on the path from ``save()``
to the commit; here the CRC is extended over the bytes on their way into the file
instead, in the writer's own thread (in place, with the GIL released:
:func:`~trainer.checkpoint.manifest.crc32c_extend`).

DCP's :class:`FileSystemWriter` opens every file through ``self.fs.create_stream(path,
"wb")`` and (torch 2.13, read and tested) only appends to it: ``tell()`` and ``write()``
(torch.save into the stream for tensors, raw writes for byte items, pickle for
``.metadata``), then ``flush()``, ``os.fsync(fileno())`` and ``close()``.
:class:`ChecksummingFileSystem` hands it a :class:`CrcStream` that forwards those calls
to the real file. A CRC taken that way is trusted only if the stream was used that way:
any seek, truncate, short write, position that is not the number of bytes written, or
any other call, and a file whose size (``os.fstat`` when it is closed) is not the number
of bytes written, leave a reason instead of an entry, and the commit reads that file
back. So does a shard of this rank that no record covers (a future DCP that opens files
another way). ``.metadata`` is small and always read back.

torch.save also takes a CRC32 of each zip record it writes, in software: a large part
of a save's CPU time (``bench/writer_bench.py``). The manifest's CRC32C covers every
byte of each file already, so
the streams of :class:`ChecksummingFileSystem` have torch leave it out
(:func:`without_zip_crc32`; per thread where torch keeps the setting per thread, as
2.13 does, else for the process while a checkpoint is written). torch.load does not
check it (``torch.serialization.set_crc32_options``), and the reader takes a record's
bytes without zipfile's check.

The shards (``.distcp``) are written with ``O_DIRECT`` where the file system takes it
(:class:`DirectFile`; ``checkpoint.direct_io``): the bytes go from an aligned buffer to
the device, not into the page cache. A checkpoint is written once and read again only
after a failure, so caching it only takes memory from training (a node's page cache
fills with checkpoints, which the kernel must reclaim later), and every byte is copied
into fresh cache pages first. On a virtual machine that hands free memory back to its
host, fresh pages are dear: ``bench/writer_bench.py`` measures the writer both ways.
The bytes are collected into
chunks of :data:`DIRECT_CHUNK`; the last partial block of a file goes through the page
cache, then the file is fsynced. A file system that refuses ``O_DIRECT`` (``EINVAL`` or
``EOPNOTSUPP`` at the open or at a write: tmpfs on older kernels, some FUSE file
systems) gets the usual buffered file.

What a streamed entry vouches for is the bytes handed to ``write()``; the restore
verification reads the files and compares, so anything that changes a file after it was
written (or on the way to the disk) is still caught there.
"""

from __future__ import annotations

import contextvars
import errno
import fcntl
import functools
import io
import mmap
import os
import threading
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.serialization import get_crc32_options, set_crc32_options

from ftfleet.trainer.checkpoint.manifest import Crc32c, FileEntry

#: What a writer learned about one file: its entry, or why there is none.
Streamed = FileEntry | str


@functools.cache
def _crc_option_per_thread() -> bool:
    """Whether torch keeps ``set_crc32_options`` per thread: its config module holds
    each override in a context variable (torch 2.13, read in its source); earlier ones
    hold one value for the process."""
    from torch.utils.serialization import config

    entry = getattr(config, "_config", {}).get("save.compute_crc32")
    return isinstance(getattr(entry, "user_override", None), contextvars.ContextVar)


_ZIP_CRC_LOCK = threading.Lock()
_zip_crc_writers = 0
_zip_crc_before = True


@contextmanager
def without_zip_crc32() -> Generator[None, None, None]:
    """torch.save's CRC32 of each zip record off in the body, then as it was. Where
    torch keeps the setting per thread (2.13), each thread turns it off for itself:
    DCP's writer threads each open their own streams, and nothing changes for the
    caller's other threads. Where it is the process's, the first writer in turns it
    off and the last one out restores it (writers overlap: DCP's threads, an async
    save beside an emergency one), and a ``torch.save`` of the caller's own, running
    meanwhile, also goes without it (its file still loads; ``unzip -t`` would call its
    CRCs wrong)."""
    global _zip_crc_writers, _zip_crc_before
    if _crc_option_per_thread():
        before = get_crc32_options()
        set_crc32_options(False)
        try:
            yield
        finally:
            set_crc32_options(before)
        return
    with _ZIP_CRC_LOCK:
        if _zip_crc_writers == 0:
            _zip_crc_before = get_crc32_options()
            set_crc32_options(False)
        _zip_crc_writers += 1
    try:
        yield
    finally:
        with _ZIP_CRC_LOCK:
            _zip_crc_writers -= 1
            if _zip_crc_writers == 0:
                set_crc32_options(_zip_crc_before)


#: O_DIRECT's alignment of offsets, lengths and memory: a page, which covers the
#: logical block size of the devices and file systems a fast tier runs on (one that asks
#: for more refuses the write, and the file goes on buffered).
DIRECT_BLOCK = 4096
#: Bytes collected in an aligned buffer before each direct write (a larger chunk buys
#: no bandwidth on the disks ``bench/writer_bench.py`` has measured).
DIRECT_CHUNK = 8 << 20
#: What a file system that does not do O_DIRECT answers at the open or the first write.
_REFUSED = (errno.EINVAL, errno.EOPNOTSUPP)
_BUFFERS_LOCK = threading.Lock()
#: Aligned buffers of finished files, for the next ones (fresh memory costs page faults).
_free_buffers: list[mmap.mmap] = []


def _take_buffer() -> mmap.mmap:
    with _BUFFERS_LOCK:
        if _free_buffers:
            return _free_buffers.pop()
    # Page-aligned, as O_DIRECT needs; private, so that a forked child does not share it.
    return mmap.mmap(-1, DIRECT_CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def _give_buffer(buffer: mmap.mmap) -> None:
    with _BUFFERS_LOCK:
        if len(_free_buffers) < 16:  # DCP's writer threads
            _free_buffers.append(buffer)
            return
    buffer.close()


class DirectFile:
    """A new file written with ``O_DIRECT``, append-only like DCP's: ``write()`` copies
    into an aligned buffer, written out a full :data:`DIRECT_CHUNK` at a time (so
    ``flush()``, which torch.save calls after every tensor, writes nothing: on a network
    file system each small synchronous write would wait for the server); :meth:`finish`
    writes the rest, the last partial block through the page cache, and fsyncs. If the
    file system refuses a direct write (``EINVAL``, ``EOPNOTSUPP``), or a write comes
    back short of a whole block, the file goes on buffered."""

    def __init__(self, fd: int, name: str):
        self._fd = fd
        self.name = name
        self._buffer: mmap.mmap | None = _take_buffer()
        self._view = memoryview(self._buffer)
        self._fill = 0
        self._pos = 0
        #: Every whole block so far went straight to the device.
        self.direct = True
        self.closed = False

    @classmethod
    def open(cls, path: str | os.PathLike) -> DirectFile | None:
        """``path`` created (or truncated) for direct writes; None where the file
        system does not take ``O_DIRECT``."""
        direct = getattr(os, "O_DIRECT", 0)
        if not direct:
            return None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | direct, 0o666)
        except OSError as exc:
            if exc.errno in _REFUSED:
                return None
            raise
        try:
            return cls(fd, os.fspath(path))
        except BaseException:
            os.close(fd)
            raise

    def write(self, data: Any) -> int:
        self._check_open()
        src = memoryview(data).cast("B")
        n = len(src)
        while src:
            take = min(len(src), DIRECT_CHUNK - self._fill)
            self._view[self._fill : self._fill + take] = src[:take]
            self._fill += take
            src = src[take:]
            if self._fill == DIRECT_CHUNK:
                self._drain(DIRECT_CHUNK)
        self._pos += n
        return n

    def _drain(self, nbytes: int) -> None:
        """Write the buffer's first ``nbytes`` (whole blocks while direct) and keep the rest."""
        done = 0
        while done < nbytes:
            try:
                n = os.write(self._fd, self._view[done:nbytes])
            except OSError as exc:
                if not (self.direct and exc.errno in _REFUSED):
                    raise
                self._buffered()  # the file system took the open, not the write
                continue
            if n <= 0:
                raise OSError(errno.EIO, f"write of {nbytes - done} bytes to {self.name} wrote nothing")
            done += n
            if self.direct and done % DIRECT_BLOCK and done < nbytes:
                self._buffered()  # a short write left the offset unaligned
        rest = self._fill - nbytes
        if rest:
            self._view[:rest] = self._view[nbytes : self._fill]
        self._fill = rest

    def _buffered(self) -> None:
        """The rest of the file through the page cache."""
        fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        self.direct = False

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"{self.name}: I/O on a closed file")

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        """Nothing: bytes go out a chunk at a time, the rest in :meth:`finish`."""
        self._check_open()

    def fileno(self) -> int:
        return self._fd

    def seekable(self) -> bool:
        return False

    def finish(self) -> None:
        """Write what is left (whole blocks directly, the last partial one through the
        page cache) and fsync."""
        self._check_open()
        whole = self._fill - self._fill % DIRECT_BLOCK
        if whole and self.direct:
            self._drain(whole)
        if self._fill:
            direct = self.direct
            self._buffered()
            self.direct = direct  # the tail is no fallback
            self._drain(self._fill)
        os.fsync(self._fd)

    def close(self) -> None:
        """Without :meth:`finish` (a failed write): the file is closed as it is."""
        if self.closed:
            return
        self.closed = True
        try:
            self._view.release()
            if self._buffer is not None:
                _give_buffer(self._buffer)
                self._buffer = None
        finally:
            os.close(self._fd)

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class CrcStream:
    """A file opened ``"wb"``, seen through the operations DCP uses, keeping the size and
    CRC32C of everything written. ``entry()`` is the result once closed."""

    def __init__(self, raw: io.BufferedIOBase | DirectFile):
        self._raw = raw
        self._crc = Crc32c()
        self._problem: str | None = None
        self._closed = False

    def _distrust(self, why: str) -> None:
        if self._problem is None:
            self._problem = why

    def write(self, data: Any) -> int:
        n = self._raw.write(data)
        length = memoryview(data).nbytes
        if n != length:
            self._distrust(f"short write ({n} of {length} bytes)")
        elif self._problem is None:
            self._crc.update(data)
        return n

    def tell(self) -> int:
        pos = self._raw.tell()
        if pos != self._crc.size:
            self._distrust(f"position {pos} after {self._crc.size} bytes written")
        return pos

    def seek(self, *args: Any) -> int:
        self._distrust("seek()")
        return self._raw.seek(*args)

    def truncate(self, *args: Any) -> int:
        self._distrust("truncate()")
        return self._raw.truncate(*args)

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return self._raw.seekable()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def name(self) -> Any:
        return self._raw.name

    def __getattr__(self, attr: str) -> Any:
        # Anything else goes to the file, and may change it behind the CRC's back.
        if attr.startswith("_"):
            raise AttributeError(attr)
        value = getattr(self._raw, attr)
        self._distrust(f"{attr} used")
        return value

    def fail(self, why: str) -> None:
        """The writer raised with this stream open: no entry."""
        self._distrust(why)

    def close(self) -> None:
        """Idempotent (DCP closes the stream, then leaves the ``with`` that closes it)."""
        if self._closed:
            return
        self._closed = True
        try:
            if isinstance(self._raw, DirectFile):
                if self._problem is not None:  # a failed write: nothing more goes into the file
                    return
                self._raw.finish()
            else:
                self._raw.flush()
            on_disk = os.fstat(self._raw.fileno()).st_size
            if on_disk != self._crc.size:
                self._distrust(f"{on_disk} bytes in the file, {self._crc.size} written")
        except BaseException:
            self._distrust("flush or fstat at close failed")
            raise
        finally:
            self._raw.close()

    def entry(self) -> Streamed:
        if not self._closed:
            return "not closed"
        return self._problem or self._crc.entry()

    def __enter__(self) -> CrcStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ChecksummingFileSystem(FileSystem):
    """DCP's local file system, recording what each file opened ``"wb"`` holds. Writer
    threads record concurrently; :meth:`streamed` is complete once DCP's write (and its
    ``finish``) returned."""

    def __init__(self, direct_io: bool = True) -> None:
        super().__init__()
        self.direct_io = direct_io
        self._lock = threading.Lock()
        self._records: dict[str, Streamed] = {}
        self._reopened: set[str] = set()

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[Any, None, None]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        path = Path(path)
        name = path.name
        with self._lock:
            if name in self._records:
                self._reopened.add(name)
            self._records[name] = "still open"
        direct = DirectFile.open(path) if self.direct_io and name.endswith(".distcp") else None
        with direct or path.open("wb") as raw, without_zip_crc32():
            stream = CrcStream(raw)
            try:
                yield stream
            except BaseException as exc:
                stream.fail(f"the write raised {type(exc).__name__}")
                raise
            finally:
                try:
                    stream.close()
                finally:
                    with self._lock:
                        self._records[name] = "opened more than once" if name in self._reopened else stream.entry()

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self._reopened.clear()

    def streamed(self) -> dict[str, Streamed]:
        """File name -> entry (or the reason there is none), for the files written
        since the last :meth:`clear`."""
        with self._lock:
            return dict(self._records)


class ChecksummingWriter(FileSystemWriter):
    """:class:`FileSystemWriter` whose files are checksummed as they are written;
    :meth:`streamed` gives the result for the last save."""

    def __init__(self, *args: Any, direct_io: bool = True, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fs: ChecksummingFileSystem = ChecksummingFileSystem(direct_io)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(checkpoint_id)  # called by DCP at the start of every save
        self.fs.clear()

    def streamed(self) -> dict[str, Streamed]:
        return self.fs.streamed()
