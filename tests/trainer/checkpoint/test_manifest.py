"""The manifest is the commit record: strict to parse, atomic to write, exact to verify."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from ftfleet.trainer.checkpoint.manifest import (
    FileEntry,
    Manifest,
    ManifestError,
    Milestone,
    assign_files,
    checksum_file,
    read_manifest,
    verify_dir,
    write_manifest,
)
from ftfleet.trainer.checkpoint.retention import debris, steps_to_delete


def make_step(tmp_path, files: dict[str, bytes], step: int = 3) -> tuple:
    d = tmp_path / f"step-{step}"
    d.mkdir()
    for name, data in files.items():
        (d / name).write_bytes(data)
    entries = {name: checksum_file(d / name) for name in files}
    m = Manifest(step=step, run_id="r", config_hash="c", world_size=2, files=entries, torch_version="t")
    write_manifest(d, m)
    return d, m


def test_manifest_round_trips_and_lists_every_file_with_size_and_crc(tmp_path):
    d, m = make_step(tmp_path, {"__0_0.distcp": b"a" * 1000, ".metadata": b"meta"})
    back = read_manifest(d)
    assert back == m
    data = json.loads((d / "manifest.json").read_text())
    assert data["files"]["__0_0.distcp"]["size"] == 1000
    assert set(data) >= {"step", "world_size", "run_id", "config_hash", "torch_version", "ftfleet_version", "files"}
    assert not list(d.glob(".*tmp")), "no temporary file is left behind"


def test_the_commit_is_durable_in_the_step_and_the_tier_directory(tmp_path, monkeypatch):
    import ftfleet.trainer.checkpoint.manifest as manifest_module

    synced = []
    monkeypatch.setattr(manifest_module, "fsync_dir", lambda p: synced.append(p))
    d, _ = make_step(tmp_path, {"f": b"x"})
    assert synced == [d, tmp_path]  # the rename, then the step directory's own entry


def test_a_step_without_manifest_does_not_exist(tmp_path):
    (tmp_path / "step-1").mkdir()
    assert read_manifest(tmp_path / "step-1") is None


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: "{not json",
        lambda d: json.dumps({**d, "format": "other/9"}),
        lambda d: json.dumps({k: v for k, v in d.items() if k != "world_size"}),
        lambda d: json.dumps({**d, "files": {}}),
        lambda d: json.dumps({**d, "files": {"../escape": {"size": 1, "crc32c": "00000000"}}}),
        lambda d: json.dumps({**d, "files": {"x": {"size": -1, "crc32c": "00000000"}}}),
        lambda d: json.dumps({**d, "files": {"a\0b": {"size": 1, "crc32c": "00000000"}}}),
        lambda d: json.dumps({**d, "step": "7"}),
    ],
)
def test_malformed_manifests_are_rejected(tmp_path, mutate):
    d, m = make_step(tmp_path, {"f": b"x"})
    (d / "manifest.json").write_text(mutate(json.loads(m.to_json())))
    with pytest.raises(ManifestError):
        read_manifest(d)


def test_verification_names_the_bad_file_for_flip_truncation_and_absence(tmp_path):
    d, m = make_step(tmp_path, {"a": os.urandom(4096), "b": os.urandom(4096), "c": b"c" * 10})
    assert verify_dir(d, m) == []
    raw = bytearray((d / "a").read_bytes())
    raw[100] ^= 0x01
    (d / "a").write_bytes(raw)
    (d / "b").write_bytes((d / "b").read_bytes()[:-1])
    (d / "c").unlink()
    problems = verify_dir(d, m)
    assert any(p.startswith("a:") and "crc32c" in p for p in problems)
    assert any(p.startswith("b:") and "size" in p for p in problems)
    assert any(p.startswith("c:") and "missing" in p for p in problems)


def test_files_are_split_over_ranks_by_size_deterministically():
    files = {"big": 100, "mid": 60, "small": 50, "tiny": 1}
    split = assign_files(files, 2)
    assert sorted(sum(split, [])) == sorted(files)
    assert split == assign_files(dict(reversed(files.items())), 2)
    assert {"big"} <= set(split[0]) and {"mid", "small"} <= set(split[1])
    assert assign_files(files, 8)[7] == []


def test_retention_keeps_the_newest_k_plus_pinned_and_protected():
    assert steps_to_delete([10, 20, 30, 40, 50], keep=2, pinned=[10]) == [20, 30]
    assert steps_to_delete([10, 20, 30], keep=2, protected=[10]) == []
    assert steps_to_delete([10], keep=2) == []


def test_debris_is_uncommitted_steps_older_than_the_newest_commit():
    assert debris(all_steps=[5, 10, 15, 20, 25], committed=[10, 20]) == [5, 15]


def test_a_milestone_and_its_metrics_round_trip_and_a_manifest_without_them_is_unchanged():
    files = {"a": FileEntry(1, "00000000")}
    plain = Manifest(3, "r", "c", 1, files, "t", created_at=1.0)
    assert "milestone" not in plain.to_json() and "validation" not in plain.to_json()
    assert Manifest.from_json(plain.to_json()) == plain
    marked = dataclasses.replace(
        plain, validation={"loss": 2.5, "acc": 0.25}, milestone=Milestone("loss", "min", 2.5, "best")
    )
    assert Manifest.from_json(marked.to_json()) == marked


@pytest.mark.parametrize(
    "milestone",
    [
        "best",
        {"metric": "loss", "mode": "down", "value": 1.0, "keep": "best"},
        {"metric": "", "mode": "min", "value": 1.0, "keep": "best"},
        {"metric": "loss", "mode": "min", "value": "1", "keep": "best"},
        {"metric": "loss", "mode": "min", "value": 1.0, "keep": "forever"},
        {"metric": "loss", "mode": "min", "value": True, "keep": "best"},
    ],
)
def test_a_malformed_milestone_makes_the_manifest_malformed(milestone):
    data = json.loads(Manifest(3, "r", "c", 1, {"a": FileEntry(1, "00000000")}, "t").to_json())
    data["milestone"] = milestone
    with pytest.raises(ManifestError, match="milestone"):
        Manifest.from_json(json.dumps(data))
    data["milestone"] = None
    data["validation"] = {"loss": "low"}
    with pytest.raises(ManifestError, match="validation"):
        Manifest.from_json(json.dumps(data))
