"""A checkpoint that fails verification is skipped with one log line naming the bad
file, and the previous good one is used."""

from __future__ import annotations

import json
import logging

import pytest

from ftfleet.trainer.checkpoint.comm import LocalComm
from ftfleet.trainer.checkpoint.manifest import read_manifest
from ftfleet.trainer.checkpoint.restore import HistoryUnreadable, Identity, find_and_prepare
from ftfleet.trainer.checkpoint.tiers import LocalTier
from tests.trainer.conftest import copy_steps, in_process_manager, run_trainer


def flip_bit(path, offset=200):
    raw = bytearray(path.read_bytes())
    raw[offset % len(raw)] ^= 0x10
    path.write_bytes(raw)


def shard(step_dir):
    return sorted(step_dir.glob("*.distcp"))[0]


def drop_entry_file(step_dir):
    m = json.loads((step_dir / "manifest.json").read_text())
    m["files"]["__7_0.distcp"] = {"size": 10, "crc32c": "0badc0de"}
    (step_dir / "manifest.json").write_text(json.dumps(m))
    return "__7_0.distcp"


CORRUPTIONS = {
    "bit flip in a shard": lambda d: (flip_bit(shard(d)), shard(d).name)[1],
    "bit flip in DCP metadata": lambda d: (flip_bit(d / ".metadata", 50), ".metadata")[1],
    "truncated shard": lambda d: (shard(d).write_bytes(shard(d).read_bytes()[:-7]), shard(d).name)[1],
    "missing shard": lambda d: (lambda p: (p.unlink(), p.name)[1])(shard(d)),
    "manifest pointing at a missing file": drop_entry_file,
    "malformed manifest": lambda d: ((d / "manifest.json").write_text('{"format": "ftfl'), "manifest")[1],
}


@pytest.fixture
def three(tmp_path, ref1):
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [20, 22, 24])
    manifest = read_manifest(root / "step-24")
    return root, Identity(manifest.run_id, manifest.config_hash)


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_corrupt_newest_checkpoint_is_skipped_and_the_previous_is_used(three, caplog, kind):
    root, identity = three
    bad_file = CORRUPTIONS[kind](root / "step-24")
    with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
        found = find_and_prepare(LocalComm(), LocalTier(root), [], identity)
    assert found is not None and found.step == 22 and found.tier == "local"
    lines = [r.getMessage() for r in caplog.records if "step-24" in r.getMessage()]
    assert len(lines) == 1 and bad_file in lines[0] and "skipping" in lines[0], lines


def test_a_step_directory_without_manifest_is_not_a_candidate(three, caplog):
    root, identity = three
    (root / "step-24" / "manifest.json").unlink()
    found = find_and_prepare(LocalComm(), LocalTier(root), [], identity)
    assert found.step == 22


def test_when_every_checkpoint_is_bad_none_is_found(three):
    root, identity = three
    for s in (20, 22, 24):
        flip_bit(shard(root / f"step-{s}"))
    assert find_and_prepare(LocalComm(), LocalTier(root), [], identity) is None


def test_a_start_whose_every_checkpoint_is_bad_is_refused_and_changes_nothing(tmp_path):
    """A fresh start would save over the run's history: the manager refuses it, names
    what it found and the ways on, and leaves every byte where it was."""
    root = tmp_path / "ck"
    writer = in_process_manager(root)
    for step in (2, 4):
        writer.app_state.progress.step = step
        writer.save(step, blocking=True)
    writer.close()
    for step in (2, 4):
        path = shard(root / f"step-{step}")
        path.write_bytes(path.read_bytes()[:-7])
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}

    with pytest.raises(HistoryUnreadable) as err:
        in_process_manager(root).restore()
    message = str(err.value)
    assert "\n" not in message and err.value.exit_code == 2
    assert f"step-4, step-2 in the local tier ({root})" in message, message
    assert "checkpoint.load=false" in message and "checkpoint.dir" in message, message
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_a_start_with_no_committed_checkpoint_starts_from_step_0(tmp_path):
    """Debris without a manifest (a first save cut short) is no history."""
    (tmp_path / "ck" / "step-2").mkdir(parents=True)
    (tmp_path / "ck" / "step-2" / "__0_0.distcp").write_bytes(b"partial")
    assert in_process_manager(tmp_path / "ck").restore() is None


@pytest.mark.timeout(120)
def test_trainer_resumes_from_the_previous_checkpoint_and_still_ends_bit_identical(tmp_path, ref1):
    d = tmp_path / "run"
    copy_steps(ref1["run_dir"] / "checkpoints", d / "checkpoints", [20, 22])
    bad = shard(d / "checkpoints" / "step-22")
    flip_bit(bad)
    out = run_trainer(1, d, "resilience.interval.fixed_steps=2")
    assert out["resumed_from"]["step"] == 20
    assert "step-22" in out["_stderr"] and bad.name in out["_stderr"]
    assert out["state_sha256"] == ref1["state_sha256"]


@pytest.mark.timeout(120)
def test_a_restart_whose_every_checkpoint_is_bad_exits_2_with_one_line(tmp_path, ref1):
    d = tmp_path / "run"
    copy_steps(ref1["run_dir"] / "checkpoints", d / "checkpoints", [20, 22])
    for step in (20, 22):
        path = shard(d / "checkpoints" / f"step-{step}")
        flip_bit(path, offset=path.stat().st_size // 2)
    before = {p: p.read_bytes() for p in (d / "checkpoints").rglob("*") if p.is_file()}
    out = run_trainer(1, d, "resilience.interval.fixed_steps=2", expect_rc=2)
    errors = [line for line in out["_stderr"].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "step-22, step-20" in errors[0] and "checkpoint.load=false" in errors[0], errors
    assert out["status"] == "failed" and out["state_sha256"] is None
    assert {p: p.read_bytes() for p in (d / "checkpoints").rglob("*") if p.is_file()} == before
