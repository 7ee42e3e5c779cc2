"""The in-memory snapshot tier in one process: what is taken for a complete snapshot and
what is skipped (torn, corrupt, foreign), and the ring of copies."""

from __future__ import annotations

import logging

import pytest
import torch

from ftfleet.errors import ConfigError
from ftfleet.trainer.checkpoint.memory import Ring, SnapshotMismatch, prepare, serialize
from ftfleet.trainer.checkpoint.state import state_sha256
from tests.trainer.conftest import in_process_manager


def _manager(tmp_path, *overrides):
    return in_process_manager(
        tmp_path / "ckpt", "checkpoint.memory=true", f"checkpoint.memory_root={tmp_path / 'shm'}", *overrides
    )


def _model_hash(manager) -> str:
    return state_sha256(manager.app_state.model.state_dict())


def _two_snapshots(tmp_path):
    """Snapshots of step 2 and step 4 (different weights); returns the hash of step 2's."""
    m = _manager(tmp_path)
    m.app_state.progress.step = 2
    m.snapshot(2)
    at_2 = _model_hash(m)
    with torch.no_grad():
        for p in m.app_state.model.parameters():
            p.add_(1.0)
    m.app_state.progress.step = 4
    m.snapshot(4)
    assert _model_hash(m) != at_2
    return m.snapshots.tier.own_dir, at_2


def test_the_newest_snapshot_restores_the_state_it_was_taken_from(tmp_path):
    m = _manager(tmp_path)
    m.app_state.progress.step = 3
    m.snapshot(3)
    taken = _model_hash(m)
    fresh = _manager(tmp_path)
    with torch.no_grad():
        for p in fresh.app_state.model.parameters():
            p.mul_(0.5)
    assert _model_hash(fresh) != taken
    found = fresh.restore()
    assert (found.step, found.tier) == (3, "memory")
    assert _model_hash(fresh) == taken and fresh.app_state.progress.step == 3


def test_a_snapshot_without_its_manifest_is_not_listed(tmp_path):
    own, at_2 = _two_snapshots(tmp_path)
    (own / "step-4" / "manifest.json").unlink()  # killed before the manifest's rename
    fresh = _manager(tmp_path)
    assert fresh.restore().step == 2
    assert _model_hash(fresh) == at_2


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_torn_or_corrupt_snapshot_is_skipped_with_a_warning(tmp_path, caplog, damage):
    own, at_2 = _two_snapshots(tmp_path)
    path = own / "step-4" / "__0.pt"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    fresh = _manager(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
        found = fresh.restore()
    assert found.step == 2 and _model_hash(fresh) == at_2
    expected = "(torn)" if damage == "truncate" else "(corrupt)"
    assert any("step 4 of rank 0 (own) skipped" in r.message and expected in r.message for r in caplog.records)


def test_a_snapshot_of_another_config_is_skipped_and_nothing_is_loaded(tmp_path, caplog):
    _two_snapshots(tmp_path)
    other = _manager(tmp_path, "model.d_model=16")
    before = _model_hash(other)
    with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
        assert other.restore() is None
    assert _model_hash(other) == before and other.app_state.progress.step == 0
    assert any("step-4: config hash" in r.message for r in caplog.records)


def test_a_snapshot_that_does_not_fit_the_live_state_is_refused_in_one_line(tmp_path):
    m = _manager(tmp_path)
    payload = serialize(m.app_state)
    other = _manager(tmp_path / "other", "model.d_model=16")
    line = r"^/model/tok_emb.weight: torch.float32 \(64, 32\) in the snapshot, live torch.float32 \(64, 16\)$"
    with pytest.raises(SnapshotMismatch, match=line):
        prepare(other.app_state, payload)
    with pytest.raises(SnapshotMismatch, match="does not load"):
        prepare(m.app_state, b"not a snapshot")


def test_a_newer_checkpoint_on_disk_wins_over_an_older_snapshot(tmp_path):
    m = _manager(tmp_path)
    m.app_state.progress.step = 2
    m.snapshot(2)
    m.app_state.progress.step = 4
    m.save(4, blocking=True)
    found = _manager(tmp_path).restore()
    assert (found.step, found.tier) == (4, "local")


def test_only_the_newest_snapshots_are_kept(tmp_path):
    m = _manager(tmp_path, "checkpoint.memory_keep=1")
    for step in (1, 2, 3):
        m.app_state.progress.step = step
        m.snapshot(step)
    assert [p.name for p in m.snapshots.tier.own_dir.iterdir()] == ["step-3"]


def test_the_ring_gives_each_node_the_next_nodes_copy():
    ring = [Ring(r, 6, 2) for r in range(6)]  # 3 nodes of 2 ranks
    assert [x.peer_of(x.rank) for x in ring] == [2, 3, 4, 5, 0, 1]
    assert [x.holder_of(x.rank) for x in ring] == [4, 5, 0, 1, 2, 3]
    assert all(ring[x.holder_of(x.rank)].peer_of(x.holder_of(x.rank)) == x.rank for x in ring)


@pytest.mark.parametrize(
    "override, fix",
    [("checkpoint.memory_keep=3", "use 1 or 2"), ("checkpoint.ranks_per_node=-1", "use 0")],
)
def test_bad_memory_settings_name_the_fix(tmp_path, override, fix):
    with pytest.raises(ConfigError, match=fix):
        _manager(tmp_path, override)
