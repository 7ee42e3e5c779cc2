"""The shards are written with O_DIRECT (trainer/checkpoint/writer.py, DirectFile): the
file holds exactly the bytes written, whatever their sizes and flushes; the page cache
is left out (checked with mincore); a file system that refuses O_DIRECT, at the open or
at a write, and a short write still give the complete file, buffered."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import subprocess

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ftfleet.trainer.checkpoint.writer as writer_module
from ftfleet.trainer.checkpoint.commit import storage_files
from ftfleet.trainer.checkpoint.manifest import checksum_file
from ftfleet.trainer.checkpoint.writer import DIRECT_BLOCK, DIRECT_CHUNK, ChecksummingWriter, DirectFile
from tests.trainer.checkpoint.test_streamed_crc import realistic_state
from tests.trainer.conftest import in_process_manager


def _direct(path) -> DirectFile:
    f = DirectFile.open(path)
    if f is None:
        pytest.skip("this file system refuses O_DIRECT")
    return f


def _pieces() -> list[bytes]:
    """Sizes that cross blocks and chunks: tiny, unaligned, one chunk and more."""
    rng = torch.Generator().manual_seed(0)
    sizes = [1, 7, DIRECT_BLOCK - 3, DIRECT_BLOCK, 100_000, DIRECT_CHUNK + 5, 3, 2 * DIRECT_CHUNK - 1, 9_999]
    return [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=rng).numpy().tobytes() for n in sizes]


def _write(f, pieces: list[bytes]) -> None:
    for i, piece in enumerate(pieces):
        assert f.write(memoryview(piece)) == len(piece)
        if i % 2:
            f.flush()  # torch.save flushes after every tensor
    f.finish()
    f.close()


def test_a_direct_file_holds_exactly_the_bytes_written(tmp_path):
    pieces = _pieces()
    f = _direct(tmp_path / "shard.distcp")
    _write(f, pieces)
    assert f.direct  # all but the tail went straight to the device
    assert (tmp_path / "shard.distcp").read_bytes() == b"".join(pieces)
    assert f.tell() == sum(map(len, pieces))


def _resident_pages(path) -> int:
    """Pages of ``path`` in the page cache (mincore over a private mapping nobody touched)."""
    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), vec) != 0:
            pytest.skip(f"mincore failed: {os.strerror(ctypes.get_errno())}")
        return sum(v & 1 for v in vec)


def test_the_page_cache_is_left_out_where_the_buffered_file_fills_it(tmp_path):
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip()
    if fs in ("tmpfs", "ramfs", "zfs"):  # RAM file systems keep every page; ZFS ignores O_DIRECT
        pytest.skip(f"{fs}: no page cache to leave out")
    pieces = _pieces()
    pages = sum(map(len, pieces)) // mmap.PAGESIZE
    _write(_direct(tmp_path / "direct.distcp"), pieces)
    with open(tmp_path / "buffered.distcp", "wb") as f:
        for piece in pieces:
            f.write(piece)
    assert _resident_pages(tmp_path / "buffered.distcp") > pages * 0.9
    assert _resident_pages(tmp_path / "direct.distcp") <= 2  # the tail only, written buffered


def test_a_refused_direct_write_goes_on_buffered(tmp_path, monkeypatch):
    real_write, calls = os.write, []

    def refusing(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(writer_module.os, "write", refusing)
    pieces = _pieces()
    f = _direct(tmp_path / "shard.distcp")
    _write(f, pieces)
    assert not f.direct
    assert (tmp_path / "shard.distcp").read_bytes() == b"".join(pieces)


def test_a_short_direct_write_goes_on_buffered(tmp_path, monkeypatch):
    real_write, calls = os.write, []

    def short(fd, data):
        # The first direct write stops one byte past a block: the block goes direct, the
        # byte buffered (a kernel takes no unaligned direct write), as a device might.
        calls.append(len(data))
        if len(calls) > 1:
            return real_write(fd, data)
        assert real_write(fd, data[:DIRECT_BLOCK]) == DIRECT_BLOCK
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
        assert real_write(fd, data[DIRECT_BLOCK : DIRECT_BLOCK + 1]) == 1
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
        return DIRECT_BLOCK + 1

    monkeypatch.setattr(writer_module.os, "write", short)
    pieces = _pieces()
    f = _direct(tmp_path / "shard.distcp")
    _write(f, pieces)
    assert not f.direct
    assert calls[:2] == [DIRECT_CHUNK, DIRECT_CHUNK - DIRECT_BLOCK - 1]  # the rest, from where it stopped
    assert (tmp_path / "shard.distcp").read_bytes() == b"".join(pieces)


def test_a_file_system_that_refuses_o_direct_gets_the_buffered_file(tmp_path, monkeypatch):
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(writer_module.os, "open", no_direct)
    assert DirectFile.open(tmp_path / "x.distcp") is None
    writer = ChecksummingWriter(tmp_path, thread_count=2)
    metadata = dcp.save(realistic_state(), storage_writer=writer, no_dist=True)
    for name in storage_files(metadata, tmp_path):
        assert writer.streamed()[name] == checksum_file(tmp_path / name), name


def _spy_direct(monkeypatch) -> list[str]:
    """The files DirectFile opened (and could open directly)."""
    opened: list[str] = []
    real = DirectFile.open.__func__

    def spy(cls, path):
        f = real(cls, path)
        if f is not None:
            opened.append(os.path.basename(path))
        return f

    monkeypatch.setattr(DirectFile, "open", classmethod(spy))
    return opened


def test_direct_and_buffered_saves_write_the_same_bytes(tmp_path, monkeypatch):
    opened = _spy_direct(monkeypatch)
    files, state = {}, realistic_state()
    for direct in (True, False):
        where = tmp_path / str(direct)
        writer = ChecksummingWriter(where, thread_count=2, direct_io=direct)
        metadata = dcp.save(state, storage_writer=writer, no_dist=True)
        names = storage_files(metadata, where)
        for name in names:
            assert writer.streamed()[name] == checksum_file(where / name), name
        files[direct] = {name: (where / name).read_bytes() for name in names}
        if direct:
            if not opened:
                pytest.skip("this file system refuses O_DIRECT")
            assert sorted(opened) == sorted(names)  # the shards, not .metadata
    assert len(opened) == len(files[True])  # the buffered save opened none directly
    assert files[True] == files[False]


def test_the_checkpoint_config_reaches_the_writer(tmp_path, monkeypatch):
    opened = _spy_direct(monkeypatch)
    for direct in (False, True):
        ckpt = in_process_manager(tmp_path / str(direct), f"checkpoint.direct_io={str(direct).lower()}")
        try:
            ckpt.save(1, blocking=True)
        finally:
            ckpt.close()
        assert bool(opened) == direct, opened
