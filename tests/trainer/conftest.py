"""Shared fixtures of the trainer tests: running the trainer as a subprocess (torchrun
for several ranks), reference runs computed once per session, and an S3 server (moto)
on 127.0.0.1 behind a proxy that can inject faults."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ftfleet.trainer.inprocess.launch import free_port_pair  # noqa: F401 - re-exported for the tests

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

#: A model and run small enough for a few seconds per torchrun, with dropout so that a
#: resume that loses the RNG state shows in the hash. Global batch 6: 1, 2 and 3 ranks.
#: No loader workers, on every interpreter: on CPython 3.11 before 3.11.10 (CI's) each
#: rank's workers come from a forkserver that imports torch beside the rank's own
#: import, which on 2 cores costs each launch seconds of wall. Where a run's subject is a
#: stop, a kill or a restart, it keeps them (:data:`LOADER_WORKERS`), in every launch of
#: its story: the run stopped twice, torchrun's restarts after random kills and after a
#: hang, the AWS spot notice and its replacement, both shared-memory resumes, the
#: in-process SIGKILL, hang and chaos runs, and the GPU tests. There the workers must go
#: with their rank and the reader's saved state must come back; the references run
#: without, so those runs also show that the workers change nothing. The rest
#: (anomalies, the image entrypoint's exits, elastic node loss, the reshards, S3) run
#: without them.
BASE = [
    "run_id=t",
    "seed=7",
    "model.vocab_size=64",
    "model.seq_len=16",
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.dropout=0.1",
    "optim.warmup_steps=4",
    "train.steps=24",
    "train.global_batch_size=6",
    "train.log_every=1000",
    "resilience.interval.mode=fixed",
    "resilience.interval.fixed_steps=4",
    "checkpoint.keep=3",
    "data.trace_samples=true",
    "train.state_hash=true",
    "data.num_workers=0",
]
#: The loader's workers as the trainer's default has them (see :data:`BASE`).
LOADER_WORKERS = "data.num_workers=2"
CONFIG = REPO / "trainer" / "configs" / "tiny.yaml"

#: Two ranks as two nodes, snapshots in shared memory every step, durable checkpoints
#: every 8 steps, each step slowed a little so that a kill lands between durable ones.
MEMORY = [
    "resilience.interval.fixed_steps=8",
    "resilience.interval.snapshot_fixed_steps=1",
    "checkpoint.memory=true",
    "checkpoint.ranks_per_node=1",
    "faults.step_delay_s=0.05",
]


def trainer_cmd(nproc: int, run_dir: Path, *overrides: str) -> list[str]:
    """The trainer's command line. Overrides under ``faults.`` are injected faults: the
    command then runs the drill's worker (the trainer with fault callbacks)."""
    args = ["--config", str(CONFIG), *BASE, f"run_dir={run_dir}", *overrides]
    module = "drill.worker" if any(o.startswith("faults.") for o in overrides) else "ftfleet.trainer"
    if nproc == 1:
        return [sys.executable, "-m", module, *args]
    return [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={nproc}", "-m", module, *args]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FTFLEET_", "AWS_ENDPOINT"))}
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
        }
    )
    env.update(extra or {})
    return env


def inprocess_cmd(
    run_dir: Path, *overrides: str, spares: int = 1, soft_timeout: float | None = None, nproc: int = 2
) -> list[str]:
    """The in-process launcher (``nproc`` ranks, ``spares`` warm spares) running the
    drill's worker (the trainer with fault callbacks) on the tiny config."""
    launcher = [f"--nproc={nproc}", f"--spares={spares}", "--worker=drill.inprocess_worker"]
    launcher += [f"--soft-timeout={soft_timeout}"] if soft_timeout is not None else []
    args = ["--config", str(CONFIG), *overrides, f"run_dir={run_dir}"]
    return [sys.executable, "-m", "ftfleet.trainer.inprocess", *launcher, "--", *args]


def run_trainer(
    nproc: int,
    run_dir: Path,
    *overrides: str,
    env: dict[str, str] | None = None,
    expect_rc: int | None = 0,
    timeout: float = 120,
) -> dict:
    """Run to completion; return summary.json. A run past ``timeout`` fails with every
    process's Python stack (faulthandler, on SIGABRT) in the message: a hang says where."""
    popen = subprocess.Popen(
        trainer_cmd(nproc, run_dir, *overrides),
        cwd=REPO,
        env={**child_env(env), "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = popen.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stderr = _abort_tree(popen)
        raise AssertionError(
            f"trainer ran past {timeout:.0f}s (stacks below)\n--- stderr ---\n{stderr[-12000:]}"
        ) from None
    proc = subprocess.CompletedProcess(popen.args, popen.returncode, stdout, stderr)
    if expect_rc is not None and proc.returncode != expect_rc:
        raise AssertionError(
            f"trainer exited {proc.returncode}, expected {expect_rc}\n--- stderr ---\n{proc.stderr[-6000:]}"
        )
    summary = run_dir / "summary.json"
    out = json.loads(summary.read_text()) if summary.exists() else {}
    out["_stderr"] = proc.stderr
    out["_rc"] = proc.returncode
    return out


def start_trainer(nproc: int, run_dir: Path, *overrides: str, env: dict[str, str] | None = None):
    """Start in its own process group (so a kill reaches torchrun and every worker)."""
    log = open(run_dir.parent / f"{run_dir.name}.log", "w")
    run_dir.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        trainer_cmd(nproc, run_dir, *overrides),
        cwd=REPO,
        env=child_env(env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _tree(pid: int) -> list[int]:
    from tests.trainer.resilience.torchrun_tree import children

    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children(p))
    return tree


def _abort_tree(proc: subprocess.Popen) -> str:
    """SIGABRT every process under ``proc`` (each dumps its Python stacks), then SIGKILL
    them; the stderr that came out."""
    tree = _tree(proc.pid)
    for pid in tree[1:]:  # the workers first, so that torchrun does not tear them down
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGABRT)
    time.sleep(2)
    kill9(proc)
    _, stderr = proc.communicate(timeout=30)
    return stderr or ""


def kill9(proc: subprocess.Popen) -> None:
    """SIGKILL the process, its group, and every descendant: torchrun starts its workers
    in sessions of their own, which a kill of the group alone would miss."""
    tree = _tree(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def wait_for(predicate, timeout: float, interval: float = 0.002, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def sample_trace(*run_dirs: Path, max_step: dict[Path, int] | None = None) -> dict[int, list[tuple[int, int]]]:
    """step -> [(first, last) sample of each rank], over the runs' trace files; steps
    above ``max_step[run_dir]`` (rolled back by a resume) are ignored."""
    out: dict[int, list[tuple[int, int]]] = {}
    for d in run_dirs:
        limit = (max_step or {}).get(d)
        for f in sorted((d / "samples").glob("*.txt")):
            for line in f.read_text().split("\n"):
                if line.strip():
                    step, first, last = map(int, line.split())
                    if limit is None or step <= limit:
                        out.setdefault(step, []).append((first, last))
    return out


def assert_each_sample_once(trace: dict[int, list[tuple[int, int]]], steps: int, batch: int) -> None:
    from drill.samples import each_sample_once

    problem = each_sample_once(trace, steps, batch)
    assert problem is None, problem


def ckpt_hash(step_dir: Path) -> str:
    """state_sha256 of the state held by a checkpoint, loaded offline: what the trainer's
    summary.json has for the same state (and `ftfleet ckpt inspect --tensors` prints)."""
    from ftfleet.trainer.checkpoint.safe_load import load_offline
    from ftfleet.trainer.checkpoint.state import checkpoint_state, state_sha256

    return state_sha256(checkpoint_state(load_offline(step_dir)["app"]))


def copy_steps(src: Path, dst: Path, steps: list[int]) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for s in steps:
        shutil.copytree(src / f"step-{s}", dst / f"step-{s}")
    return dst


# ---------------------------------------------------------------------------
# S3: moto on 127.0.0.1, behind a fault-injecting proxy
# ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def moto_url():
    from moto.server import ThreadedMotoServer

    for k, v in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(k, v)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3proxy(moto_url):
    from tests.trainer.s3proxy import FaultProxy

    proxy = FaultProxy(moto_url)
    proxy.start()
    yield proxy
    proxy.stop()


@pytest.fixture
def s3(moto_url):
    import boto3

    return boto3.client("s3", endpoint_url=moto_url, region_name="us-east-1")


_bucket_count = [0]


@pytest.fixture
def bucket(s3, request) -> str:
    _bucket_count[0] += 1
    name = f"ckpt-{_bucket_count[0]}-{request.node.name[:20].lower().replace('_', '-')}".rstrip("-")
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def one_rank(monkeypatch):
    """The trainer's process groups in this process: one rank, an in-memory store
    (init_distributed without torchrun). Yields its DistEnv."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    from ftfleet.trainer import distributed
    from ftfleet.trainer.config import ParallelConfig

    env = distributed.init_distributed(ParallelConfig(), 60)
    try:
        yield env
    finally:
        distributed.shutdown()


def in_process_manager(ckpt_dir: Path, *overrides: str, **parts):
    """A CheckpointManager over the BASE model in this process (one rank, no process
    group): for protocol tests that need a real load but not a training run. ``parts``:
    the app state's ``extras`` or ``per_rank``."""
    import torch

    from ftfleet.trainer.checkpoint.manager import CheckpointManager
    from ftfleet.trainer.checkpoint.state import AppState, TrainProgress
    from ftfleet.trainer.config import load_config
    from ftfleet.trainer.model import GPT

    cfg = load_config(CONFIG, [*BASE, f"checkpoint.dir={ckpt_dir}", *overrides], environ={})
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model.factories["factory"].args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.factories["factory"].args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    app = AppState(model, optimizer, scheduler, TrainProgress(), rank=0, seed=cfg.seed, **parts)
    return CheckpointManager(cfg.checkpoint, app, run_id=cfg.run_id, config_hash=cfg.config_hash())
