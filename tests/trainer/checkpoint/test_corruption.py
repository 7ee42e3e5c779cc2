"""A checkpoint that fails verification is skipped with one log line naming the bad
file, and the previous good one is used."""

from __future__ import annotations

import json
import logging

import pytest

from ftfleet.trainer.checkpoint.comm import LocalComm
from ftfleet.trainer.checkpoint.manifest import read_manifest
from ftfleet.trainer.checkpoint.restore import Identity, find_and_prepare
from ftfleet.trainer.checkpoint.tiers import LocalTier
from tests.trainer.conftest import copy_steps, run_trainer


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


def test_when_every_checkpoint_is_bad_training_starts_from_scratch(three):
    root, identity = three
    for s in (20, 22, 24):
        flip_bit(shard(root / f"step-{s}"))
    assert find_and_prepare(LocalComm(), LocalTier(root), [], identity) is None


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
def test_a_restart_whose_every_checkpoint_is_bad_starts_afresh_with_the_usual_init(tmp_path, ref1):
    # The model is built for a restore (no values, the init deferred), so each shard is
    # copied into it as its CRC is taken: the bad ones leave weights overwritten, which
    # the deferred init must replace, for the same result as a run never interrupted.
    d = tmp_path / "run"
    copy_steps(ref1["run_dir"] / "checkpoints", d / "checkpoints", [20, 22])
    for step in (20, 22):
        path = shard(d / "checkpoints" / f"step-{step}")
        flip_bit(path, offset=path.stat().st_size // 2)
    out = run_trainer(1, d, "resilience.interval.fixed_steps=2")
    assert out["resumed_from"] is None
    assert "step-20" in out["_stderr"] and "step-22" in out["_stderr"]
    assert out["state_sha256"] == ref1["state_sha256"]
