"""The process tree of a torchrun job, for tests that kill parts of it.

torchrun (torch 2.13) starts each worker in a session of its own, so a signal to the
agent's process group does not reach the workers, and a worker outlives a SIGKILLed
agent (measured). Tests therefore find the workers through /proc and kill them by pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tests.trainer.conftest import BIN, REPO, child_env, trainer_cmd

T = TypeVar("T")


def children(pid: int) -> list[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out.update(int(c) for c in (task / "children").read_text().split())
        except OSError:  # the thread or the process is gone
            pass
    return sorted(out)


def environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def workers(agent_pid: int) -> dict[int, int]:
    """LOCAL_RANK -> pid of the agent's live trainer workers (those already exec'd)."""
    found = {}
    for pid in children(agent_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        env = environ(pid)
        if (b"ftfleet.trainer" in cmdline or b"drill.worker" in cmdline) and "LOCAL_RANK" in env:
            found[int(env["LOCAL_RANK"])] = pid
    return found


def kill_node(agent: subprocess.Popen) -> None:
    """What a lost machine looks like to the others: the agent and its workers vanish."""
    pids = list(workers(agent.pid).values())
    agent.kill()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    agent.wait(timeout=30)


def trained_step(run_dir: Path, pids: list[int]) -> int:
    """The highest step these workers have started, from their sample traces
    (``data.trace_samples=true``); 0 before the first."""
    best = 0
    for pid in pids:
        for trace in (run_dir / "samples").glob(f"rank*-pid{pid}.txt"):
            complete = trace.read_text().split("\n")[:-1]
            if complete:
                best = max(best, int(complete[-1].split()[0]))
    return best


def pending_signals(pid: int) -> set[int]:
    """Signals sent to a (stopped) process and not delivered yet."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().split("\n")
    except OSError:
        return set()
    mask = 0
    for line in status:
        if line.startswith(("SigPnd:", "ShdPnd:")):
            mask |= int(line.split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def committed(run_dir: Path) -> dict[int, int]:
    """step -> world size that wrote it, of the run's committed local checkpoints."""
    out = {}
    for manifest in (run_dir / "checkpoints").glob("step-*/manifest.json"):
        try:
            out[int(manifest.parent.name[5:])] = json.loads(manifest.read_text())["world_size"]
        except (OSError, ValueError, KeyError):  # being replaced, or retention deleted it
            pass
    return out


class ElasticNodes:
    """Two torchrun agents (``--nnodes=1:2``, one process each) playing two nodes of one
    elastic job, rendezvousing through a c10d store at ``endpoint`` that neither hosts
    (``is_host=false``), as a fleet has to run it: by default the agent that binds the
    endpoint's port first hosts the store, and losing its node ends the job (the
    survivor's agent fails with RendezvousConnectionError; measured, torch 2.13)."""

    #: Round 0 waits this long for the second node once the first has joined (both
    #: agents start at once and joined 0.3 s apart on a loaded 2-core machine); a round
    #: after a node is lost waits as long for it to come back.
    LAST_CALL_S = 5
    RDZV_CONF = (
        f"is_host=false,last_call_timeout={LAST_CALL_S},join_timeout=120,"
        # A node without a keep-alive for 5 s is dropped (default 15 s). An agent
        # writes one only when its last is a full interval old, so they come 1 to
        # 2 s apart: a 2 s limit dropped live nodes.
        "keep_alive_interval=1,keep_alive_max_attempt=5"
    )

    def __init__(self, endpoint: str, run_dir: Path, logs: Path, *overrides: str):
        self.run_dir, self.logs = run_dir, logs
        self.agents: list[subprocess.Popen] = []
        for n in range(2):
            cmd = [
                str(BIN / "torchrun"),
                "--nnodes=1:2",
                "--nproc-per-node=1",
                "--max-restarts=1",
                "--monitor-interval=0.1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}",
                "--rdzv-id=elastic",
                f"--rdzv-conf={self.RDZV_CONF}",
                *trainer_cmd(1, run_dir, *overrides)[1:],
            ]
            with open(logs / f"node{n}.log", "w") as log:
                self.agents.append(
                    subprocess.Popen(
                        cmd, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                    )
                )

    def workers(self) -> list[int | None]:
        return [workers(a.pid).get(0) for a in self.agents]

    def wait_for(self, predicate: Callable[[], T | None], timeout_s: float, what: str) -> T:
        """Poll ``predicate`` while both agents live."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if value := predicate():
                return value
            rcs = [a.poll() for a in self.agents]
            assert rcs == [None, None], f"agents exited ({rcs}) while waiting for {what}\n{self.log_tail()}"
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting for {what}\n{self.log_tail()}")

    def training_together(self, past_step: int) -> dict[int, subprocess.Popen] | None:
        """GROUP_RANK -> agent, once both workers are in one world of 2, a checkpoint is
        committed and both have started ``past_step``."""
        pids = self.workers()
        if None in pids or trained_step(self.run_dir, pids) < past_step:
            return None
        envs = [environ(p) for p in pids]
        if not committed(self.run_dir) or any(e.get("WORLD_SIZE") != "2" for e in envs):
            return None
        return {int(e["GROUP_RANK"]): a for e, a in zip(envs, self.agents, strict=True)}

    def log_tail(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text()[-3000:]}" for p in sorted(self.logs.glob("node*.log")))

    def stop(self) -> None:
        for agent in self.agents:
            if agent.poll() is None:
                kill_node(agent)
