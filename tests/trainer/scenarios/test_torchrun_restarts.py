"""Restarts under torchrun end where an uninterrupted run ends.

* ``--max-restarts``: workers SIGKILLed at random moments, again and again. The kill
  plan (which worker, how long after its start or which step) comes from a seeded RNG;
  the seed is in every failure message and ``KILL_SEED=<seed>`` replays the plan (not
  the timing of the run, so a failure may take a few tries to reproduce).
* Elastic ``--nnodes=1:2``, two agents of one process each on this machine: a run
  that loses a node continues alone from the newest checkpoint the two committed,
  resharded 2 -> 1; a worker crash the other node does not notice restarts both.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.trainer.conftest import (
    LOADER_WORKERS,
    REPO,
    assert_each_sample_once,
    child_env,
    copy_steps,
    run_trainer,
    sample_trace,
    trainer_cmd,
)
from tests.trainer.resilience.torchrun_tree import (
    ElasticNodes,
    committed,
    environ,
    kill_node,
    pending_signals,
    trained_step,
    workers,
)

pytestmark = pytest.mark.integration

#: Kills per run: two here; the chaos run (tests/trainer/scenarios/test_chaos.py) has fifty.
STEPS, BATCH, KILLS = 24, 6, 2
#: Paces the tiny model so that kills land mid-run; does not change the trajectory.
SLOW = "faults.step_delay_s=0.05"


@dataclasses.dataclass(frozen=True)
class Kill:
    local_rank: int
    after_step: int
    """Wait until the attempt has started this step (0: only until its workers exist)."""
    delay_s: float
    """Then wait this long: startup kills land in import, store handshake, gloo init or
    restore; step kills anywhere in a step, a save or a commit."""


def plan(rng: random.Random) -> list[Kill]:
    """Every kill lands before the attempt could finish: a start takes seconds, and the
    6 steps after the last target take at least 6 x the step delay (0.3 s)."""
    steps = iter(sorted(rng.sample(range(2, STEPS - 5), KILLS)))
    kills = []
    for _ in range(KILLS):
        at_startup = rng.random() < 1 / 3
        kills.append(
            Kill(
                rng.randrange(2),
                0 if at_startup else next(steps),
                rng.uniform(0, 2.5) if at_startup else rng.uniform(0, 0.2),
            )
        )
    return kills


def attempt_trace(run_dir: Path, attempts: list[list[int]]) -> dict[int, list[tuple[int, int]]]:
    """The samples behind the final state: each attempt's trace counts up to the step the
    next attempt that trained resumed from. ``attempts`` are the workers' pids, oldest
    first; traces of no listed worker belong to a last attempt. Moves each attempt's
    trace files to a directory of its own."""
    dirs = []
    for i, pids in enumerate(attempts):
        d = run_dir.parent / f"attempt-{i}"
        (d / "samples").mkdir(parents=True)
        for pid in pids:
            for f in (run_dir / "samples").glob(f"rank*-pid{pid}.txt"):
                f.rename(d / "samples" / f.name)
        dirs.append(d)
    dirs.append(run_dir)
    limits: dict[Path, int] = {}
    resumed = None
    for d in reversed(dirs):
        if resumed is not None:
            limits[d] = resumed
        if steps := sample_trace(d):
            resumed = min(steps) - 1
    return sample_trace(*dirs, max_step=limits)


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_workers_killed_at_random_moments_restart_and_end_bit_identical(ref2, tmp_path):
    seed = int(os.environ.get("KILL_SEED") or random.randrange(2**32))
    kills = plan(random.Random(seed))
    why = f"seed {seed} (replay: KILL_SEED={seed}), plan {kills}"
    run_dir = tmp_path / "run"
    cmd = trainer_cmd(2, run_dir, SLOW, LOADER_WORKERS)
    cmd.insert(1, f"--max-restarts={KILLS}")  # one each: any other failure fails the run
    log_path = tmp_path / "torchrun.log"
    with open(log_path, "w") as log:
        agent = subprocess.Popen(
            cmd, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    attempts: list[list[int]] = []
    deadline = time.monotonic() + 240

    def report(what: str) -> str:
        return f"{what} (torchrun rc {agent.poll()}); {why}\n" + log_path.read_text()[-4000:]

    def next_attempt() -> dict[int, int]:
        """Both workers of an attempt not seen before."""
        seen = {pid for pids in attempts for pid in pids}
        while time.monotonic() < deadline and agent.poll() is None:
            ws = workers(agent.pid)
            if len(ws) == 2 and not seen & set(ws.values()):
                attempts.append(sorted(ws.values()))
                return ws
            time.sleep(0.005)
        raise AssertionError(report(f"no attempt {len(attempts)}"))

    try:
        for kill in kills:
            ws = next_attempt()
            while trained_step(run_dir, list(ws.values())) < kill.after_step:
                if agent.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(report(f"attempt {len(attempts) - 1} never started step {kill.after_step}"))
                time.sleep(0.005)
            time.sleep(kill.delay_s)
            try:
                os.kill(ws[kill.local_rank], signal.SIGKILL)
            except ProcessLookupError:
                raise AssertionError(report("the worker exited before its kill")) from None
        next_attempt()
        rc = agent.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if agent.poll() is None:
            for pid in [*workers(agent.pid).values(), agent.pid]:
                os.kill(pid, signal.SIGKILL)
            agent.wait()

    assert rc == 0, report("torchrun failed")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["step"], summary["world_size"]) == (STEPS, 2), why
    assert summary["state_sha256"] == ref2["state_sha256"], why
    try:
        assert_each_sample_once(attempt_trace(run_dir, attempts), STEPS, BATCH)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {why}") from None


@pytest.fixture
def rendezvous_endpoint():
    """The elastic job's c10d rendezvous store, on a 'machine' that outlives the nodes."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True, wait_for_workers=False)
    yield f"127.0.0.1:{store.port}"
    del store


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "lost",
    [pytest.param(0, marks=pytest.mark.chaos, id="node-hosting-the-worker-store"), pytest.param(1, id="other-node")],
)
def test_a_run_that_loses_a_node_continues_alone_from_the_newest_checkpoint(rendezvous_endpoint, ref2, tmp_path, lost):
    run_dir = tmp_path / "run"
    nodes = ElasticNodes(rendezvous_endpoint, run_dir, tmp_path, "checkpoint.keep=100", SLOW)
    try:
        by_rank = nodes.wait_for(
            lambda: nodes.training_together(past_step=10), 150, "both nodes training in one world past step 10"
        )
        survivor = by_rank[1 - lost]
        two_node_workers = [p for p in nodes.workers() if p]
        at_loss = max(committed(run_dir))
        kill_node(by_rank[lost])
        rc = survivor.wait(timeout=180)
    finally:
        nodes.stop()
    assert rc == 0, nodes.log_tail()

    summary = json.loads((run_dir / "summary.json").read_text())
    resumed = summary["resumed_from"]
    written_by_two = [s for s, w in committed(run_dir).items() if w == 2]
    # The newest checkpoint the two nodes committed, resharded 2 -> 1.
    assert resumed["world_size"] == 2 and resumed["step"] == max(written_by_two) >= at_loss
    assert (summary["world_size"], summary["step"]) == (1, STEPS)
    # Bit for bit what one process computes from the uninterrupted run's checkpoint of
    # that step.
    ref = tmp_path / "ref-2to1"
    copy_steps(ref2["run_dir"] / "checkpoints", ref / "checkpoints", [resumed["step"]])
    expected = run_trainer(1, ref, "checkpoint.enabled=false")
    assert summary["state_sha256"] == expected["state_sha256"]

    trace = attempt_trace(run_dir, [two_node_workers])
    assert_each_sample_once(trace, STEPS, BATCH)
    assert all(len(trace[s]) == 1 for s in range(resumed["step"] + 1, STEPS + 1))


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_a_worker_crash_the_other_node_does_not_notice_restarts_both_nodes_in_step(rendezvous_endpoint, ref2, tmp_path):
    """With NCCL a worker whose peer died blocks in its collective instead of failing, so
    its agent restarts it for the membership change, which torchrun does not count as a
    restart: the nodes' TORCHELASTIC_RESTART_COUNT differ from then on. Simulated by
    stopping that worker (SIGSTOP) until its agent has asked it to terminate."""
    run_dir = tmp_path / "run"
    nodes = ElasticNodes(rendezvous_endpoint, run_dir, tmp_path, SLOW)
    try:
        by_rank = nodes.wait_for(
            lambda: nodes.training_together(past_step=6), 150, "both nodes training in one world past step 6"
        )
        crashed, unaware = (workers(by_rank[r].pid)[0] for r in (0, 1))
        os.kill(unaware, signal.SIGSTOP)
        os.kill(crashed, signal.SIGKILL)
        nodes.wait_for(
            lambda: signal.SIGTERM in pending_signals(unaware), 60, "the unaware node's agent to stop its worker"
        )
        os.kill(unaware, signal.SIGCONT)
        restarted = nodes.wait_for(
            lambda: None if {None, crashed, unaware} & set(ps := nodes.workers()) else ps,
            120,
            "new workers on both nodes",
        )
        counts = sorted(environ(p).get("TORCHELASTIC_RESTART_COUNT") for p in restarted)
        rcs = [a.wait(timeout=180) for a in nodes.agents]
    finally:
        nodes.stop()
    assert counts == ["0", "1"], f"the restart counts did not diverge: {counts}"
    assert rcs == [0, 0], nodes.log_tail()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["world_size"], summary["step"]) == (2, STEPS)
    assert summary["state_sha256"] == ref2["state_sha256"]
