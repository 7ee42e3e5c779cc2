"""The in-memory snapshot tier end to end through torchrun (2 processes, gloo, simulated
as 2 nodes: checkpoint.ranks_per_node=1).

A run SIGKILLed between durable checkpoints resumes from the snapshots in shared
memory, newer than the disk, and ends bit-identical to the uninterrupted run; with the
killed node's shared memory gone too, its rank restores from the copy its neighbour
holds; at another world size the snapshots are refused and the disk tier reshards.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.trainer.conftest import LOADER_WORKERS, MEMORY, kill9, run_trainer, start_trainer, wait_for

pytestmark = pytest.mark.integration

STEPS = 24


def _newest_everywhere(shm) -> int:
    """The newest step that both ranks' own snapshots and both copies have."""
    dirs = [
        ("node-0", "rank-0"),
        ("node-1", "rank-1"),
        ("node-0", "peer/rank-1"),
        ("node-1", "peer/rank-0"),
    ]
    newest = []
    for node, rank in dirs:
        found = (shm / "ftfleet-t" / node / rank).glob("step-*/manifest.json")
        newest.append(max((int(p.parent.name.removeprefix("step-")) for p in found), default=0))
    return min(newest)


def _killed_between_durable_checkpoints(d, shm):
    """Start the run, SIGKILL every process once both ranks' snapshots and copies reach
    step 10 or later (the newest durable checkpoint is step 8). Returns that step."""
    proc = start_trainer(2, d, *MEMORY, LOADER_WORKERS, env={"FTFLEET_SHM_DIR": str(shm)})
    try:
        wait_for(lambda: _newest_everywhere(shm) >= 10, 90, what="snapshot 10")
    finally:
        kill9(proc)
    disk = (d / "checkpoints").glob("step-*/manifest.json")
    newest_disk = max(int(p.parent.name.removeprefix("step-")) for p in disk)
    snapshot = _newest_everywhere(shm)
    assert snapshot > newest_disk, f"killed too late: snapshot {snapshot}, disk {newest_disk}"
    return snapshot


@pytest.mark.timeout(180)
def test_a_sigkilled_run_resumes_from_its_own_shared_memory_bit_identical(tmp_path, ref2):
    d, shm = tmp_path / "run", tmp_path / "shm"
    snapshot = _killed_between_durable_checkpoints(d, shm)

    out = run_trainer(2, d, *MEMORY, LOADER_WORKERS, env={"FTFLEET_SHM_DIR": str(shm)})
    assert out["resumed_from"]["tier"] == "memory"
    assert out["resumed_from"]["step"] >= snapshot
    assert out["step"] == STEPS
    assert out["state_sha256"] == ref2["state_sha256"]


@pytest.mark.timeout(180)
def test_a_lost_nodes_rank_resumes_from_its_neighbours_copy_bit_identical(tmp_path, ref2):
    d, shm = tmp_path / "run", tmp_path / "shm"
    snapshot = _killed_between_durable_checkpoints(d, shm)
    shutil.rmtree(shm / "ftfleet-t" / "node-1")  # node 1 is gone, and its RAM with it

    out = run_trainer(2, d, *MEMORY, LOADER_WORKERS, env={"FTFLEET_SHM_DIR": str(shm)})
    assert out["resumed_from"]["tier"] == "memory-peer"
    assert out["resumed_from"]["step"] >= snapshot
    assert "ranks [1] from their peers' copies" in out["_stderr"]
    assert out["state_sha256"] == ref2["state_sha256"]


@pytest.mark.timeout(180)
def test_at_another_world_size_the_snapshots_are_refused_and_the_disk_reshards(tmp_path):
    d, shm = tmp_path / "run", tmp_path / "shm"
    env = {"FTFLEET_SHM_DIR": str(shm)}
    first = run_trainer(2, d, *MEMORY, "train.stop_at_step=10", env=env)
    assert first["step"] == 10
    # The one rank of the next run has the snapshot of rank 0 of two: not its to load.
    assert (shm / "ftfleet-t" / "node-0" / "rank-0" / "step-10" / "manifest.json").exists()

    out = run_trainer(1, d, *MEMORY, "train.stop_at_step=12", env=env)
    assert out["resumed_from"] == {"step": 10, "tier": "local", "world_size": 2, "location": str(d / "checkpoints")}
    assert "written by 2 ranks, 1 now (the disk tiers reshard)" in out["_stderr"]
    summary = json.loads((d / "summary.json").read_text())
    assert summary["step"] == 12


#: Four ranks as four nodes under HSDP: replica groups {0, 1} and {2, 3}, so ranks 1 and
#: 3 hold the same shards; no peer copies (the replica is the copy).
HSDP_MEMORY = [
    *MEMORY,
    "parallel.replicas=2",
    "train.global_batch_size=12",
    "train.steps=16",
    "checkpoint.keep=100",
    "checkpoint.memory_peer_every=0",
]


def _newest_own(shm, nodes) -> int:
    newest = []
    for n in nodes:
        found = (shm / "ftfleet-t" / f"node-{n}" / f"rank-{n}").glob("step-*/manifest.json")
        newest.append(max((int(p.parent.name.removeprefix("step-")) for p in found), default=0))
    return min(newest)


@pytest.mark.timeout(300)
def test_a_lost_nodes_rank_heals_from_its_live_replica_under_hsdp_bit_identical(tmp_path):
    straight = run_trainer(4, tmp_path / "straight", *HSDP_MEMORY, timeout=240)
    d, shm = tmp_path / "run", tmp_path / "shm"
    proc = start_trainer(4, d, *HSDP_MEMORY, env={"FTFLEET_SHM_DIR": str(shm)})
    try:
        wait_for(lambda: _newest_own(shm, range(4)) >= 10, 180, what="snapshot 10")
    finally:
        kill9(proc)
    disk = max(int(p.parent.name.removeprefix("step-")) for p in (d / "checkpoints").glob("step-*/manifest.json"))
    snapshot = _newest_own(shm, [0, 2, 3])
    assert snapshot > disk, f"killed too late: snapshot {snapshot}, disk {disk}"
    assert not (shm / "ftfleet-t" / "node-0" / "peer").exists()  # no copies were sent
    shutil.rmtree(shm / "ftfleet-t" / "node-1")  # node 1 is gone, and its RAM with it

    out = run_trainer(4, d, *HSDP_MEMORY, env={"FTFLEET_SHM_DIR": str(shm)}, timeout=240)
    assert out["resumed_from"]["tier"] == "memory-replica"
    assert out["resumed_from"]["step"] >= snapshot - 1
    assert "ranks [1] from their live replicas" in out["_stderr"]
    assert out["state_sha256"] == straight["state_sha256"]
