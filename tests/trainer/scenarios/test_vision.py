"""A user's own CNN with BatchNorm on randomly augmented images
(tests/trainer/scenarios/vision.py), 2 ranks under FSDP2, each reading through 2 loader
workers, by config only under ``ftfleet torchrun``: stopped by SIGTERM (torchrun passes
it to each rank's process group) with exit 75 and no traceback, resumed, SIGKILLed
mid-run (its whole process tree) and resumed, it ends with the state_sha256 of an
uninterrupted run, and its final checkpoint holds that state (`ftfleet ckpt inspect
--tensors` prints the same hash).

FSDP2 leaves every rank its own running statistics: the hash covers each rank's, so a
resume that gave every rank one rank's statistics fails here. The augmentation draws
from the global RNGs in the loader's workers: a resume whose new workers drew other
numbers than the uninterrupted run's fails here too."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from ftfleet.cli import main as ftfleet
from ftfleet.contract import EXIT_PREEMPTED
from ftfleet.trainer.checkpoint.safe_load import load_offline
from tests.trainer.conftest import BIN, REPO, child_env, kill9, wait_for

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).with_name("vision.yaml")
STEPS = 16


def launch(run_dir: Path, *overrides: str) -> list[str]:
    """Overrides under ``faults.`` run the drill's worker (the trainer with faults)."""
    module = "drill.worker" if any(o.startswith("faults.") for o in overrides) else "ftfleet.trainer"
    cmd = [str(BIN / "ftfleet"), "torchrun", "--standalone", "--nproc-per-node=2", "-m", module]
    cmd += ["--config", str(CONFIG)]
    return [*cmd, f"run_dir={run_dir}", *overrides]


def run(run_dir: Path, *overrides: str) -> dict:
    proc = subprocess.run(
        launch(run_dir, *overrides), cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**json.loads((run_dir / "summary.json").read_text()), "_stderr": proc.stderr}


def start(run_dir: Path, *overrides: str) -> subprocess.Popen:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        return subprocess.Popen(
            launch(run_dir, *overrides),
            cwd=REPO,
            env=child_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def committed(run_dir: Path, step: int) -> bool:
    return (run_dir / "checkpoints" / f"step-{step}" / "manifest.json").exists()


def inspected_hash(step_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert ftfleet(["ckpt", "inspect", str(step_dir), "--tensors", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["state_sha256"]


@pytest.mark.timeout(300)
def test_a_cnn_with_batchnorm_killed_mid_run_resumes_bit_identically(tmp_path, capsys):
    reference = run(tmp_path / "reference")
    # A run says where it starts and what it commits; nothing a user cannot act on.
    said = reference["_stderr"].splitlines()
    assert said and all(
        "ftfleet.ckpt: restore: no checkpoint" in s or "ftfleet.ckpt: committed step-" in s for s in said
    )
    final_ckpt = tmp_path / "reference" / "checkpoints" / f"step-{STEPS}"
    assert inspected_hash(final_ckpt, capsys) == reference["state_sha256"]
    # Guards the comparisons: the ranks' running statistics differ, and the hash covers them.
    app = load_offline(final_ckpt)["app"]
    rank0, rank1 = (app[f"buffers_rank{r}"]["values"]["blocks.0.norm.running_mean"] for r in (0, 1))
    assert not torch.equal(rank0, rank1)

    d = tmp_path / "run"
    proc = start(d, "faults.step_delay_s=0.2")
    try:
        wait_for(lambda: committed(d, 4) or proc.poll() is not None, 120, 0.05, "step 4's checkpoint")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=90)
    finally:
        kill9(proc)
    stopped = json.loads((d / "summary.json").read_text())
    log = (tmp_path / "run.log").read_text()
    assert rc == EXIT_PREEMPTED and "Traceback" not in log, log[-3000:]
    assert log.splitlines()[-1].startswith("ftfleet torchrun: exit 75, termination notice handled")
    assert stopped["exit_code"] == EXIT_PREEMPTED and stopped["stop_reason"].startswith("notice: "), log[-3000:]
    assert 4 <= stopped["step"] < STEPS and committed(d, stopped["step"]), log[-3000:]
    assert "DataLoader worker" not in log, log[-3000:]

    proc = start(d, "faults.step_delay_s=0.2")
    try:
        wait_for(lambda: committed(d, stopped["step"] // 4 * 4 + 4), 120, 0.05, "the next checkpoint")
    finally:
        kill9(proc)
    resumed = run(d)
    assert stopped["step"] < resumed["resumed_from"]["step"] < STEPS, resumed["resumed_from"]
    assert resumed["state_sha256"] == reference["state_sha256"]
    assert inspected_hash(d / "checkpoints" / f"step-{STEPS}", capsys) == reference["state_sha256"]
