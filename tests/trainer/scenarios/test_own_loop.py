"""The library in a loop of the user's own: examples/own_loop.py, the README's example
(FSDP2, a StatefulDataLoader with workers), run as the image runs a training program
(its entrypoint, torchrun, 2 processes) and preempted through the fake metadata
service; and under plain torchrun, stopped by SIGTERM, SIGKILLed and resumed
bit-identically."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from drill.fake_metadata import FakeMetadataServer
from ftfleet.contract import EXIT_PREEMPTED, CommitMarker, marker_key
from ftfleet.trainer.checkpoint.manifest import read_manifest, verify_dir
from tests.trainer.conftest import BIN, REPO, child_env, ckpt_hash, free_port_pair, kill9, wait_for

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "examples" / "own_loop.py"
PACED = Path(__file__).with_name("paced_own_loop.py")


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
                "FTFLEET_LAUNCHER": "torchrun",  # a training program of its own
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


STEPS, SAVE_EVERY = 24, 4


def torchrun(script: Path, ckpt: Path) -> list[str]:
    return [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node=2",
        str(script),
        str(ckpt),
        str(STEPS),
        str(SAVE_EVERY),
    ]


def start_paced(ckpt: Path, log: Path) -> subprocess.Popen:
    """The example with each step slowed, so that a signal lands mid-run."""
    # TMPDIR: where rank 0 leaves the node's exit code for a launcher (plain torchrun reads none).
    env = child_env({"FTFLEET_NODE_ID": "node-o", "OWN_LOOP_STEP_DELAY_S": "0.2", "TMPDIR": str(log.parent)})
    with open(log, "w") as out:
        return subprocess.Popen(
            torchrun(PACED, ckpt), cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def committed(ckpt: Path, step: int) -> bool:
    return (ckpt / f"step-{step}" / "manifest.json").exists()


@pytest.mark.timeout(300)
def test_the_own_loop_example_sigtermed_and_sigkilled_mid_run_resumes_bit_identically(tmp_path):
    """FSDP2 and a StatefulDataLoader with 2 workers per rank, under plain torchrun:
    SIGTERM to torchrun (which passes it to each rank's process group, loader workers
    included) stops it with an emergency checkpoint; resumed, it is SIGKILLed (the whole
    process tree) mid-run; resumed again, it ends in the uninterrupted run's state."""
    reference = tmp_path / "reference"
    done = subprocess.run(torchrun(EXAMPLE, reference), cwd=REPO, env=child_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    ckpt, log = tmp_path / "ckpt", tmp_path / "run.log"
    proc = start_paced(ckpt, log)
    try:
        wait_for(lambda: committed(ckpt, 8) or proc.poll() is not None, 120, 0.05, "step 8's checkpoint")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    finally:
        kill9(proc)
    text = log.read_text()
    assert "DataLoader worker" not in text, text[-3000:]
    marker = CommitMarker.from_json((ckpt / marker_key("node-o")).read_text())
    assert 8 <= marker.step < STEPS and committed(ckpt, marker.step), text[-3000:]

    proc = start_paced(ckpt, log)
    try:
        wait_for(lambda: committed(ckpt, marker.step // SAVE_EVERY * SAVE_EVERY + SAVE_EVERY), 120, 0.05, "a save")
    finally:
        kill9(proc)
    done = subprocess.run(torchrun(EXAMPLE, ckpt), cwd=REPO, env=child_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ckpt_hash(ckpt / f"step-{STEPS}") == ckpt_hash(reference / f"step-{STEPS}")
