"""A torchrun job across the bed's nodes: one agent per node, the c10d rendezvous on
node 0, gloo on each node's own link."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

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


class InprocessJob:
    """The in-process launcher on nodes ``0 .. nnodes + spare_nodes - 1`` of ``bed``, each
    taking its node slot from the job's store (``--node-rank auto``: the first ``nnodes``
    to register train ``nproc`` ranks each, the next wait as spare nodes). The job's
    stores live on the bed's last node, a coordinator that trains nothing (``--nproc 0
    --host-stores``), as the fleet's on-demand coordinator hosts them: no training node's
    loss takes them. Every node's shared memory is its own (FTFLEET_SHM_DIR)."""

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
    ) -> None:
        from tests.trainer.conftest import CONFIG

        if len(bed.nodes) != nnodes + spare_nodes + 1:
            raise ValueError(f"a bed of {nnodes + spare_nodes + 1} nodes: the job's and the coordinator")
        self.bed, self.run_dir, self.logs = bed, run_dir, logs
        self.nnodes, self.spare_nodes, self.nproc = nnodes, spare_nodes, nproc
        coordinator = bed[nnodes + spare_nodes]
        self.port = RDZV_PORT if bed.isolated else free_port(coordinator.addr)
        self.common = [f"--master-addr={coordinator.addr}", "--soft-timeout=30", "--worker=drill.inprocess_worker"]
        self.common += [f"--heartbeat-timeout={heartbeat_timeout}"]
        self.trainer_args = ["--config", str(CONFIG), *overrides, f"run_dir={run_dir}"]
        self.stores = self._start(coordinator, ["--nproc=0", "--host-stores", *self.common, "--"], "coordinator")
        time.sleep(0.5)  # the stores listen before the first launcher connects
        self.launchers: dict[int, subprocess.Popen] = {}
        self.starts: dict[int, int] = {}  # bed node -> launches so far
        for node in bed.nodes[: nnodes + spare_nodes]:
            self.start(node.index)

    def start(self, index: int) -> subprocess.Popen:
        """(Re)start node ``index``'s launcher (its log: ``node<index>.<n>.log``)."""
        node = self.bed[index]
        cmd = [f"--nproc={self.nproc}", "--spares=0", f"--nnodes={self.nnodes}", f"--spare-nodes={self.spare_nodes}"]
        cmd += ["--node-rank=auto", "--no-host-stores", *self.common, "--", *self.trainer_args]
        self.starts[index] = self.starts.get(index, -1) + 1
        env = {"GLOO_SOCKET_IFNAME": node.ifname, "FTFLEET_SHM_DIR": str(node.shm)}
        self.launchers[index] = self._start(node, cmd, f"node{index}.{self.starts[index]}", env)
        return self.launchers[index]

    def _start(self, node, launcher_args, name, env=None) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "ftfleet.trainer.inprocess", *launcher_args]
        env = child_env({"MASTER_PORT": str(self.port), **(env or {})})
        with open(self.logs / f"{name}.log", "w") as log:
            return node.popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def _log(self, index: int) -> str:
        return (self.logs / f"node{index}.{self.starts[index]}.log").read_text()

    def slot(self, index: int) -> int | None:
        """The node slot bed node ``index``'s current launcher took, once it has."""
        for line in self._log(index).splitlines():
            if line.startswith("ftfleet.inprocess: round ") and ", node " in line:
                return int(line.split(", node ")[1].split()[0])
        return None

    def pids(self, index: int) -> dict[int, int]:
        """rank -> pid of the processes bed node ``index``'s current launcher started."""
        out = {}
        for line in self._log(index).splitlines():
            if line.startswith("ftfleet.inprocess: process "):
                _, _, rank, _, pid = line.split()
                out[int(rank)] = int(pid)
        return out

    def wait(self, timeout: float, nodes: list[int] | None = None) -> dict[int, int | None]:
        """Bed node -> its launcher's exit code once those of ``nodes`` (default: all) have
        ended, or None for one still running at ``timeout``."""
        waited = [self.launchers[i] for i in (self.launchers if nodes is None else nodes)]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(a.poll() is None for a in waited):
            time.sleep(0.1)
        return {i: a.poll() for i, a in self.launchers.items()}

    def log_tail(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text()[-chars:]}" for p in sorted(self.logs.glob("*.log")))
