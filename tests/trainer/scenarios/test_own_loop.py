"""The library in a loop of the user's own: examples/own_loop.py, the README's example,
run as the image runs a training program (its entrypoint, torchrun, 2 processes),
preempted through the fake metadata service."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from drill.fake_metadata import FakeMetadataServer
from ftfleet.contract import EXIT_PREEMPTED, CommitMarker, marker_key
from ftfleet.trainer.checkpoint.manifest import read_manifest, verify_dir
from tests.trainer.conftest import BIN, REPO, child_env, free_port_pair, wait_for

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "own_loop.py"


def test_the_own_loop_example_turns_a_spot_notice_into_a_committed_checkpoint_and_exit_75(tmp_path):
    ckpt = tmp_path / "ckpt"
    with FakeMetadataServer() as metadata:
        env = child_env(
            {
                "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                "TMPDIR": str(tmp_path),
                "FTFLEET_RUN_ID": "own-loop",
                "FTFLEET_CONFIG": "unused",  # the contract's; the example reads none
                "FTFLEET_CLOUD": "aws",
                "FTFLEET_METADATA_ENDPOINT": metadata.url,
                "FTFLEET_CKPT_DIR": str(ckpt),
                "FTFLEET_NNODES": "1",
                "FTFLEET_NPROC_PER_NODE": "2",
                "FTFLEET_RDZV_ENDPOINT": f"127.0.0.1:{free_port_pair()}",
                "FTFLEET_NODE_ID": "node-o",
                "FTFLEET_REGION": "us-east-1",
            }
        )
        log = tmp_path / "entrypoint.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [str(REPO / "trainer" / "docker-entrypoint"), str(EXAMPLE), str(ckpt), "1000000"],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_for(
                lambda: (ckpt / "step-50" / "manifest.json").exists() or proc.poll() is not None,
                90,
                0.1,
                "the first checkpoint",
            )
            assert proc.poll() is None, log.read_text()[-3000:]
            metadata.schedule_spot_interruption(in_seconds=120)
            rc = proc.wait(timeout=90)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert rc == EXIT_PREEMPTED, log.read_text()[-3000:]
    marker = CommitMarker.from_json((ckpt / marker_key("node-o")).read_text())
    manifest = read_manifest(ckpt / f"step-{marker.step}")
    assert manifest is not None and not verify_dir(ckpt / f"step-{marker.step}", manifest)
    # The manager made its own groups: both ranks wrote their shards into one checkpoint.
    assert manifest.world_size == 2 and manifest.run_id == "own-loop"
    assert marker.step % 50 != 0 or marker.step > 50  # stopped by the notice, not at a planned save
