"""In-process restart with a warm spare (nvidia-resiliency-ext's wrapper around the
reference trainer, :mod:`ftfleet.trainer.inprocess`), end to end: 2 training processes
and 1 spare, gloo on CPU.

A SIGKILLed rank is replaced by the spare, the survivor never exits (same pid before
and after), everyone restores from the in-memory snapshots, and the run ends
bit-identical to the uninterrupted one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.trainer.conftest import BASE, CONFIG, REPO, child_env, wait_for

pytest.importorskip("nvidia_resiliency_ext.inprocess", reason="make setup installs nvidia-resiliency-ext")

ARGS = [
    *BASE,
    "resilience.interval.fixed_steps=8",
    "resilience.interval.snapshot_fixed_steps=1",
    "checkpoint.memory=true",
    "checkpoint.ranks_per_node=1",
    "train.step_events=true",
    "faults.step_delay_s=0.05",
]


def _events(run_dir):
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.timeout(240)
def test_a_sigkilled_rank_is_replaced_by_the_spare_and_the_survivor_never_exits(tmp_path, ref2):
    run_dir, shm = tmp_path / "run", tmp_path / "shm"
    cmd = [
        sys.executable,
        "-m",
        "ftfleet.trainer.inprocess",
        "--nproc=2",
        "--spares=1",
        "--worker=drill.inprocess_worker",
        "--",
        "--config",
        str(CONFIG),
        *ARGS,
        f"run_dir={run_dir}",
    ]
    log = open(tmp_path / "launch.log", "w")
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=child_env({"FTFLEET_SHM_DIR": str(shm)}), stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: any(e["event"] == "step" and e["step"] >= 10 for e in _events(run_dir)), 120, what="step 10")
        pids = {}
        for line in (tmp_path / "launch.log").read_text().splitlines():
            if line.startswith("ftfleet.inprocess: process "):
                _, _, rank, _, pid = line.split()  # ftfleet.inprocess: process 1 pid 27269
                pids[int(rank)] = int(pid)
        os.kill(pids[1], signal.SIGKILL)
        assert proc.wait(timeout=180) == 0, (tmp_path / "launch.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state_sha256"] == ref2["state_sha256"]
    assert summary["resumed_from"]["tier"] == "memory" and summary["resumed_from"]["step"] >= 9
    assert summary["restarts"] == 1
    starts = [e for e in _events(run_dir) if e["event"] == "start"]
    assert [e["attempt"] for e in starts] == [0, 1]
    assert starts[0]["pid"] == starts[1]["pid"] == pids[0], "rank 0 exited"
    assert "exit codes [0, -9, 0]" in (tmp_path / "launch.log").read_text()


@pytest.mark.timeout(120)
def test_a_spare_node_starts_warm_and_trains_only_once_told(tmp_path):
    run_dir, gate = tmp_path / "run", tmp_path / "go"
    cmd = [
        sys.executable,
        "-m",
        "ftfleet.trainer.inprocess",
        "--nproc=1",
        "--spares=0",
        f"--wait-for={gate}",
        "--",
        "--config",
        str(CONFIG),
        *BASE,
        "train.steps=3",
        f"run_dir={run_dir}",
    ]
    log = tmp_path / "launch.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "warm: waiting for" in log.read_text(), 60, what="the worker waiting, warm")
        assert proc.poll() is None and not (run_dir / "events.jsonl").exists(), "trained before it was told"
        gate.touch()
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 3


def test_the_wrapper_takes_any_soft_timeout_the_launcher_accepts(monkeypatch):
    from ftfleet.trainer.inprocess.worker import build_wrapper

    monkeypatch.setenv("MASTER_PORT", "29999")
    for soft in (2.0, 60.0, 600.0, 3600.0):  # 600 s was refused (its default barrier: 120 s)
        build_wrapper(2, soft)


def test_the_launcher_refuses_a_soft_timeout_the_wrapper_cannot_poll():
    from ftfleet.trainer.inprocess.launch import main

    with pytest.raises(SystemExit) as exc:
        main(["--nproc=1", "--soft-timeout=1", "--", "--config", str(CONFIG)])
    assert exc.value.code == 2
