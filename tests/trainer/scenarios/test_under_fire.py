"""The training loop under fire: interruption notices (AWS and GCP fake metadata,
SIGTERM), a rebalance recommendation, NaN and spike batches, a hang. Each run is the
real trainer in subprocesses; what happened is read from summary.json, the event log
and the commit marker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from drill.fake_metadata import FakeMetadataServer
from ftfleet.contract import EXIT_PREEMPTED, EXIT_UNRECOVERABLE, CommitMarker, marker_key
from ftfleet.trainer.events import read_events
from tests.trainer.conftest import (
    BASE,
    BIN,
    CONFIG,
    LOADER_WORKERS,
    REPO,
    child_env,
    free_port_pair,
    run_trainer,
    start_trainer,
    wait_for,
)

pytestmark = pytest.mark.integration

#: Steps slow enough that a notice lands mid-run; metadata polled often.
PACED = ["faults.step_delay_s=0.1", "resilience.watcher.poll_interval_s=0.2", "resilience.watcher.max_backoff_s=1"]


def events(run_dir: Path, name: str | None = None) -> list[dict]:
    return [e for e in read_events(run_dir) if name is None or e["event"] == name]


def started(run_dir: Path) -> bool:
    return bool(events(run_dir, "first_step"))


def finish(proc: subprocess.Popen, timeout: float = 120) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture
def metadata():
    with FakeMetadataServer() as server:
        yield server


def assert_emergency(run_dir: Path, budget_s: float, node: str) -> dict:
    s = summary(run_dir)
    assert s["exit_code"] == EXIT_PREEMPTED, s
    em = s["emergency"]
    assert em["within_deadline"] and em["seconds_to_commit"] < budget_s, em
    assert em["step"] == s["step"] and 0 < s["step"] < 24
    committed = [c["step"] for c in s["committed"]]
    assert s["step"] in committed
    assert (run_dir / "checkpoints" / f"step-{s['step']}" / "manifest.json").is_file()
    marker = CommitMarker.from_json((run_dir / "checkpoints" / marker_key(node)).read_text())
    assert (marker.step, marker.node_id) == (s["step"], node)
    assert marker.written_at >= em["committed_at"]
    return s


def test_aws_spot_notice_commits_within_the_deadline_and_resume_is_exact(
    tmp_path, metadata, ref2, moto_url, s3, bucket
):
    d = tmp_path / "run"
    s3_args = [f"checkpoint.uri=s3://{bucket}/job", f"checkpoint.s3_endpoint_url={moto_url}"]
    env = {"FTFLEET_CLOUD": "aws", "FTFLEET_METADATA_ENDPOINT": metadata.url, "FTFLEET_NODE_ID": "node-a"}
    proc = start_trainer(2, d, *PACED, *s3_args, LOADER_WORKERS, env=env)
    wait_for(lambda: started(d), 90, 0.1, "the first step")
    metadata.schedule_spot_interruption(in_seconds=120)
    finish(proc)
    s = assert_emergency(d, 120, "node-a")
    (notice,) = events(d, "notice")
    assert (notice["kind"], notice["source"]) == ("termination", "aws-spot-instance-action")
    # The marker also reached the bucket, where the lifecycle handoff looks for it.
    body = s3.get_object(Bucket=bucket, Key=f"job/{marker_key('node-a')}")["Body"].read()
    assert CommitMarker.from_json(body).step == s["step"]

    # The replacement node: same fast tier, no notice. It ends where an uninterrupted
    # run ends, bit for bit.
    metadata.reset()
    resumed = run_trainer(2, d, *s3_args, LOADER_WORKERS)  # the reader state saved with workers
    assert resumed["resumed_from"]["step"] == s["step"]
    assert resumed["state_sha256"] == ref2["state_sha256"]


def test_gcp_preemption_commits_within_thirty_seconds(tmp_path, metadata):
    d = tmp_path / "run"
    env = {"FTFLEET_CLOUD": "gcp", "FTFLEET_METADATA_ENDPOINT": metadata.url, "FTFLEET_NODE_ID": "node-g"}
    proc = start_trainer(1, d, *PACED, env=env)
    wait_for(lambda: started(d), 90, 0.1, "the first step")
    metadata.preempt()
    finish(proc)
    assert_emergency(d, 30, "node-g")
    assert events(d, "notice")[0]["source"] == "gcp-preempted"


def scrape(port: int) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("ftfleet_")
    }


def test_sigterm_to_one_worker_stops_every_rank_at_the_same_step(tmp_path):
    d, port = tmp_path / "run", free_port_pair()
    proc = start_trainer(
        2, d, *PACED, env={"FTFLEET_NODE_ID": "node-s", "FTFLEET_METRICS_PORT": str(port), "FTFLEET_LOG_FORMAT": "json"}
    )
    wait_for(lambda: started(d), 90, 0.1, "the first step")
    # Every rank exports its metrics on the base port + its local rank.
    for rank in (0, 1):
        labels = f'node="node-s",rank="{rank}"'
        metrics = wait_for(
            lambda rank=rank, labels=labels: (
                (m := scrape(port + rank)).get(f"ftfleet_steps_total{{{labels}}}", 0) > 0 and m
            ),
            30,
            0.2,
            f"rank {rank} metrics",
        )
        assert metrics[f'ftfleet_notices_total{{kind="termination",{labels}}}'] == 0
    workers = subprocess.run(
        ["pgrep", "-f", "-P", str(proc.pid), "trainer"], capture_output=True, text=True
    ).stdout.split()
    assert len(workers) == 2, workers
    os.kill(int(workers[-1]), signal.SIGTERM)
    finish(proc)
    assert_emergency(d, 30, "node-s")
    assert events(d, "notice")[0]["kind"] == "signal"
    logged = [json.loads(line) for line in (tmp_path / "run.log").read_text().splitlines() if line.startswith('{"ts"')]
    assert any(r["logger"] == "ftfleet.preemption" and r["rank"] == 0 for r in logged), logged[:5]


def test_a_rebalance_recommendation_checkpoints_early_and_carries_on(tmp_path, metadata, ref1):
    d = tmp_path / "run"
    env = {"FTFLEET_CLOUD": "aws", "FTFLEET_METADATA_ENDPOINT": metadata.url}
    proc = start_trainer(1, d, *PACED, "resilience.interval.fixed_steps=100", env=env)
    wait_for(lambda: started(d), 90, 0.1, "the first step")
    metadata.recommend_rebalance()
    assert finish(proc) == 0
    s = summary(d)
    (notice,) = events(d, "notice")
    assert notice["kind"] == "rebalance" and not notice["terminal"]
    early = [c for c in events(d, "committed") if c["reason"] == "notice:rebalance"]
    assert [c["step"] for c in early] == [notice["step"]]
    assert s["exit_code"] == 0 and s["step"] == 24 and s["emergency"] is None
    assert s["state_sha256"] == ref1["state_sha256"]


def test_nan_and_spiking_batches_are_skipped_with_counters(tmp_path):
    s = run_trainer(
        1,
        tmp_path / "run",
        "faults.nan_at_steps=[10]",
        "faults.spike_at_steps=[18]",
        "resilience.anomaly.min_history=5",
        "train.state_hash=false",
    )
    assert s["state_sha256"] is None  # opt-in: it gathers the whole state onto rank 0
    assert s["anomalies"] == {"nonfinite": 1, "spikes": 1, "skipped": 2, "rollbacks": 0}
    nan, spike = events(tmp_path / "run", "anomaly")
    assert (nan["step"], nan["action"]) == (10, "skip") and "non-finite" in nan["reason"]
    assert (spike["step"], spike["action"]) == (18, "skip")
    assert "rolling median" in spike["reason"]
    assert s["step"] == 24 and s["exit_code"] == 0


def test_rollback_replays_exactly_from_any_checkpoint(tmp_path):
    """Rolling back to step 8 or to step 9 and replaying to the bad batch gives the same
    state: the rollback restores everything, RNG included, and skips only that batch."""
    runs = {}
    for every in (4, 3):
        d = tmp_path / f"every{every}"
        s = run_trainer(
            1,
            d,
            "faults.nan_at_steps=[11]",
            "resilience.anomaly.policy=rollback",
            f"resilience.interval.fixed_steps={every}",
        )
        (rollback,) = events(d, "rollback")
        assert rollback == {**rollback, "from_step": 11, "to_step": every * (10 // every)}
        assert s["skipped_batches"] == [11] and s["anomalies"]["rollbacks"] == 1
        runs[every] = s["state_sha256"]
    assert runs[4] == runs[3]


def test_anomalies_that_keep_coming_stop_the_run(tmp_path):
    s = run_trainer(
        1,
        tmp_path / "run",
        "faults.nan_at_steps=[5,6,7]",
        "resilience.anomaly.max_consecutive_skips=2",
        expect_rc=EXIT_UNRECOVERABLE,
    )
    errors = [line for line in s["_stderr"].splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "3 anomalous steps in a row" in errors[0], s["_stderr"][-2000:]


@pytest.mark.chaos
def test_a_hung_rank_is_restarted_by_torchrun_and_the_run_ends_exactly(tmp_path, ref2):
    d = tmp_path / "run"
    args = [
        "--config",
        str(CONFIG),
        *BASE,
        LOADER_WORKERS,
        f"run_dir={d}",
        "faults.hang_at_step=10",
        "faults.hang_rank=1",
        "resilience.watchdog.timeout_s=3",
        "resilience.watchdog.first_step_timeout_s=120",
    ]
    cmd = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=1",
        "-m",
        "drill.worker",
        *args,
    ]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"").decode(errors="replace")[-6000:]
        raise AssertionError(f"the restarted run never ended\n{tail}") from None
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "hang watchdog: no step progress" in proc.stderr
    assert "Thread" in proc.stderr  # the stacks were dumped
    restored = events(d, "restored")
    assert [e["attempt"] for e in restored] == [1] and restored[0]["step"] == 8
    assert summary(d)["state_sha256"] == ref2["state_sha256"]


def start_image(tmp_path: Path, run_dir: Path, *overrides: str, metadata_url: str = "") -> subprocess.Popen:
    """The image's real entrypoint and torchrun (its default --max-restarts), one node
    of 2 workers, with the contract's environment."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(
        {
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "TMPDIR": str(tmp_path),
            "FTFLEET_RUN_ID": "t",
            "FTFLEET_CLOUD": "aws",
            "FTFLEET_CONFIG": str(CONFIG),
            "FTFLEET_CKPT_DIR": str(run_dir / "checkpoints"),
            "FTFLEET_CKPT_UPLOAD": "none",
            "FTFLEET_LAUNCHER": "torchrun",  # its agent, restarts and exit file
            "FTFLEET_NNODES": "1",
            "FTFLEET_NPROC_PER_NODE": "2",
            "FTFLEET_RDZV_ENDPOINT": f"127.0.0.1:{free_port_pair()}",
            "FTFLEET_NODE_ID": "node-e",
            "FTFLEET_REGION": "us-east-1",
            "FTFLEET_METADATA_ENDPOINT": metadata_url or "http://127.0.0.1:9",
            "FTFLEET_METRICS_PORT": "0",
            "FTFLEET_LOG_FORMAT": "text",
        }
    )
    with open(tmp_path / "entrypoint.log", "w") as log:
        return subprocess.Popen(
            [
                str(REPO / "trainer" / "docker-entrypoint"),
                "--module",
                "drill.worker" if any(o.startswith("faults.") for o in overrides) else "ftfleet.trainer",
                *BASE,
                f"run_dir={run_dir}",
                *overrides,
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def image_exit(proc: subprocess.Popen, tmp_path: Path, timeout: float) -> int:
    try:
        rc = finish(proc, timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not list(tmp_path.glob("ftfleet-agent-*.exit")), "the entrypoint left the exit file"
    return rc


def test_the_image_entrypoint_gives_a_preempted_node_exit_75_without_restarting_it(tmp_path, metadata):
    """After the emergency checkpoint the node's agent is stopped instead of restarting
    the workers, and the container's exit status is 75."""
    d = tmp_path / "run"
    proc = start_image(tmp_path, d, "train.steps=400", *PACED, metadata_url=metadata.url)
    wait_for(lambda: started(d), 90, 0.1, "the first step")
    metadata.schedule_spot_interruption(in_seconds=120)
    rc = image_exit(proc, tmp_path, 120)
    log_text = (tmp_path / "entrypoint.log").read_text()
    assert rc == EXIT_PREEMPTED, log_text[-3000:]
    assert_emergency(d, 120, "node-e")
    assert len(events(d, "start")) == 1, "torchrun restarted the workers of a preempted node"
    (stopped,) = events(d, "agent_stopped")
    assert stopped["code"] == EXIT_PREEMPTED


def test_the_image_entrypoint_does_not_restart_a_run_that_needs_a_human(tmp_path):
    d = tmp_path / "run"
    proc = start_image(tmp_path, d, "faults.nan_at_steps=[5,6,7]", "resilience.anomaly.max_consecutive_skips=2")
    rc = image_exit(proc, tmp_path, 120)
    log_text = (tmp_path / "entrypoint.log").read_text()
    assert rc == EXIT_UNRECOVERABLE, log_text[-3000:]
    assert len(events(d, "start")) == 1, "torchrun restarted a run that exited 77"
    assert "stopping this node's torchrun agent" in log_text
