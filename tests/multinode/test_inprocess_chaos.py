"""Chaos across nodes for the in-process launcher (``make chaos``): three training nodes
and two spare nodes on the namespace bed, a node lost and, while the others are still
recovering from it, a second node cut off from them. Each loss is taken by a spare node;
the node that never failed keeps its process throughout; the node cut off writes nothing
once the others have gone on without it, and leaves once its link is back; the run ends
bit-identical to the uninterrupted run of the same world (drill/fleet.py's options).
"""

from __future__ import annotations

import json
import time

import pytest

from drill.fleet import FleetJob, FleetOptions, child_env, reference, trainer_overrides
from ftfleet.trainer.events import read_events
from tests.multinode.bed import Bed
from tests.trainer.conftest import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def _last_step(run_dir) -> int:
    return max((e["step"] for e in read_events(run_dir) if e["event"] == "step"), default=-1)


@pytest.mark.timeout(600)
def test_a_lost_node_then_a_partition_during_its_recovery(tmp_path):
    # Six nodes share 2 cores here: timeouts that leave room for a loaded process (a
    # heartbeat or a process group's rendezvous seconds late is not a lost node).
    opts = FleetOptions(nodes=3, spare_nodes=2, workdir=tmp_path, steps=40, collective_timeout_s=5.0)
    want = reference(opts)
    run_dir = tmp_path / "run"
    args = ["--config", str(opts.config), *trainer_overrides(opts, run_dir)]
    with Bed(opts.nodes + opts.spare_nodes + 1) as bed:
        if not bed.isolated:
            pytest.skip(f"a partition needs network namespaces: {bed.why_not_isolated}")
        job = FleetJob(bed, tmp_path, args, nnodes=3, spare_nodes=2, heartbeat_timeout=5.0, env=child_env())
        try:
            slots = job.slots()
            wait_for(lambda: _last_step(run_dir) >= 12, 300, 0.05, what="step 12")
            steady = job.pids(slots[0])
            bed.lose(slots[1])
            time.sleep(2.0)  # the others are waiting out the lost node's heartbeats
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
        starts = [e for e in read_events(run_dir) if e["event"] == "start"]
        cut_off = next(e["t"] for e in starts if e["t"] > t_cut)
        newest = max((f.stat().st_mtime for f in bed[slots[2]].shm.rglob("*") if f.is_file()), default=0.0)
        assert newest <= cut_off, "the node cut off wrote to its memory after the others went on"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state_sha256"] == want, tail
    assert all(s["pids"][0] == steady[0] for s in starts), "the node that never failed lost its process"
    assert len(starts) >= 2
