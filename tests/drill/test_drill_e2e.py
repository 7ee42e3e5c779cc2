"""Short drills, end to end: the real trainer under torchrun on the drill's local clouds,
faults injected by the drill, and every run ending in the uninterrupted run's state.
All run under ``make chaos`` (``make drill`` runs the whole drill): a SIGKILL of a worker
on AWS (torchrun restarts the group), a preemption notice and the loss of a location on
GCP (a replacement node resumes), and the whole drill of each cloud. A spot notice on AWS
is the trainer's own test (tests/trainer/scenarios/test_under_fire.py); the drill's
parts (faults, measures, report) are tested in this folder's other files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from drill.scenario import FAULTS

REPO = Path(__file__).resolve().parents[2]


def run_drill(tmp_path, *args, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FTFLEET_", "AWS_", "STORAGE_EMULATOR"))}
    env["PYTHONPATH"] = str(REPO)
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "drill",
            *args,
            "--no-progress",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(report),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    return json.loads(report.read_text())


@pytest.mark.chaos
def test_a_short_aws_drill_recovers_from_a_sigkill_and_matches_the_reference(tmp_path):
    # --spacing also caps the checkpoint interval (half of it): checkpoints at 4 and 8, so
    # the group restarts from one, not from step 0.
    data = run_drill(
        tmp_path, "--faults", "sigkill", "--first-step", "8", "--spacing", "8", "--step-delay", "0.02", timeout=240
    )
    assert data["settings"]["cloud"] == "aws"
    assert [f["kind"] for f in data["faults"]] == ["sigkill"]
    assert all(f["ok"] for f in data["faults"]), data["faults"]
    (sigkill,) = data["faults"]
    assert sigkill["detect_s"] is not None and sigkill["resume_s"] > sigkill["detect_s"]
    assert sigkill["lost_steps"] < sigkill["at_step"], sigkill  # restored from a checkpoint, not step 0
    assert data["state_matches_reference"] is True
    assert 0 < data["goodput"]["goodput"] <= 1.0


@pytest.mark.chaos
def test_a_short_gcp_drill_survives_a_preemption_and_the_loss_of_a_location_and_matches_the_reference(tmp_path):
    data = run_drill(
        tmp_path,
        "--cloud",
        "gcp",
        "--faults",
        "notice,bucket_loss",
        "--first-step",
        "6",
        "--spacing",
        "6",
        "--step-delay",
        "0.02",
        # No loader workers (tests/trainer/conftest.py: BASE): here the trainer exits on
        # its own after the notice; the AWS drill above keeps them through its SIGKILL.
        "--set",
        "data.num_workers=0",
    )
    assert data["settings"]["cloud"] == "gcp"
    assert [f["kind"] for f in data["faults"]] == ["notice", "bucket_loss"]
    assert all(f["ok"] for f in data["faults"]), data["faults"]
    preemption, location = data["faults"]
    assert preemption["name"].startswith("GCP preemption") and preemption["lost_steps"] == 0
    assert "restored step" in location["reason"] and "primary bucket" in location["reason"]
    assert data["state_matches_reference"] is True


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_the_whole_aws_drill_recovers_from_every_fault_and_matches_the_reference(tmp_path):
    """`make demo`'s drill."""
    data = run_drill(tmp_path, timeout=600)
    assert all(f["ok"] for f in data["faults"]), data["faults"]
    assert [f["kind"] for f in data["faults"]] == list(FAULTS)
    notice = next(f for f in data["faults"] if f["kind"] == "notice")
    assert notice["lost_steps"] == 0  # the emergency checkpoint is the step the notice hit
    assert data["state_matches_reference"] is True


@pytest.mark.chaos
@pytest.mark.timeout(900)
def test_the_whole_gcp_drill_recovers_from_every_fault_and_matches_the_reference(tmp_path):
    data = run_drill(tmp_path, "--cloud", "gcp", timeout=600)
    assert all(f["ok"] for f in data["faults"]), data["faults"]
    assert {f["kind"] for f in data["faults"]} >= {"notice", "rebalance", "sigkill", "corrupt", "bucket_loss"}
    assert data["state_matches_reference"] is True
