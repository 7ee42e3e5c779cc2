"""The in-process launcher across the bed's nodes: a lost node's ranks are taken by a
spare node's warm processes, the survivors never exit, and the run ends bit-identical
to the uninterrupted 2-rank run (``ref2``). The job's stores live on a coordinator node
that trains nothing, as on the fleet."""

from __future__ import annotations

import json

import pytest

from ftfleet.trainer.events import read_events
from tests.multinode.bed import Bed
from tests.multinode.nodes import InprocessJob
from tests.multinode.test_faults import one_generation_commits
from tests.trainer.conftest import BASE, MEMORY, wait_for

pytestmark = pytest.mark.integration

ARGS = [*BASE, *MEMORY, "train.step_events=true", "checkpoint.keep=100"]


def _starts(run_dir):
    return [e for e in read_events(run_dir) if e["event"] == "start"]


@pytest.mark.timeout(240)
def test_a_lost_node_is_replaced_by_a_spare_node_and_the_survivor_never_exits(ref2, tmp_path):
    run_dir = tmp_path / "run"
    with Bed(4) as bed:  # nodes 0, 1 train; node 2 is the spare node; node 3 the coordinator
        job = InprocessJob(bed, run_dir, tmp_path, *ARGS)
        try:
            wait_for(
                lambda: any(e["event"] == "step" and e["step"] >= 10 for e in read_events(run_dir)),
                150,
                what="step 10 on both nodes",
            )
            survivor = job.pids(0)
            bed.lose(1)  # every process of node 1, and its shared memory, at once
            rcs = job.wait(150)
        finally:
            tail = job.log_tail()
        assert rcs[0] == 0 and rcs[2] == 0, f"launchers {rcs}\n{tail}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state_sha256"] == ref2["state_sha256"], tail
    assert summary["resumed_from"]["tier"] == "memory-peer", summary["resumed_from"]  # node 0 held its copy
    starts = _starts(run_dir)
    assert [e["attempt"] for e in starts] == [0, 1], starts
    assert starts[1]["pids"][0] == starts[0]["pids"][0] == survivor[0], "the survivor was replaced"
    assert starts[1]["pids"][1] in job.pids(2).values(), "rank 1 is not the spare node's process"
    assert not one_generation_commits(run_dir)
