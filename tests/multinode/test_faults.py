"""Faults of a 2-node torchrun job on the bed (tests/multinode/bed.py): a rank killed, a
whole node lost, a node partitioned away and healed, a slow link. Long: chaos only
(``make chaos``).

Every case also checks the run's one-generation rule from its event log: once an
attempt has started (its ``start`` event), no checkpoint is committed by a process of
an earlier attempt (trainer/resilience/fencing).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ftfleet.trainer.events import read_events
from tests.multinode.bed import Bed
from tests.multinode.nodes import Job
from tests.trainer.resilience.torchrun_tree import committed, trained_step, workers

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

#: A node without a keep-alive for 5 s leaves the rendezvous (see torchrun_tree.ElasticNodes).
ELASTIC = "last_call_timeout=5,join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=5"
#: Paced so that faults land mid-run; a collective (training or checkpoint) with a peer
#: gone fails after 15 s.
PACED = [
    "faults.step_delay_s=0.05",
    "parallel.collective_timeout_s=15",
    "checkpoint.timeout_s=15",
    "checkpoint.keep=100",
]


def one_generation_commits(run_dir: Path) -> list[str]:
    """Commits by a process of an attempt older than the newest started one."""
    newest_pid, problems = None, []
    for event in read_events(run_dir):
        if event["event"] == "start":
            newest_pid = event["pid"]
        elif event["event"] == "committed" and event["pid"] != newest_pid:
            problems.append(f"step {event['step']} committed by pid {event['pid']} after pid {newest_pid} started")
    return problems


def worker_of(job: Job, node: int) -> int | None:
    return workers(job.agents[node].pid).get(0)


def training_together(job: Job, past_step: int) -> bool:
    pids = [worker_of(job, n) for n in range(2)]
    return None not in pids and bool(committed(job.run_dir)) and trained_step(job.run_dir, pids) >= past_step


def wait(what: str, predicate, job: Job, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}\n{job.log_tail()}")


@pytest.mark.timeout(300)
def test_a_killed_rank_restarts_both_nodes_and_the_run_ends_bit_identical(ref2, tmp_path):
    run_dir = tmp_path / "run"
    with Bed(2) as bed:
        job = Job(bed, run_dir, tmp_path, *PACED, max_restarts=2)
        wait("both nodes past step 8", lambda: training_together(job, 8), job)
        bed.kill(worker_of(job, 1))
        rcs = job.wait(240)
        assert rcs == [0, 0], f"agents {rcs}\n{job.log_tail()}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["restarts"] >= 1 and summary["state_sha256"] == ref2["state_sha256"]
    assert one_generation_commits(run_dir) == []


@pytest.mark.timeout(300)
def test_a_lost_node_leaves_the_other_to_finish_alone_from_the_newest_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    with Bed(2) as bed:
        job = Job(bed, run_dir, tmp_path, *PACED, nnodes="1:2", max_restarts=2, rdzv_conf=ELASTIC)
        wait("both nodes past step 8", lambda: training_together(job, 8), job)
        at_loss = max(committed(run_dir))
        bed.lose(1)  # every process of node 1 at once, and its shared memory
        rcs = job.wait(240)
        assert rcs[0] == 0, f"agents {rcs}\n{job.log_tail()}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["step"]) == (1, 24)
    assert summary["resumed_from"]["world_size"] == 2 and summary["resumed_from"]["step"] >= at_loss
    assert one_generation_commits(run_dir) == []


@pytest.mark.timeout(420)
def test_a_partitioned_node_is_left_behind_and_commits_nothing_when_it_comes_back(bed_or_skip, tmp_path):
    """Node 1's link goes down: node 0's collective fails, node 1 drops out of the
    rendezvous, and node 0 finishes alone as a newer generation. Then the link comes
    back: node 1's old worker and agent end without committing anything. (Not healed
    mid-run: an agent's restart to admit a returning node sends its workers SIGTERM,
    which they take for a notice; see the report.)"""
    run_dir = tmp_path / "run"
    bed = bed_or_skip
    job = Job(bed, run_dir, tmp_path, *PACED, "train.steps=60", nnodes="1:2", max_restarts=3, rdzv_conf=ELASTIC)
    wait("both nodes past step 8", lambda: training_together(job, 8), job)
    old_pids = {worker_of(job, 0), worker_of(job, 1)}
    bed.partition(1)
    assert job.wait(240, nodes=[0])[0] == 0, job.log_tail()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["step"]) == (1, 60)
    events_before = list(read_events(run_dir))
    bed.heal(1)
    rcs = job.wait(120)
    assert rcs[1] is not None, f"node 1 still running after the heal\n{job.log_tail()}"
    assert list(read_events(run_dir)) == events_before, "written after the heal"
    assert one_generation_commits(run_dir) == []
    starts = [e for e in events_before if e["event"] == "start"]
    assert starts[-1]["world_size"] == 1 and not set(starts[-1]["pids"]) & old_pids


@pytest.mark.timeout(300)
def test_a_slow_link_slows_the_run_but_not_its_result(bed_or_skip, ref2, tmp_path):
    run_dir = tmp_path / "run"
    bed = bed_or_skip
    job = Job(bed, run_dir, tmp_path, *PACED, "train.step_events=true", max_restarts=0)
    wait("both nodes past step 4", lambda: training_together(job, 4), job)
    bed.slow(1, rate="4mbit", burst="64kbit", latency="200ms")
    slowed_after = max(e["step"] for e in read_events(run_dir) if e["event"] == "step") + 1
    rcs = job.wait(240)
    assert rcs == [0, 0], f"agents {rcs}\n{job.log_tail()}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state_sha256"] == ref2["state_sha256"]
    seconds = {e["step"]: e["seconds"] for e in read_events(run_dir) if e["event"] == "step"}
    before = [t for s, t in seconds.items() if 1 < s < slowed_after]  # step 1 pays for the start
    after = [t for s, t in seconds.items() if s > slowed_after]
    assert sum(after) / len(after) > 1.5 * sum(before) / len(before), (before, after)
    assert one_generation_commits(run_dir) == []


@pytest.fixture
def bed_or_skip():
    with Bed(2) as bed:
        if not bed.isolated:
            pytest.skip(f"needs network namespaces to cut or slow a link: {bed.why_not_isolated}")
        yield bed
