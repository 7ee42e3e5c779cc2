"""A launcher's death ends its workers within 5 s, and nothing is committed after it.

torchrun starts its workers in sessions of their own; the in-process launcher's are
plain children. Killed alone (the OOM killer, a scheduler that signals one pid), either
launcher used to leave its workers training as orphans, committing checkpoints into the
run directory that a relaunch then shared. Each case SIGKILLs the launcher alone while
its workers train, snapshot every step and checkpoint every 2 steps, and checks that
every process below it (workers, spares, loader workers and their servers, the
wrapper's monitors) is gone within 5 s, that no manifest (disk checkpoint or in-memory
snapshot) was written after the kill, and that rank 0 said why in the event log. The
torchrun case has loader workers (a server and 2 workers per rank); the in-process
case has 2 ranks and a waiting spare.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ftfleet.contract import EXIT_FENCED
from ftfleet.trainer.events import read_events
from tests.trainer.conftest import (
    BASE,
    LOADER_WORKERS,
    MEMORY,
    REPO,
    _tree,
    child_env,
    inprocess_cmd,
    trainer_cmd,
    wait_for,
)
from tests.trainer.resilience.torchrun_tree import environ

pytestmark = pytest.mark.integration

#: Long enough never to finish during the test; paced so that the kill lands mid-run.
ARGS = [
    *BASE,
    *MEMORY,
    "train.steps=100000",
    "resilience.interval.fixed_steps=2",
    "train.step_events=true",
]
GONE_WITHIN_S = 5.0


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's reaper may be slow to collect it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def job_processes(launcher_pid: int, key: str) -> set[int]:
    """The launcher's processes: every process below it, and every process whose
    environment holds the same ``key`` as its first worker's (torchrun's run id, the
    in-process launcher's pid), which finds those that left the tree (the wrapper's
    monitor daemonizes)."""
    below = set(_tree(launcher_pid)[1:])
    value = next((environ(p).get(key) for p in sorted(below) if environ(p).get(key)), None)
    for entry in Path("/proc").glob("[0-9]*"):
        if value is not None and environ(int(entry.name)).get(key) == value:
            below.add(int(entry.name))
    below.discard(os.getpid())
    return below


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    except OSError:
        return "?"


def manifests(*roots: Path) -> dict[Path, int]:
    """Every manifest under ``roots`` (disk checkpoints, snapshots, their copies) -> mtime (ns)."""
    out = {}
    for root in roots:
        for path in root.rglob("manifest.json"):
            with contextlib.suppress(OSError):  # retired meanwhile
                out[path] = path.stat().st_mtime_ns
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("launcher", ["torchrun", "inprocess"])
def test_workers_are_gone_within_5s_of_their_launchers_sigkill_and_commit_nothing_after(tmp_path, launcher):
    run_dir, shm = tmp_path / "run", tmp_path / "shm"
    if launcher == "torchrun":  # with the loader's workers, which go with their rank
        cmd = trainer_cmd(2, run_dir, *ARGS, LOADER_WORKERS, "faults.step_delay_s=0.05")
        workers, key = 2, "TORCHELASTIC_RUN_ID"
    else:  # 2 ranks and a waiting spare, each with the wrapper's (daemonized) monitor process
        cmd = inprocess_cmd(run_dir, *ARGS, "faults.step_delay_s=0.05")
        workers, key = 3, "FTFLEET_LAUNCHER_PID"
    log_path = tmp_path / "launch.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=child_env({"FTFLEET_SHM_DIR": str(shm)}),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    tree: set[int] = set()
    try:
        wait_for(
            lambda: any(e["event"] == "committed" and e["step"] >= 4 for e in read_events(run_dir)),
            120,
            interval=0.05,
            what=f"a checkpoint of step 4 or later: {log_path}",
        )
        tree = job_processes(proc.pid, key)
        kinds = len(tree)
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone
        proc.wait(timeout=10)
        # Gone from here on: until the kernel has finished its exit, its children are
        # still its children (getppid), and a commit checked then may land just after.
        gone_at = time.time_ns()
        deadline = time.monotonic() + GONE_WITHIN_S
        while time.monotonic() < deadline and any(running(p) for p in tree):
            time.sleep(0.02)
        left = [(p, _cmdline(p)) for p in tree if running(p)]
        assert not left, (
            f"{len(left)} of {kinds} processes still running 5 s after the kill\n" + log_path.read_text()[-4000:]
        )
    finally:
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # The workers, and processes of their own (loader workers and their server, monitors).
    assert kinds > workers, f"only {kinds} processes under the launcher"
    late = {p: t for p, t in manifests(run_dir / "checkpoints", shm).items() if t > gone_at}
    assert not late, f"written after the kill: {sorted(map(str, late))}"
    fenced = [e for e in read_events(run_dir) if e["event"] == "fenced"]
    # Every rank that leaves says why (the first rank out may be one whose commit was refused).
    assert any(e.get("launcher_pid") == proc.pid for e in fenced), fenced
    text = log_path.read_text()
    assert f"(pid {proc.pid}) is gone: this process leaves without committing anything more (exit {EXIT_FENCED})" in (
        text
    ), text[-3000:]
