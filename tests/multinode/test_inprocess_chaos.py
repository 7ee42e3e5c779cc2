"""Chaos across nodes for the in-process launcher (``make chaos``): three training nodes
and two spare nodes on the namespace bed, the job's stores on a coordinator node, the
same world's uninterrupted run as the reference (drill/fleet.py's options).

* One failure after another: a node lost, and once the job trains again, a second node
  cut off. Each is taken by a spare node in place; the node that never failed keeps its
  process throughout; the node cut off writes nothing once the others went on without it.
* A second failure during the recovery from the first: the job still ends bit-identical,
  in place or, when the wrapper's round cannot re-form, through the next round (the test
  plays the fleet: it restarts the launchers that ended and heals the link).
"""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from drill.fleet import FleetJob, FleetOptions, child_env, committed_after, reference, trainer_overrides
from ftfleet.trainer.events import read_events
from tests.multinode.bed import Bed
from tests.trainer.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def _last_step(run_dir) -> int:
    return max((e["step"] for e in read_events(run_dir) if e["event"] == "step"), default=-1)


def _starts(run_dir) -> list[dict]:
    return [e for e in read_events(run_dir) if e["event"] == "start"]


def _options(tmp_path) -> FleetOptions:
    # Six nodes share 2 cores here: timeouts that leave room for a loaded process (a
    # heartbeat or a process group's rendezvous seconds late is not a lost node).
    return FleetOptions(nodes=3, spare_nodes=2, workdir=tmp_path, steps=60, collective_timeout_s=5.0)


@contextlib.contextmanager
def _training(tmp_path):
    """The reference's state, then the job on a bed of six namespaces, past step 12:
    ``(reference sha, bed, job, slot -> bed node, run_dir)``."""
    opts = _options(tmp_path)
    want = reference(opts)
    run_dir = tmp_path / "run"
    with Bed(6) as bed:
        if not bed.isolated:
            pytest.skip(f"a partition needs network namespaces: {bed.why_not_isolated}")
        args = ["--config", str(opts.config), *trainer_overrides(opts, run_dir)]
        job = FleetJob(bed, tmp_path, args, nnodes=3, spare_nodes=2, heartbeat_timeout=5.0, env=child_env())
        slots = job.slots()
        wait_for(lambda: _last_step(run_dir) >= 12, 300, 0.05, what=f"step 12\n{job.log_tail()}")
        yield want, bed, job, slots, run_dir


@pytest.mark.timeout(600)
def test_a_lost_node_then_a_partition_are_each_taken_by_a_spare_node(tmp_path):
    with _training(tmp_path) as (want, bed, job, slots, run_dir):
        try:
            steady = job.pids(slots[0])
            bed.lose(slots[1])
            wait_for(lambda: len(_starts(run_dir)) >= 2, 120, 0.05, what="the first restart")
            resumed = _last_step(run_dir)
            wait_for(lambda: _last_step(run_dir) >= resumed + 5, 120, 0.05, what="training again")
            t_cut = time.time()
            bed.partition(slots[2])
            training = [slots[0], slots[3], slots[4]]
            rcs = job.wait(300, nodes=training)
            assert all(rcs[i] == 0 for i in training), f"launchers {rcs}\n{job.log_tail()}"
            bed.heal(slots[2])
            rcs = job.wait(60, nodes=[slots[2]])
            assert rcs[slots[2]] not in (0, None), f"the node cut off: {rcs[slots[2]]}\n{job.log(slots[2])}"
        finally:
            tail = job.log_tail()
        starts = _starts(run_dir)
        assert len(starts) == 3, f"one in-place restart per failure: {starts}\n{tail}"
        assert not committed_after(bed[slots[2]].shm, starts[-1]["t"]), "the node cut off committed after"
        assert starts[-1]["t"] > t_cut
    assert json.loads((run_dir / "summary.json").read_text())["state_sha256"] == want, tail
    assert all(s["pids"][0] == steady[0] for s in starts), "the node that never failed lost its process"


@pytest.mark.timeout(600)
def test_a_partition_during_the_recovery_from_a_lost_node_still_ends_bit_identical(tmp_path):
    with _training(tmp_path) as (want, bed, job, slots, run_dir):
        try:
            bed.lose(slots[1])
            time.sleep(2.0)  # the others are waiting out the lost node's heartbeats
            bed.partition(slots[2])
            up = [slots[0], slots[3], slots[4]]
            rcs = job.wait(300, nodes=up)
            round_stopped = any(rcs[i] != 0 for i in up)
            bed.heal(slots[2])
            if round_stopped:  # the fleet's part: every node starts again, the lost one anew
                job.wait(60)
                for index in range(5):
                    bed._kill_all(bed[index])  # a launcher still waiting on the old round
                    bed[index].shm.mkdir(mode=0o700, exist_ok=True)
                    job.start(index)
                rcs = job.wait(300)
                assert all(rcs[i] == 0 for i in range(5)), f"launchers {rcs}\n{job.log_tail()}"
        finally:
            tail = job.log_tail()
    assert json.loads((run_dir / "summary.json").read_text())["state_sha256"] == want, tail
