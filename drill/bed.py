"""A multi-node test bed on one machine: N nodes, each in a network namespace of its
own with its own address and its own shared-memory directory, joined by a bridge.

:class:`Bed` creates what it needs and removes all of it in :meth:`Bed.teardown`
(namespaces, links, shared-memory directories, every process it started), whatever
happened; names carry a per-bed prefix (``ff`` and 6 hex digits), so that beds of
parallel test workers never collide. The bridge's subnet lies only between namespaces
the bed made: no traffic leaves them.

Faults, on a node: :meth:`Bed.kill` (one process), :meth:`Bed.lose` (the whole node at
once: every process in its namespace SIGKILLed, its shared memory removed),
:meth:`Bed.partition` / :meth:`Bed.heal` (its link down and up), :meth:`Bed.slow`
(``tc ... tbf`` on its link; this kernel has no ``netem``).

Where namespaces cannot be made (not root, no ``ip``, a restricted CI) the bed falls
back to distinct loopback addresses (127.0.0.0/8): the processes and shared memory are
still the node's own, but there is no link to cut or slow, and :meth:`Bed.partition`
and :meth:`Bed.slow` raise :class:`LinksUnavailable`, saying why (:attr:`Bed.isolated`
tells beforehand; the tests' bed skips the test instead).

Used by the fleet drill (``python -m drill --nodes N``, :mod:`drill.fleet`) and the
multi-node tests (tests/multinode).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

#: The bridge's /24 (a private range; only the bed's namespaces hold addresses in it).
SUBNET = "10.213.7"
#: Node i's address on the bridge, and its loopback address in the fallback.
HOST_BASE = 10


class BedError(RuntimeError):
    """A command of the bed failed (its output says why)."""


class LinksUnavailable(BedError):
    """A fault that needs a link (a partition, a slow link) on a loopback bed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise BedError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process under it (from /proc; a process that ends meanwhile is skipped)."""
    todo, tree = [pid], []
    while todo:
        p = todo.pop()
        tree.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:  # the thread or the process is gone
                pass
    return tree


def namespaces_available() -> str | None:
    """None when this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2) on this machine"
    probe = f"ffprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Node:
    def __init__(self, bed: Bed, index: int) -> None:
        self.bed, self.index = bed, index
        self.name = f"{bed.prefix}n{index}"
        self.veth = f"{bed.prefix}v{index}"  # the bridge's end; the namespace's end is eth0
        self.addr = f"{SUBNET}.{HOST_BASE + index}" if bed.isolated else f"127.0.0.{HOST_BASE + index}"
        self.ifname = "eth0" if bed.isolated else "lo"
        self.shm = Path("/dev/shm") / f"{bed.prefix}-n{index}"
        self.procs: list[subprocess.Popen] = []

    def __repr__(self) -> str:
        return f"Node({self.index}, {self.addr})"

    def prefix(self) -> list[str]:
        """What runs a command inside this node."""
        return ["ip", "netns", "exec", self.name] if self.bed.isolated else []

    def popen(self, cmd: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start ``cmd`` on this node, in a session of its own (the bed kills it at teardown)."""
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen([*self.prefix(), *cmd], **kwargs)
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        """Every process on this node: in its namespace, or (fallback) under its processes."""
        if self.bed.isolated:
            out = _ip("netns", "pids", self.name, check=False).stdout.split()
            return [int(p) for p in out if p.isdigit()]
        return [p for proc in self.procs for p in process_tree(proc.pid)]


class Bed:
    """``n`` nodes; use as a context manager (or call :meth:`create` and, always,
    :meth:`teardown`)."""

    def __init__(self, n: int, *, isolated: bool | None = None) -> None:
        self.prefix = f"ff{uuid.uuid4().hex[:6]}"
        self.bridge = f"{self.prefix}br"
        why = namespaces_available() if isolated in (None, True) else "loopback addresses asked for"
        if isolated and why:
            raise BedError(f"network namespaces asked for, but {why}")
        self.isolated = why is None
        self.why_not_isolated = why
        self.nodes = [Node(self, i) for i in range(n)]

    def __enter__(self) -> Bed:
        try:
            self.create()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def __getitem__(self, index: int) -> Node:
        return self.nodes[index]

    # -- building and removing ----------------------------------------------------------

    def create(self) -> None:
        for node in self.nodes:
            node.shm.mkdir(mode=0o700)
        if not self.isolated:
            return
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for node in self.nodes:
            _ip("netns", "add", node.name)
            _ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.name)
            _ip("link", "set", node.veth, "master", self.bridge)
            _ip("link", "set", node.veth, "up")
            _ip("-n", node.name, "link", "set", "lo", "up")
            _ip("-n", node.name, "addr", "add", f"{node.addr}/24", "dev", "eth0")
            _ip("-n", node.name, "link", "set", "eth0", "up")

    def teardown(self) -> None:
        """Remove everything the bed made; never raises (a failure is reported as a warning)."""
        problems = []
        for node in self.nodes:
            self._kill_all(node)
            for proc in node.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
            shutil.rmtree(node.shm, ignore_errors=True)
        if self.isolated:
            for node in self.nodes:
                for args in (["netns", "del", node.name], ["link", "del", node.veth]):
                    if args[0] == "link" and not Path(f"/sys/class/net/{node.veth}").exists():
                        continue  # went with its namespace's end
                    done = _ip(*args, check=False)
                    if done.returncode != 0 and "No such file" not in done.stderr and "Cannot find" not in done.stderr:
                        problems.append(f"ip {' '.join(args)}: {done.stderr.strip()}")
            if Path(f"/sys/class/net/{self.bridge}").exists():
                done = _ip("link", "del", self.bridge, check=False)
                if done.returncode != 0:
                    problems.append(f"ip link del {self.bridge}: {done.stderr.strip()}")
        if problems:
            import warnings

            warnings.warn(f"bed {self.prefix}: teardown left {problems}", stacklevel=2)

    # -- faults -----------------------------------------------------------------------

    def kill(self, pid: int) -> None:
        """SIGKILL one process (a rank, an agent)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def lose(self, index: int) -> None:
        """The whole node is gone at once: every process on it SIGKILLed, its shared
        memory removed."""
        node = self.nodes[index]
        self._kill_all(node)
        shutil.rmtree(node.shm, ignore_errors=True)

    def partition(self, index: int) -> None:
        """Cut the node off from the others (its link down); :meth:`heal` undoes it."""
        self._need_links("a partition")
        _ip("-n", self.nodes[index].name, "link", "set", "eth0", "down")

    def heal(self, index: int) -> None:
        self._need_links("a partition")
        node = self.nodes[index]
        _ip("-n", node.name, "link", "set", "eth0", "up")
        _ip("-n", node.name, "addr", "replace", f"{node.addr}/24", "dev", "eth0")

    def slow(self, index: int, rate: str = "1mbit", burst: str = "32kbit", latency: str = "400ms") -> None:
        """Throttle the node's link, both ways (token bucket on each end)."""
        self._need_links("a slow link")
        node = self.nodes[index]
        for where in (["-n", node.name], []):
            dev = "eth0" if where else node.veth
            cmd = ["tc", *where, "qdisc", "replace", "dev", dev, "root", "tbf"]
            cmd += ["rate", rate, "burst", burst, "latency", latency]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                raise BedError(f"{' '.join(cmd)}: {done.stderr.strip()}")

    # -- helpers ----------------------------------------------------------------------

    def _need_links(self, what: str) -> None:
        if not self.isolated:
            raise LinksUnavailable(
                f"{what} needs network namespaces; this bed has loopback addresses: {self.why_not_isolated}"
            )

    def _kill_all(self, node: Node) -> None:
        for _ in range(3):  # what a dying process starts in its last moment goes too
            pids = [p for p in node.pids() if p != os.getpid()]
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
