"""A torchrun job across the bed's nodes: one agent per node, the c10d rendezvous on
node 0, gloo on each node's own link."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from drill.fleet import FleetJob
from tests.multinode.bed import Bed
from tests.trainer.conftest import BIN, REPO, child_env, trainer_cmd

RDZV_PORT = 29400


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


class Job:
    """``nnodes`` (e.g. ``2`` or ``1:2``) agents of ``nproc`` workers each, one per node
    of ``bed``, training ``run_dir`` (shared, as a fleet's fast tier is) with
    ``overrides``; every node's shared memory is its own (FTFLEET_SHM_DIR)."""

    def __init__(
        self,
        bed: Bed,
        run_dir: Path,
        logs: Path,
        *overrides: str,
        nnodes: str = "2",
        nproc: int = 1,
        max_restarts: int = 0,
        rdzv_conf: str = "",
    ) -> None:
        self.bed, self.run_dir, self.logs = bed, run_dir, logs
        host = bed[0].addr
        port = RDZV_PORT if bed.isolated else free_port(host)
        self.agents: list[subprocess.Popen] = []
        for node in bed.nodes:
            conf = f"is_host={'true' if node.index == 0 else 'false'}" + (f",{rdzv_conf}" if rdzv_conf else "")
            cmd = [
                str(BIN / "torchrun"),
                f"--nnodes={nnodes}",
                f"--nproc-per-node={nproc}",
                f"--max-restarts={max_restarts}",
                "--monitor-interval=0.1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint={host}:{port}",
                "--rdzv-id=bed",
                f"--rdzv-conf={conf}",
                f"--local-addr={node.addr}",
                *trainer_cmd(1, run_dir, *overrides)[1:],
            ]
            env = child_env({"GLOO_SOCKET_IFNAME": node.ifname, "FTFLEET_SHM_DIR": str(node.shm)})
            with open(logs / f"node{node.index}.log", "w") as log:
                self.agents.append(node.popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))

    def wait(self, timeout: float, nodes: list[int] | None = None) -> list[int | None]:
        """Each agent's exit code once those of ``nodes`` (default: all) exit, or None for
        one still running at ``timeout``."""
        waited = [self.agents[i] for i in (range(len(self.agents)) if nodes is None else nodes)]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(a.poll() is None for a in waited):
            time.sleep(0.1)
        return [a.poll() for a in self.agents]

    def log_tail(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text()[-chars:]}" for p in sorted(self.logs.glob("node*.log")))


class InprocessJob(FleetJob):
    """The fleet drill's in-process job (:class:`drill.fleet.FleetJob`: a node slot each
    from the job's stores on the bed's last node, a coordinator that trains nothing) on
    the tests' tiny config and environment."""

    def __init__(
        self,
        bed: Bed,
        run_dir: Path,
        logs: Path,
        *overrides: str,
        nnodes: int = 2,
        spare_nodes: int = 1,
        nproc: int = 1,
        heartbeat_timeout: float = 2.0,
        extra: tuple[str, ...] = (),
    ) -> None:
        from tests.trainer.conftest import CONFIG

        self.run_dir = run_dir
        args = ["--config", str(CONFIG), *overrides, f"run_dir={run_dir}"]
        super().__init__(
            bed,
            logs,
            args,
            nnodes=nnodes,
            spare_nodes=spare_nodes,
            nproc=nproc,
            heartbeat_timeout=heartbeat_timeout,
            env=child_env(),
            extra=extra,
        )
