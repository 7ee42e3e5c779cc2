"""The fast tier's restore reads each byte once: the reader checks every file's CRC32C
as it reads it (trainer/checkpoint/reader.py), refuses a bad file in one line naming it
before any state changes, and loads exactly what stock DCP loads."""

from __future__ import annotations

import io
import logging
import os
import pickle
import zipfile

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ftfleet.trainer.checkpoint.manifest import checksum_file, read_manifest
from ftfleet.trainer.checkpoint.reader import (
    CorruptFile,
    VerifyingReader,
    _NotPlain,
    _ViewStream,
    leading_span,
    raw_record,
    raw_span,
)
from ftfleet.trainer.checkpoint.safe_load import SafeLoadPlanner, load_into
from ftfleet.trainer.checkpoint.writer import ChecksummingWriter
from tests.trainer.conftest import in_process_manager


def odd_state() -> dict:
    """Layouts the raw copy must not take at face value (non-contiguous storage,
    channels-last), odd dtypes and shapes, and byte items."""
    torch.manual_seed(1)
    return {
        "plain": torch.randn(64, 33),
        "channels_last": torch.randn(4, 3, 5, 5).to(memory_format=torch.channels_last),
        "transposed": torch.randn(20, 30).T,
        "bf16": torch.randn(101, dtype=torch.bfloat16),
        "bool": torch.rand(17) > 0.5,
        "scalar": torch.tensor(2.5),
        "ints": torch.arange(9, dtype=torch.int64),
        "extra": {"name": "run", "steps": [1, 2.5]},
    }


def zeros_like(state: dict) -> dict:
    out = {}
    for k, v in state.items():
        if isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v)
        else:
            out[k] = {"name": "", "steps": []}
    return out


def save(tmp_path, state, threads=2):
    dcp.save(state, storage_writer=ChecksummingWriter(tmp_path, thread_count=threads), no_dist=True)
    return {n: checksum_file(tmp_path / n) for n in os.listdir(tmp_path)}


def load(tmp_path, target, expected, blank=False):
    reader = VerifyingReader(tmp_path, expected, blank=blank)
    reader.check_metadata()
    dcp.load(target, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    return reader


def test_the_reader_loads_exactly_what_stock_dcp_load_loads(tmp_path):
    state = odd_state()
    expected = save(tmp_path, state)
    ours, stock = zeros_like(state), zeros_like(state)
    reader = load(tmp_path, ours, expected)
    dcp.load(stock, storage_reader=dcp.FileSystemReader(tmp_path), no_dist=True)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(ours[key], value) and torch.equal(stock[key], value), key
    assert ours["extra"] == state["extra"]
    # channels-last and the transposed tensor cannot be copied raw: torch.load parses them
    assert reader.fallback == 2 and reader.direct == 5


@pytest.mark.parametrize("piece", [512 << 10, 100, 7])
def test_a_one_pass_load_into_a_blank_state_loads_what_the_two_pass_load_loads(tmp_path, monkeypatch, piece):
    # pieces smaller than the records: a record spans many CRC pieces, a piece several records
    import ftfleet.trainer.checkpoint.reader as reader_module

    monkeypatch.setattr(reader_module, "_PIECE", piece)
    state = odd_state()
    state["big"] = torch.randn(300, 100)
    expected = save(tmp_path, state)
    two, one = zeros_like(state), zeros_like(state)
    load(tmp_path, two, expected)
    reader = load(tmp_path, one, expected, blank=True)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(one[key], value) and torch.equal(two[key], value), key
    assert one["extra"] == state["extra"]
    assert reader.fallback == 2 and reader.direct == 6


def test_an_items_first_bytes_locate_its_storage_where_the_central_directory_does():
    for key, value in odd_state().items():
        if isinstance(value, torch.Tensor) and value.is_contiguous():
            buf = io.BytesIO()
            torch.save(value, buf)
            item = memoryview(buf.getvalue())
            assert leading_span(item, value.clone()) == raw_span(item, value.clone()), key


def test_a_one_pass_load_whose_location_is_wrong_still_loads_the_right_bytes(tmp_path, monkeypatch):
    # the pass copies from where the item's first bytes say; once the file checks out,
    # the central directory is asked again, and an item it places elsewhere is read again
    import ftfleet.trainer.checkpoint.reader as reader_module

    def off_by_eight(item, target):
        start, nbytes = reader_module.raw_span(item, target)
        return start + 8, nbytes

    monkeypatch.setattr(reader_module, "leading_span", off_by_eight)
    state = odd_state()
    expected = save(tmp_path, state)
    target = zeros_like(state)
    load(tmp_path, target, expected, blank=True)
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(target[key], value), key


def test_a_one_pass_load_takes_no_separate_crc_pass(tmp_path, monkeypatch):
    import ftfleet.trainer.checkpoint.reader as reader_module

    state = odd_state()
    expected = save(tmp_path, state)

    check_crc = reader_module._check_crc

    def no_separate_pass(name, view, entry):
        assert name == ".metadata", f"a separate CRC pass over {name}"
        check_crc(name, view, entry)

    monkeypatch.setattr(reader_module, "_check_crc", no_separate_pass)
    target = zeros_like(state)
    load(tmp_path, target, expected, blank=True)
    assert torch.equal(target["plain"], state["plain"])


def test_every_tensor_of_a_checkpoint_loaded_at_its_world_size_is_copied_raw(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16))
    expected = save(tmp_path, {"model": model.state_dict()})
    fresh = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16))
    target = {"model": fresh.state_dict()}
    reader = load(tmp_path, target, expected)
    assert reader.direct == 3 and reader.fallback == 0
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_a_checkpoint_whose_records_carry_torchs_crc32_is_copied_raw_too(tmp_path, monkeypatch):
    """Checkpoints written before the writer left torch.save's CRC32 out read the same
    way."""
    import contextlib

    import ftfleet.trainer.checkpoint.writer as writer_module

    monkeypatch.setattr(writer_module, "without_zip_crc32", contextlib.nullcontext)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16))
    expected = save(tmp_path, {"model": model.state_dict()})
    fresh = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16))
    reader = load(tmp_path, {"model": fresh.state_dict()}, expected)
    assert reader.direct == 3 and reader.fallback == 0
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in model.state_dict().items())


def flip(path, where=0.5):
    raw = bytearray(path.read_bytes())
    raw[int(len(raw) * where)] ^= 0x04
    path.write_bytes(raw)


def last_shard(d):
    return sorted(d.glob("*.distcp"))[-1]


CORRUPTIONS = {
    "a bit flip in the last shard": lambda d: (flip(last_shard(d)), last_shard(d).name)[1],
    "a truncated shard": lambda d: (last_shard(d).write_bytes(last_shard(d).read_bytes()[:-5]), last_shard(d).name)[1],
    "a missing shard": lambda d: (lambda p: (p.unlink(), p.name)[1])(last_shard(d)),
    "a bit flip in .metadata": lambda d: (flip(d / ".metadata", 0.3), ".metadata")[1],
}


def refused(tmp_path, kind, blank=False):
    """A checkpoint with the corruption ``kind``, loaded into zeros: what the load left
    there (it must raise, in one line naming the bad file)."""
    state = odd_state()
    expected = save(tmp_path, state, threads=2)
    bad = CORRUPTIONS[kind](tmp_path)
    target = zeros_like(state)
    with pytest.raises(CorruptFile) as caught:
        load_into(target, tmp_path, expected=expected, blank=blank)
    message = str(caught.value)
    assert message.startswith(f"{bad}: ") and "\n" not in message, message
    return target


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_a_bad_file_is_refused_in_one_line_naming_it_before_any_state_changes(tmp_path, kind):
    target = refused(tmp_path, kind)
    # the first shard was good and read first: nothing of it reached the state either
    for key, value in target.items():
        if isinstance(value, torch.Tensor):
            assert not value.any(), key


@pytest.mark.parametrize("kind", ["a bit flip in the last shard", "a truncated shard", "a bit flip in .metadata"])
def test_a_one_pass_load_refuses_a_bad_file_and_changes_nothing_but_tensor_bytes(tmp_path, kind):
    target = refused(tmp_path, kind, blank=True)
    # byte items and the tensors torch.load parses wait for every file's check
    assert target["extra"] == {"name": "", "steps": []}
    assert not target["channels_last"].any() and not target["transposed"].any()


def test_a_file_the_manifest_does_not_list_is_refused(tmp_path):
    state = odd_state()
    expected = save(tmp_path, state)
    del expected[last_shard(tmp_path).name]
    with pytest.raises(CorruptFile, match=f"^{last_shard(tmp_path).name}: not listed in the manifest"):
        load_into(zeros_like(state), tmp_path, expected=expected)


class _Gadget:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_tensor_record_whose_pickle_calls_anything_else_is_never_unpickled(tmp_path):
    gadget = tmp_path / "gadget-ran"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle.dumps(_Gadget(gadget), protocol=2))
        zf.writestr("archive/version", "3\n")
        zf.writestr("archive/data/0", bytes(16))
    view = memoryview(buf.getvalue())
    with pytest.raises(_NotPlain, match="posix.mkdir|os.mkdir"):
        raw_record(view, torch.zeros(4))
    # and DCP's way, which the reader falls back to (torch.load weights_only), refuses it
    with pytest.raises(pickle.UnpicklingError):
        torch.load(_ViewStream(view), weights_only=True)
    assert not gadget.exists()


def committed(tmp_path, steps=(2, 4)):
    mgr = in_process_manager(tmp_path)
    try:
        for step in steps:
            mgr.app_state.progress.step = step
            with torch.no_grad():
                for p in mgr.app_state.model.parameters():
                    p.add_(1.0)
            mgr.save(step, blocking=True)
    finally:
        mgr.close()
    return mgr


def test_the_manager_skips_a_checkpoint_whose_shard_the_reader_finds_corrupt(tmp_path, caplog):
    committed(tmp_path)
    flip(tmp_path / "step-4" / "__0_0.distcp")
    mgr = in_process_manager(tmp_path)
    reference = in_process_manager(tmp_path / "unused")
    try:
        caplog.clear()  # an earlier test may have left INFO on: only restore's warnings count here
        with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
            found = mgr.restore()
        assert found is not None and found.step == 2
        lines = [
            r.getMessage()
            for r in caplog.records
            if r.name == "ftfleet.ckpt" and r.levelno >= logging.WARNING and "step-4" in r.getMessage()
        ]
        assert len(lines) == 1 and "__0_0.distcp: crc32c" in lines[0] and "skipping" in lines[0], lines
        load_into({"app": reference.app_state}, tmp_path / "step-2")
        for mine, theirs in zip(mgr.app_state.model.parameters(), reference.app_state.model.parameters(), strict=True):
            assert torch.equal(mine, theirs)
    finally:
        mgr.close()
        reference.close()


def test_the_manager_no_longer_reads_the_fast_tier_twice(tmp_path, monkeypatch):
    committed(tmp_path, steps=(2,))
    import ftfleet.trainer.checkpoint.manifest as manifest_module

    def no_separate_pass(path):
        raise AssertionError(f"a separate CRC pass over {path}")

    monkeypatch.setattr(manifest_module, "checksum_file", no_separate_pass)
    mgr = in_process_manager(tmp_path)
    try:
        assert mgr.restore().step == 2
    finally:
        mgr.close()


def test_a_checkpoint_written_by_the_manager_still_loads_with_stock_dcp_load(tmp_path):
    committed(tmp_path, steps=(2,))
    manifest = read_manifest(tmp_path / "step-2")
    assert ".metadata" in manifest.files
    mine = in_process_manager(tmp_path / "unused")
    stock = in_process_manager(tmp_path / "unused2")
    try:
        load_into({"app": mine.app_state}, tmp_path / "step-2", expected=manifest.files)
        state = {"app": stock.app_state}
        dcp.load(state, storage_reader=dcp.FileSystemReader(tmp_path / "step-2"), no_dist=True)
        assert stock.app_state.progress.step == mine.app_state.progress.step == 2
        for a, b in zip(mine.app_state.model.parameters(), stock.app_state.model.parameters(), strict=True):
            assert torch.equal(a, b)
    finally:
        mine.close()
        stock.close()
