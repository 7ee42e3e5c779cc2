"""A torchrun job across two network namespaces trains exactly what one machine does.

Each node is a namespace with its own address and shared memory (tests/multinode/bed.py);
the c10d rendezvous and the workers' store live on node 0, gloo runs over the bridge.
The bed's proof of life for torchrun: 2 nodes x 1 rank end bit-identical to the 2-rank
run on one machine (``ref2``); in ``make chaos`` (make test's multi-node case is the
in-process launcher's, tests/multinode/test_inprocess_nodes.py). The faults (a partition healed, a slow link, a
lost node) are chaos cases, in test_faults.py.
"""

from __future__ import annotations

import json

import pytest

from tests.multinode.bed import Bed
from tests.multinode.nodes import Job

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


@pytest.mark.timeout(180)
def test_two_nodes_train_bit_identical_to_one_machine(ref2, tmp_path):
    run_dir = tmp_path / "run"
    with Bed(2) as bed:
        job = Job(bed, run_dir, tmp_path, "checkpoint.keep=100")
        rcs = job.wait(150)
        assert rcs == [0, 0], f"agents {rcs} ({'namespaces' if bed.isolated else 'loopback'})\n{job.log_tail()}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["step"]) == (2, ref2["step"])
    assert summary["state_sha256"] == ref2["state_sha256"]
