"""Bring your own model and data, as a team would: the examples run through the image's
entrypoint (with a stand-in of the fleet's environment), by config only, a worker is
SIGKILLed at a random moment, torchrun restarts the group, and the run ends bit for
bit where an uninterrupted run ends, having trained on every sample exactly once.

* examples/byo: a model, dataset, loss and optimizer in a package outside ftfleet
  (put on PYTHONPATH, as a user's package would be installed in their image).
* examples/hf: a Hugging Face Llama built from a small config (no download), on
  token shards written by ``ftfleet data prepare``.

The kill plan comes from a seeded RNG; the seed is in every failure message and
``KILL_SEED=<seed>`` replays the plan. ``make test`` kills once per run; the
``chaos`` variants kill three times.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ftfleet.trainer.events import read_events
from tests.trainer.conftest import BIN, REPO, assert_each_sample_once, child_env, ckpt_hash
from tests.trainer.resilience.torchrun_tree import children, trained_step, workers
from tests.trainer.scenarios.test_torchrun_restarts import attempt_trace
from tests.trainer.scenarios.test_under_fire import free_port_pair

pytestmark = pytest.mark.integration

#: Fewer steps than the examples' configs (40): each run costs the test its steps twice
#: (the reference and the killed run), and a kill needs only room after it (:func:`plan`).
STEPS = 24
BYO = REPO / "examples" / "byo"
HF = REPO / "examples" / "hf"
TRACE = ["data.trace_samples=true", "train.log_every=1000", f"train.steps={STEPS}"]


@dataclasses.dataclass(frozen=True)
class Kill:
    local_rank: int
    after_step: int
    delay_s: float


def plan(rng: random.Random, kills: int) -> list[Kill]:
    """Kills mid-run, at most at step 12 of 24: the 12 steps after the last one leave
    the test time to land it before the attempt could finish."""
    steps = sorted(rng.sample(range(3, STEPS - 11), kills))
    return [Kill(rng.randrange(2), step, rng.uniform(0, 0.15)) for step in steps]


def env_for(config: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    pythonpath = os.pathsep.join([str(REPO), str(BYO)])
    return child_env({"PYTHONPATH": pythonpath, "FTFLEET_CONFIG": str(config), **(extra or {})})


def uninterrupted(run_dir: Path, config: Path, *overrides: str) -> Path:
    """The same run straight through, under plain torchrun."""
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node=2", "-m", "ftfleet.trainer"]
    cmd += ["--config", str(config), f"run_dir={run_dir}", *TRACE, *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=env_for(config), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir


def through_the_image(tmp_path: Path, run_dir: Path, config: Path, *overrides: str) -> subprocess.Popen:
    """trainer/docker-entrypoint with the contract's environment: one node, 2 workers,
    torchrun's default --max-restarts."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = env_for(
        config,
        {
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "TMPDIR": str(tmp_path),
            "FTFLEET_RUN_ID": "byo",
            "FTFLEET_CLOUD": "aws",
            "FTFLEET_CKPT_DIR": str(run_dir / "checkpoints"),
            "FTFLEET_CKPT_UPLOAD": "none",
            "FTFLEET_LAUNCHER": "torchrun",  # its agent, restarts and exit file
            "FTFLEET_NNODES": "1",
            "FTFLEET_NPROC_PER_NODE": "2",
            "FTFLEET_RDZV_ENDPOINT": f"127.0.0.1:{free_port_pair()}",
            "FTFLEET_NODE_ID": "node-byo",
            "FTFLEET_REGION": "us-east-1",
            "FTFLEET_METADATA_ENDPOINT": "http://127.0.0.1:9",
            "FTFLEET_METRICS_PORT": "0",
            "FTFLEET_LOG_FORMAT": "text",
        },
    )
    with open(tmp_path / "entrypoint.log", "w") as log:
        return subprocess.Popen(
            [str(REPO / "trainer" / "docker-entrypoint"), "--module", "ftfleet.trainer"]
            + [f"run_dir={run_dir}", *TRACE, *overrides],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def killed_and_resumed(tmp_path: Path, config: Path, *overrides: str, kills: int) -> tuple[Path, list[list[int]], str]:
    seed = int(os.environ.get("KILL_SEED") or random.randrange(2**32))
    todo = plan(random.Random(seed), kills)
    why = f"seed {seed} (replay: KILL_SEED={seed}), plan {todo}"
    run_dir = tmp_path / "run"
    entry = through_the_image(tmp_path, run_dir, config, *overrides)
    deadline = time.monotonic() + 240
    attempts: list[list[int]] = []

    def report(what: str) -> str:
        return f"{what} (entrypoint rc {entry.poll()}); {why}\n" + (tmp_path / "entrypoint.log").read_text()[-4000:]

    def agent() -> int | None:
        for pid in children(entry.pid):
            try:
                if b"torchrun" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                pass
        return None

    def next_attempt() -> dict[int, int]:
        seen = {pid for pids in attempts for pid in pids}
        while time.monotonic() < deadline and entry.poll() is None:
            ws = workers(a) if (a := agent()) else {}
            if len(ws) == 2 and not seen & set(ws.values()):
                attempts.append(sorted(ws.values()))
                return ws
            time.sleep(0.005)
        raise AssertionError(report(f"no attempt {len(attempts)}"))

    try:
        for kill in todo:
            ws = next_attempt()
            while trained_step(run_dir, list(ws.values())) < kill.after_step:
                if entry.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(report(f"attempt {len(attempts) - 1} never started step {kill.after_step}"))
                time.sleep(0.005)
            time.sleep(kill.delay_s)
            try:
                os.kill(ws[kill.local_rank], signal.SIGKILL)
            except ProcessLookupError:
                raise AssertionError(report("the worker exited before its kill")) from None
        next_attempt()
        rc = entry.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if entry.poll() is None:
            os.killpg(entry.pid, signal.SIGKILL)
            for pid in [*(workers(a).values() if (a := agent()) else [])]:
                os.kill(pid, signal.SIGKILL)
            entry.wait()
    assert rc == 0, report("the entrypoint failed")
    return run_dir, attempts, why


def assert_resumed_bit_identically(run_dir: Path, reference: Path, attempts: list[list[int]], why: str) -> None:
    final = f"step-{STEPS}"
    assert (run_dir / "checkpoints" / final / "manifest.json").is_file(), why
    assert ckpt_hash(run_dir / "checkpoints" / final) == ckpt_hash(reference / "checkpoints" / final), why
    starts = [e for e in read_events(run_dir) if e["event"] == "start"]
    assert len(starts) == len(attempts), f"{len(starts)} starts for {len(attempts)} attempts; {why}"
    try:
        assert_each_sample_once(attempt_trace(run_dir, attempts), STEPS, 6)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {why}") from None


def byo(tmp_path: Path, kills: int) -> None:
    reference = uninterrupted(tmp_path / "reference", BYO / "config.yaml")
    run_dir, attempts, why = killed_and_resumed(tmp_path, BYO / "config.yaml", kills=kills)
    assert_resumed_bit_identically(run_dir, reference, attempts, why)


@pytest.mark.timeout(300)
def test_a_users_own_package_trains_through_the_image_and_resumes_bit_identically_after_a_kill(tmp_path):
    byo(tmp_path, kills=1)


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_a_users_own_package_survives_three_kills_bit_identically(tmp_path):
    byo(tmp_path, kills=3)


def prepared_shards(tmp_path: Path) -> Path:
    """A small corpus through the real `ftfleet data prepare` command."""
    rng = np.random.default_rng(11)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = ["river", "stone", "light", "cloud", "north", "seven", "paper", "glass", "quiet", "storm"]
    for i in range(12):
        (corpus / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(words, size=90)) + ".\n")
    out = tmp_path / "shards"
    cmd = [sys.executable, "-m", "ftfleet.cli", "data", "prepare", str(corpus), "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return out


def hugging_face(tmp_path: Path, kills: int) -> None:
    shards = prepared_shards(tmp_path)
    args = [f"data.path={shards}", "train.global_batch_size=6"]
    reference = uninterrupted(tmp_path / "reference", HF / "config.yaml", *args)
    run_dir, attempts, why = killed_and_resumed(tmp_path, HF / "config.yaml", *args, kills=kills)
    assert_resumed_bit_identically(run_dir, reference, attempts, why)


@pytest.mark.timeout(300)
@pytest.mark.chaos
def test_a_hugging_face_llama_on_prepared_shards_resumes_bit_identically_after_a_kill(tmp_path):
    hugging_face(tmp_path, kills=1)


@pytest.mark.chaos
@pytest.mark.timeout(600)
def test_a_hugging_face_llama_on_prepared_shards_survives_three_kills_bit_identically(tmp_path):
    hugging_face(tmp_path, kills=3)
