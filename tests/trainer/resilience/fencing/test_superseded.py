"""A torchrun run whose generation is superseded mid-run commits nothing more, and its
ranks leave (exit 78) and stop their agent instead of letting it restart them.

The newer generation registers in the run's store the way rank 0 of any new attempt
does (a rendezvous round this node's workers were left out of, e.g. after a
partition): the test connects to the agent's store as a client and registers one.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from ftfleet.contract import EXIT_FENCED, agent_exit_file
from ftfleet.trainer.events import read_events
from ftfleet.trainer.resilience.fencing.fence import generation_of, register
from tests.trainer.conftest import BASE, MEMORY, REPO, child_env, kill9, trainer_cmd, wait_for
from tests.trainer.resilience.fencing.test_launcher_death import manifests
from tests.trainer.resilience.torchrun_tree import environ, workers

pytestmark = pytest.mark.integration

#: A refusal lands at the next commit: a snapshot every step (50 ms apart).
REFUSED_WITHIN_S = 0.5


@pytest.mark.timeout(120)
def test_a_superseded_generation_commits_nothing_more_and_stops_its_agent(tmp_path):
    run_dir, shm = tmp_path / "run", tmp_path / "shm"
    args = [*BASE, *MEMORY, "train.steps=100000", "resilience.interval.fixed_steps=2", "faults.step_delay_s=0.05"]
    cmd = trainer_cmd(2, run_dir, *args)
    cmd.insert(1, "--max-restarts=3")  # an agent left running would restart its workers
    log_path = tmp_path / "torchrun.log"
    with open(log_path, "w") as log:
        agent = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=child_env({"FTFLEET_SHM_DIR": str(shm)}),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    exit_file = Path(agent_exit_file(agent.pid))
    try:
        wait_for(
            lambda: any(e["event"] == "committed" and e["step"] >= 4 for e in read_events(run_dir)),
            90,
            interval=0.05,
            what=f"a checkpoint of step 4 or later: {log_path}",
        )
        env = environ(workers(agent.pid)[0])
        store = dist.TCPStore(
            env["MASTER_ADDR"],
            int(env["MASTER_PORT"]),
            is_master=False,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=10),
        )
        registered_at = time.time_ns()
        newer = generation_of(register(store))
        rc = agent.wait(timeout=60)
    finally:
        if agent.poll() is None:
            kill9(agent)
    try:
        code = exit_file.read_text().strip()
    finally:
        exit_file.unlink(missing_ok=True)
    text = log_path.read_text()

    assert code == str(EXIT_FENCED), f"agent rc {rc}, exit file {code!r}\n{text[-4000:]}"
    assert "Restarting worker group" not in text, text[-4000:]
    late = {
        p: t for p, t in manifests(run_dir / "checkpoints", shm).items() if t > registered_at + REFUSED_WITHIN_S * 1e9
    }
    assert not late, f"committed after generation {newer} registered: {sorted(map(str, late))}"
    assert f"was superseded by generation {newer}: this process leaves without committing anything more" in text
    fenced = [e for e in read_events(run_dir) if e["event"] == "fenced"]
    assert fenced and fenced[0]["generation"] == newer - 1, fenced
    with contextlib.suppress(ProcessLookupError):
        os.kill(agent.pid, signal.SIGKILL)
