"""The shards' CRC32C is taken while DCP writes them (trainer/checkpoint/writer.py): it
must equal the bytes on disk, and anything the stream cannot vouch for is read back."""

from __future__ import annotations

import io
import logging
import os
import threading
import zipfile

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

import ftfleet.trainer.checkpoint.commit as commit_module
from ftfleet.trainer.checkpoint.comm import LocalComm
from ftfleet.trainer.checkpoint.commit import own_entries, storage_files
from ftfleet.trainer.checkpoint.manifest import (
    FileEntry,
    checksum_file,
    crc32c_extend,
    read_manifest,
)
from ftfleet.trainer.checkpoint.restore import Identity, find_and_prepare
from ftfleet.trainer.checkpoint.tiers import LocalTier
from ftfleet.trainer.checkpoint.writer import ChecksummingFileSystem, ChecksummingWriter, CrcStream
from tests.trainer.conftest import in_process_manager


def realistic_state() -> dict:
    """Tensors of several dtypes and sizes (one above the in-place CRC threshold), and
    items DCP writes as BYTE_IO (pickled objects, a BytesIO)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(300, 64), torch.nn.Linear(64, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.arange(10)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "half": torch.randn(1000, dtype=torch.float16),
        "ints": torch.arange(77),
        "extra": {"name": "run", "n": 3, "list": [1, 2.5, "x"], "blob": io.BytesIO(os.urandom(3000))},
    }


@pytest.mark.parametrize("threads", [1, 3])
def test_the_writer_crc_equals_the_file_read_back_for_a_real_dcp_save(tmp_path, threads):
    writer = ChecksummingWriter(tmp_path, thread_count=threads)
    metadata = dcp.save(realistic_state(), storage_writer=writer, no_dist=True)
    streamed = writer.streamed()
    shards = storage_files(metadata, tmp_path)
    assert len(shards) == threads
    assert any(isinstance(md, BytesStorageMetadata) for md in metadata.state_dict_metadata.values())
    for name in shards:
        assert streamed[name] == checksum_file(tmp_path / name), name
    # .metadata goes through the same stream (pickle.dump) under its temporary name.
    assert streamed[".metadata.tmp"] == checksum_file(tmp_path / ".metadata")


def test_torch_saves_own_crc32_is_left_out_of_the_shards_only_while_the_writer_writes(tmp_path):
    """The manifest's CRC32C covers the shards: the zip CRC32 of each record is work
    done twice. It is off in each writer thread while it writes, as it was afterwards
    and in other threads; what was written still loads with stock DCP."""
    from torch.serialization import get_crc32_options, set_crc32_options

    from ftfleet.trainer.checkpoint.writer import without_zip_crc32

    state = realistic_state()
    dcp.save(state, storage_writer=ChecksummingWriter(tmp_path, thread_count=2), no_dist=True)
    assert get_crc32_options() is True
    crcs = []
    metadata = dcp.FileSystemReader(tmp_path).read_metadata()
    for index, where in metadata.storage_data.items():
        if isinstance(metadata.state_dict_metadata[index.fqn], BytesStorageMetadata):
            continue  # some are not torch.save's (a BytesIO is written as its bytes)
        raw = (tmp_path / where.relative_path).read_bytes()[where.offset : where.offset + where.length]
        crcs += [info.CRC for info in zipfile.ZipFile(io.BytesIO(raw)).infolist()]
    assert len(crcs) > 20 and set(crcs) == {0}
    loaded = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}}
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(tmp_path), no_dist=True)
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())

    seen = {}

    def other_thread():
        seen["other"] = get_crc32_options()

    with without_zip_crc32():
        seen["inside"] = get_crc32_options()
        other = threading.Thread(target=other_thread)
        other.start()
        other.join()
    assert seen == {"inside": False, "other": True}  # torch keeps it per thread
    set_crc32_options(False)  # a caller's own choice is kept
    try:
        with without_zip_crc32():
            pass
        assert get_crc32_options() is False
    finally:
        set_crc32_options(True)


def test_where_torch_keeps_the_crc_setting_for_the_process_the_last_writer_out_restores_it(monkeypatch):
    """torch before 2.13 holds one value for the process: overlapping writers (DCP's
    threads, an async save beside an emergency one) must not restore it under each
    other."""
    import ftfleet.trainer.checkpoint.writer as writer_module

    setting = {"crc": True}  # one value for the process, as such a torch keeps it
    monkeypatch.setattr(writer_module, "_crc_option_per_thread", lambda: False)
    monkeypatch.setattr(writer_module, "get_crc32_options", lambda: setting["crc"])
    monkeypatch.setattr(writer_module, "set_crc32_options", lambda on: setting.update(crc=on))
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def first():
        with writer_module.without_zip_crc32():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    def second():
        first_in.wait(5)
        with writer_module.without_zip_crc32():
            second_in.set()
            first_out.wait(5)
            seen.append(setting["crc"])  # the first writer left; this one still writes

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == [False] and setting["crc"] is True


def test_metadata_returned_without_storage_records_is_read_from_the_file(tmp_path):
    """torch 2.11 (seen on an H100, 2.11.0+cu130) returned DCP's metadata with
    ``storage_data`` None; the shard list then comes from the .metadata DCP wrote."""
    import dataclasses

    metadata = dcp.save(realistic_state(), storage_writer=ChecksummingWriter(tmp_path, thread_count=2), no_dist=True)
    bare = dataclasses.replace(metadata, storage_data=None)
    assert storage_files(bare, tmp_path) == storage_files(metadata, tmp_path)
    assert len(storage_files(bare, tmp_path)) == 2
    (tmp_path / ".metadata").unlink()
    with pytest.raises(FileNotFoundError):
        storage_files(bare, tmp_path)


@pytest.mark.parametrize("async_save", ["true", "false"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_commit_reads_back_only_the_metadata(tmp_path, monkeypatch, caplog, async_save, threads):
    reread = []
    real = commit_module.checksum_files
    monkeypatch.setattr(commit_module, "checksum_files", lambda d, names: (reread.extend(names), real(d, names))[1])
    mgr = in_process_manager(tmp_path, f"checkpoint.async_save={async_save}", f"checkpoint.thread_count={threads}")
    try:
        with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
            for step in (2, 4):
                mgr.app_state.progress.step = step
                manifest = mgr.save(step, blocking=True)
                assert sorted(manifest.files) == sorted([".metadata", *(f"__0_{i}.distcp" for i in range(threads))])
                for name, entry in manifest.files.items():
                    assert checksum_file(tmp_path / f"step-{step}" / name) == entry, name
    finally:
        mgr.close()
    assert reread == [".metadata", ".metadata"]
    assert not [r for r in caplog.records if "reading the file back" in r.getMessage()]


@pytest.mark.integration
def test_two_ranks_stream_their_own_shards(ref2):
    """The 2-process reference run: every manifest matches its files read back, and no
    rank had to read a shard back."""
    root = ref2["run_dir"] / "checkpoints"
    steps = sorted(root.glob("step-*"))
    assert steps
    for step_dir in steps:
        manifest = read_manifest(step_dir)
        assert {n.split("_")[2] for n in manifest.files if n.endswith(".distcp")} == {"0", "1"}
        for name, entry in manifest.files.items():
            assert checksum_file(step_dir / name) == entry, (step_dir.name, name)
    assert "reading the file back" not in ref2["_stderr"]


def test_a_shard_corrupted_after_the_write_is_caught_on_restore(tmp_path):
    mgr = in_process_manager(tmp_path)
    try:
        for step in (2, 4):
            mgr.app_state.progress.step = step
            manifest = mgr.save(step, blocking=True)
    finally:
        mgr.close()
    shard = tmp_path / "step-4" / "__0_0.distcp"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(raw)
    found = find_and_prepare(LocalComm(), LocalTier(tmp_path), [], Identity(manifest.run_id, manifest.config_hash))
    assert found is not None and found.step == 2


# --- the stream: what it trusts ----------------------------------------------------


def write_through(path, *chunks):
    """Write as DCP does: appends, tell, flush, fsync, close inside the ``with``."""
    fs = ChecksummingFileSystem()
    with fs.create_stream(path, "wb") as stream:
        for i, chunk in enumerate(chunks):
            stream.write(chunk)
            assert stream.tell() == sum(memoryview(c).nbytes for c in chunks[: i + 1])
        stream.flush()
        os.fsync(stream.fileno())
        stream.close()
    return fs.streamed()[path.name]


def test_appends_of_any_buffer_give_the_crc_of_the_file(tmp_path):
    big = torch.randn(100_000)  # above the in-place threshold; a read-only view as torch.save passes
    chunks = [b"header", bytearray(b"x" * 1000), memoryview(big.numpy()).toreadonly(), b""]
    entry = write_through(tmp_path / "f", *chunks)
    assert entry == checksum_file(tmp_path / "f")
    assert entry.size == 6 + 1000 + 400_000


@pytest.mark.parametrize(
    "meddle,why",
    [
        (lambda s: s.seek(0), "seek"),
        (lambda s: s.seek(0, os.SEEK_END), "seek"),
        (lambda s: s.truncate(2), "truncate"),
        (lambda s: s.writelines([b"zz"]), "writelines"),
        (lambda s: os.write(s.fileno(), b"behind the stream's back"), "bytes in the file"),
    ],
)
def test_a_stream_used_otherwise_than_appending_gives_no_entry(tmp_path, meddle, why):
    fs = ChecksummingFileSystem()
    with fs.create_stream(tmp_path / "f", "wb") as stream:
        stream.write(b"a" * 100)
        stream.flush()
        meddle(stream)
        stream.write(b"b" * 10)
    record = fs.streamed()["f"]
    assert isinstance(record, str) and why in record, record


def test_a_short_write_gives_no_entry(tmp_path):
    class Short(io.BytesIO):
        def write(self, b):
            return super().write(bytes(b)[:1])

    stream = CrcStream(Short())
    stream.write(b"abc")
    assert "short write" in stream._problem


def test_a_write_that_raises_or_a_file_opened_twice_gives_no_entry(tmp_path):
    fs = ChecksummingFileSystem()
    with pytest.raises(RuntimeError):
        with fs.create_stream(tmp_path / "f", "wb") as stream:
            stream.write(b"a")
            raise RuntimeError("disk full")
    assert "raised RuntimeError" in fs.streamed()["f"]
    for _ in range(2):
        with fs.create_stream(tmp_path / "g", "wb") as stream:
            stream.write(b"a")
    assert fs.streamed()["g"] == "opened more than once"
    fs.clear()
    assert fs.streamed() == {}


def test_reads_are_not_recorded(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    fs = ChecksummingFileSystem()
    with fs.create_stream(tmp_path / "f", "rb") as stream:
        assert stream.read() == b"abc"
    assert fs.streamed() == {}


def test_records_of_concurrent_writer_threads(tmp_path):
    fs = ChecksummingFileSystem()
    payloads = {f"__0_{i}.distcp": os.urandom(200_000 + i) for i in range(8)}

    def write(name):
        with fs.create_stream(tmp_path / name, "wb") as stream:
            for k in range(0, len(payloads[name]), 30_000):
                stream.write(memoryview(payloads[name])[k : k + 30_000])

    threads = [threading.Thread(target=write, args=(n,)) for n in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert fs.streamed() == {n: checksum_file(tmp_path / n) for n in payloads}


# --- the commit's use of the records -------------------------------------------------


def test_the_commit_reads_back_what_the_stream_did_not_vouch_for(tmp_path, caplog):
    for name in ("__0_0.distcp", "__0_1.distcp", "__1_0.distcp", ".metadata"):
        (tmp_path / name).write_bytes(os.urandom(5000))
    shards = {"__0_0.distcp": 5000, "__0_1.distcp": 5000, "__1_0.distcp": 5000}
    good = checksum_file(tmp_path / "__0_0.distcp")
    streamed = {"__0_0.distcp": good, "__0_1.distcp": "seek()", "__0_2.distcp": FileEntry(0, "00000000")}
    with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
        entries = own_entries(tmp_path, 0, shards, streamed)
    # Its own files only (by record or prefix), the untrusted one read back, .metadata too;
    # an empty file DCP's metadata does not name is not reported.
    assert entries == {n: checksum_file(tmp_path / n) for n in ("__0_0.distcp", "__0_1.distcp", ".metadata")}
    assert [r.getMessage() for r in caplog.records if r.name == "ftfleet.ckpt"] == [
        f"{tmp_path.name}/__0_1.distcp: no CRC from the write (seek()); reading the file back"
    ]
    # Rank 1 had no records: its prefix's file is read back, quietly.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
        assert own_entries(tmp_path, 1, shards, None) == {"__1_0.distcp": checksum_file(tmp_path / "__1_0.distcp")}
    assert not [r for r in caplog.records if r.name == "ftfleet.ckpt"]


def test_the_commit_refuses_a_file_reported_by_two_ranks(tmp_path):
    from ftfleet.trainer.checkpoint.commit import CommitError, commit_step

    class TwoRanks(LocalComm):
        def gather(self, obj):
            return [obj, obj]

    (tmp_path / "__0_0.distcp").write_bytes(b"x" * 10)
    (tmp_path / ".metadata").write_bytes(b"m")

    class Info:
        relative_path, offset, length = "__0_0.distcp", 0, 10

    class Metadata:
        storage_data = {"k": Info()}

    with pytest.raises(CommitError, match="reported by ranks 0 and 1"):
        commit_step(
            TwoRanks(), tmp_path, 1, Metadata(), None, run_id="r", config_hash="c", torch_version="t", streamed={}
        )
    assert not (tmp_path / "manifest.json").exists()


def test_crc32c_extend_takes_any_buffer_in_pieces():
    data = os.urandom(300_000)
    whole = crc32c_extend(0, data)
    crc = 0
    for k in range(0, len(data), 70_000):
        crc = crc32c_extend(crc, memoryview(bytearray(data))[k : k + 70_000])
    assert crc == whole
    assert crc32c_extend(0, b"123456789") == 0xE3069283
