"""The in-process launcher across the bed's nodes (tests/multinode/nodes.InprocessJob):
each node takes its slot from the job's stores on a coordinator node that trains
nothing, as on the fleet.

* A lost node's ranks are taken by a spare node's warm processes; the survivor never
  exits and the run ends bit-identical to the uninterrupted 2-rank run (``ref2``).
* Without a spare node the round stops; the survivor's launcher stays and joins the
  next round with warm processes, a replacement node joins it too, and the run still
  ends bit-identical (chaos).
* A node told it will go hands its ranks to the spare node: nothing computed again
  (chaos).
* Under HSDP (two nodes of two ranks, one replica group each) a lost node's ranks are
  healed from their live replicas on the other node, with no peer copies (chaos).
* Under HSDP without a spare node, the world shrinks to one replica group and grows
  back when a replacement node boots, every sample consumed once (chaos); on four
  nodes, through a loss and a partition, twice (chaos).

The first is ``make test``'s one multi-node case; the others run in ``make chaos``.
"""

from __future__ import annotations

import json

import pytest

from ftfleet.trainer.events import read_events
from tests.multinode.bed import Bed
from tests.multinode.nodes import InprocessJob
from tests.multinode.test_faults import one_generation_commits
from tests.trainer.conftest import BASE, MEMORY, run_trainer, wait_for

pytestmark = pytest.mark.integration

ARGS = [*BASE, *MEMORY, "train.step_events=true", "checkpoint.keep=100"]


def _starts(run_dir):
    return [e for e in read_events(run_dir) if e["event"] == "start"]


def _warm(log: str) -> list[int]:
    """The pids of the warm processes a launcher started for its next round."""
    lines = [line for line in log.splitlines() if line.startswith("ftfleet.inprocess: warm for the next round")]
    return [int(pid) for pid in lines[-1].split("pids ")[1].split()] if lines else []


def _past(run_dir, step: int) -> bool:
    return any(e["event"] == "step" and e["step"] >= step for e in read_events(run_dir))


def _lose_a_training_node(bed, job, run_dir, timeout: float) -> tuple[dict, dict, dict]:
    """Once both training nodes passed step 10, lose slot 1's node (every process and
    its shared memory at once) and wait for the others' launchers. Returns the pids of
    slot 0 and of the spare node (slot 2) before the loss, and the summary."""
    try:
        slots = job.slots()
        wait_for(lambda: _past(run_dir, 10), timeout, what="step 10 on both nodes")
        survivor, spare = job.pids(slots[0]), job.pids(slots[2])
        bed.lose(slots[1])
        rcs = job.wait(timeout, nodes=[slots[0], slots[2]])
    finally:
        tail = job.log_tail()
    assert rcs[slots[0]] == 0 and rcs[slots[2]] == 0, f"launchers {rcs}\n{tail}"
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["_tail"] = tail
    return survivor, spare, summary


@pytest.mark.timeout(240)
def test_a_lost_node_is_replaced_by_a_spare_node_and_the_survivor_never_exits(ref2, tmp_path):
    run_dir = tmp_path / "run"
    with Bed(4) as bed:  # three nodes take slots 0, 1 (train) and 2 (spare); node 3 is the coordinator
        job = InprocessJob(bed, run_dir, tmp_path, *ARGS)
        survivor, spare, summary = _lose_a_training_node(bed, job, run_dir, 150)
    assert summary["state_sha256"] == ref2["state_sha256"], summary["_tail"]
    assert summary["resumed_from"]["tier"] == "memory-peer", summary["resumed_from"]  # the survivor held its copy
    starts = _starts(run_dir)
    assert [e["attempt"] for e in starts] == [0, 1], starts
    assert starts[1]["pids"][0] == starts[0]["pids"][0] == survivor[0], "the survivor was replaced"
    assert starts[1]["pids"][1] in spare.values(), "rank 1 is not the spare node's process"
    assert not one_generation_commits(run_dir)


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_without_a_spare_the_round_stops_and_the_survivor_rejoins_with_warm_processes(ref2, tmp_path):
    run_dir = tmp_path / "run"
    with Bed(3) as bed:  # nodes 0, 1 train; node 2 is the coordinator
        slow = "faults.step_delay_s=0.3"  # the loss comes after the warm processes started
        job = InprocessJob(bed, run_dir, tmp_path, *ARGS, slow, spare_nodes=0, extra=("--warm-after=1",))
        try:
            slots = job.slots()
            wait_for(lambda: _warm(job.log(slots[0])), 60, what="the survivor's warm processes")
            wait_for(lambda: _past(run_dir, 10), 150, what="step 10 on both nodes")
            warm = _warm(job.log(slots[0]))
            bed.lose(slots[1])
            wait_for(
                lambda: "this node joins the next one" in job.log(slots[0]), 60, what="the survivor leaving round 0"
            )
            job.start(slots[1])  # what the fleet does: a replacement node boots
            rcs = job.wait(150)
        finally:
            tail = job.log_tail()
        assert list(rcs.values()) == [0, 0], f"launchers {rcs}\n{tail}"
        assert job.starts[slots[0]] == 0, "the survivor's launcher was started again"
        assert "round 1, node" in job.log(slots[0]) and "round 1, node" in job.log(slots[1]), tail
        assert set(job.pids(slots[0]).values()) == set(warm), "round 1 did not take the warm processes"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state_sha256"] == ref2["state_sha256"], tail
    assert summary["resumed_from"]["tier"].startswith("memory"), summary["resumed_from"]
    assert not one_generation_commits(run_dir)


@pytest.mark.chaos
@pytest.mark.timeout(240)
def test_a_node_told_it_will_go_hands_its_ranks_to_the_spare_node(ref2, tmp_path):
    """SIGTERM (a notice) to one node: at the boundary the ranks agree on it, every rank
    snapshots that step with its peer copy, the node's process leaves with exit 75 and
    the spare node takes its rank from the copy: nothing computed again."""
    import os
    import signal

    run_dir = tmp_path / "run"
    with Bed(4) as bed:
        job = InprocessJob(bed, run_dir, tmp_path, *ARGS)
        try:
            slots = job.slots()
            wait_for(lambda: _past(run_dir, 10), 150, what="step 10 on both nodes")
            survivor = job.pids(slots[0])
            os.kill(job.launchers[slots[1]].pid, signal.SIGTERM)  # forwarded to its worker
            rcs = job.wait(150)
        finally:
            tail = job.log_tail()
        assert (rcs[slots[0]], rcs[slots[1]], rcs[slots[2]]) == (0, 75, 0), f"launchers {rcs}\n{tail}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state_sha256"] == ref2["state_sha256"], tail
    handoff = next(e for e in read_events(run_dir) if e["event"] == "handoff")
    assert summary["resumed_from"]["step"] == handoff["step"], (summary["resumed_from"], handoff)
    starts = _starts(run_dir)
    assert starts[-1]["pids"][0] == survivor[0], "the survivor was replaced"
    assert not one_generation_commits(run_dir)


#: Two replica groups of two ranks, a node each (ranks 0, 2 and 1, 3 hold the same
#: shards), the global batch divisible by 4, no peer copies.
HSDP = [
    "parallel.replicas=2",
    "train.global_batch_size=12",
    "checkpoint.ranks_per_node=2",
    "checkpoint.memory_peer_every=0",
]


@pytest.mark.chaos
@pytest.mark.timeout(420)
def test_under_hsdp_a_lost_nodes_ranks_heal_from_their_live_replicas(tmp_path):
    straight = run_trainer(4, tmp_path / "straight", *ARGS, *HSDP, timeout=240)
    run_dir = tmp_path / "run"
    with Bed(4) as bed:  # slots 0, 1 train two ranks each; 2 is the spare node; node 3 the coordinator
        job = InprocessJob(bed, run_dir, tmp_path, *ARGS, *HSDP, nproc=2)
        survivors, _, summary = _lose_a_training_node(bed, job, run_dir, 240)  # ranks 2 and 3
    assert summary["state_sha256"] == straight["state_sha256"], summary["_tail"]
    assert summary["resumed_from"]["tier"] == "memory-replica", summary["resumed_from"]
    starts = _starts(run_dir)
    assert [e["attempt"] for e in starts] == [0, 1], starts
    assert starts[1]["pids"][:2] == [survivors[0], survivors[1]], "a survivor was replaced"
    assert not one_generation_commits(run_dir)


#: A world that may shrink by whole replica groups and grow back: HSDP without peer
#: copies, every sample traced. A rank waiting on lost ones in a collective or a peer
#: copy is stuck there until its timeout: kept below the heartbeat timeout (5 s).
SHRINKING = [
    *ARGS,
    *HSDP,
    "faults.step_delay_s=0.25",
    "data.trace_samples=true",
    "parallel.collective_timeout_s=2",
    "checkpoint.memory_timeout_s=3",
]


def _shrinking_job(bed, run_dir, tmp_path, steps: int, nnodes: int, nproc: int) -> InprocessJob:
    """No spare node, ``--min-ranks`` half the ranks and no ``--group-size``: under HSDP
    the world shrinks by a whole replica group, as on the fleet (FTFLEET_NNODES=MIN:MAX)."""
    return InprocessJob(
        bed,
        run_dir,
        tmp_path,
        *SHRINKING,
        f"train.steps={steps}",
        f"checkpoint.ranks_per_node={nproc}",
        nnodes=nnodes,
        nproc=nproc,
        spare_nodes=0,
        heartbeat_timeout=5.0,
        extra=(f"--min-ranks={nnodes * nproc // 2}",),
    )


def _world(run_dir, size: int, starts: int) -> bool:
    """The run's ``starts``-th attempt has begun, at ``size`` ranks."""
    found = _starts(run_dir)
    return len(found) >= starts and found[starts - 1]["world_size"] == size


def _check_shrinks_and_grows(run_dir, steps: int, batch: int, shapes: list[tuple[int, int, int]]) -> list[dict]:
    """The attempts' (world, replica groups, group size), a ``resize`` event for each
    change, a completed run at the full world resumed from the last resize notice's step
    (nothing computed again), every sample consumed once, one generation committing.
    Returns the resize notices."""
    from drill.samples import final_trace
    from tests.trainer.conftest import assert_each_sample_once

    events = list(read_events(run_dir))
    assert [(e["world_size"], e["replica_groups"], e["group_size"]) for e in _starts(run_dir)] == shapes
    resizes = [(e["change"], e["world_size_written"], e["world_size"]) for e in events if e["event"] == "resize"]
    changes = [("shrink" if b[0] < a[0] else "grow", a[0], b[0]) for a, b in zip(shapes, shapes[1:], strict=False)]
    assert resizes == changes, resizes
    notices = [e for e in events if e["event"] == "notice"]
    assert [(n["kind"], n["source"]) for n in notices] == [("resize", "inprocess-round")] * len(notices), notices
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == shapes[-1][0], summary
    assert summary["resumed_from"]["tier"] == "local", summary["resumed_from"]
    assert summary["resumed_from"]["step"] == notices[-1]["step"], (summary["resumed_from"], notices)
    assert summary["samples_seen"] == steps * batch
    assert_each_sample_once(final_trace(run_dir), steps, batch)
    assert not one_generation_commits(run_dir)
    return notices


@pytest.mark.chaos
@pytest.mark.timeout(420)
def test_under_hsdp_a_world_that_shrank_grows_back_when_a_node_boots(tmp_path):
    """Two nodes of two ranks, one replica group each: losing slot 1's node drops its
    group, and slot 0's ranks train on as one group (from the fast tier: the snapshots
    are of the larger world). A replacement node boots; its launcher waits for the next
    round, which the smaller world opens at its next step boundary (a resize notice: a
    committed checkpoint, no node leaving); the world trains on at its full shape from
    that step, and every sample is consumed exactly once."""
    steps, run_dir = 80, tmp_path / "run"
    with Bed(3) as bed:  # slots 0, 1 train two ranks each; node 2 is the coordinator
        job = _shrinking_job(bed, run_dir, tmp_path, steps, nnodes=2, nproc=2)
        try:
            slots = job.slots()
            wait_for(lambda: _past(run_dir, 10), 150, what="step 10 on both nodes")
            bed.lose(slots[1])
            wait_for(lambda: _world(run_dir, 2, 2), 120, what="the smaller world")
            job.start(slots[1])  # capacity returns: a replacement node boots
            rcs = job.wait(240)
        finally:
            tail = job.log_tail()
        assert list(rcs.values()) == [0, 0], f"launchers {rcs}\n{tail}"
        assert job.starts[slots[0]] == 0, "the survivor's launcher was started again"
        assert "resize: a node waits to join" in job.log(slots[0]), tail
    _check_shrinks_and_grows(run_dir, steps, 12, [(4, 2, 2), (2, 1, 2), (4, 2, 2)])


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_under_hsdp_the_world_shrinks_and_grows_back_through_a_loss_and_a_partition(tmp_path):
    """Four nodes of one rank, two replica groups of two nodes, no spare node: a node is
    lost (its group dropped: rank 0's, so the survivors are numbered anew), a replacement
    boots (the world grows back), then a node is cut off (its group dropped again) and,
    once healed and fenced out, its launcher is started again as the fleet would (the
    world grows back again). Every change keeps every sample once; the node cut off
    commits nothing from the others going on without it to its return."""
    steps, run_dir = 120, tmp_path / "run"
    with Bed(5) as bed:  # slots 0-3 train a rank each; node 4 is the coordinator
        if not bed.isolated:
            pytest.skip(f"a partition needs network namespaces: {bed.why_not_isolated}")
        job = _shrinking_job(bed, run_dir, tmp_path, steps, nnodes=4, nproc=1)
        try:
            slots = job.slots()
            wait_for(lambda: _past(run_dir, 10), 150, what="step 10 on every node")
            bed.lose(slots[1])  # ranks 0 and 1 form the first replica group
            wait_for(lambda: _world(run_dir, 2, 2), 120, what="the first smaller world")
            job.start(slots[1])
            wait_for(lambda: _world(run_dir, 4, 3), 150, what="the world grown back")
            grown = max(e["step"] for e in read_events(run_dir) if e["event"] == "step")
            wait_for(lambda: _past(run_dir, grown + 5), 120, what="training at the full world")
            cut = slots[3]  # a bed node: its slot in this round may be another
            bed.partition(cut)
            wait_for(lambda: _world(run_dir, 2, 4), 120, what="the second smaller world")
            went_on = _starts(run_dir)[3]["t"]
            bed.heal(cut)  # it finds itself fenced: its processes end
            waits = "waiting for the next round"
            wait_for(lambda: job.launchers[cut].poll() is not None or waits in job.log(cut), 120, what="the cut node")
            if job.launchers[cut].poll() is not None:
                job.start(cut)  # what the fleet does with a node whose launcher ended
            rcs = job.wait(300)
        finally:
            tail = job.log_tail()
        assert all(rc == 0 for rc in rcs.values()), f"launchers {rcs}\n{tail}"
        # Its snapshots between the others going on without it and its return (the round
        # it rejoined writes its own): a manifest is written last.
        back = _starts(run_dir)[4]["t"]
        late = [m for m in bed[cut].shm.rglob("manifest.json") if went_on < m.stat().st_mtime < back]
        assert not late, f"the node cut off committed after the others went on: {late}"
    shapes = [(4, 2, 2), (2, 1, 2), (4, 2, 2), (2, 1, 2), (4, 2, 2)]
    assert len(_check_shrinks_and_grows(run_dir, steps, 12, shapes)) == 2
