"""A node of the drill: one ``torchrun`` (a node's life), its worker processes as the
outside world sees them, and the run's event log as it grows.

torchrun restarts its worker group in place (``--max-restarts``) after a worker dies;
:class:`Node` notices each new group by the pids of torchrun's children and records
when the first and the last worker of each group exited, which is how the drill times
what the event log cannot say (a SIGKILLed or hung process writes no ``exit`` line).
Worker discovery reads ``/proc`` (Linux): no extra dependency.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ftfleet.trainer.events import FILENAME as EVENTS_FILENAME


class EventTail:
    """Reads the lines appended to ``<run_dir>/events.jsonl`` since the last call; a line
    still being written is kept for the next call."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.path = Path(run_dir) / EVENTS_FILENAME
        self._offset = 0
        self._partial = b""
        self.events: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        new = []
        for line in lines:
            try:
                new.append(json.loads(line))
            except ValueError:  # a torn line of a killed writer
                continue
        self.events += new
        return new


@dataclasses.dataclass
class WorkerGroup:
    """One torchrun attempt's workers."""

    pids: dict[int, int]
    """rank -> pid"""
    t_up: float
    """Epoch seconds when the drill first saw them."""
    t_first_exit: float | None = None
    t_down: float | None = None


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
        return [int(p) for p in text.split()]
    except (OSError, ValueError):
        pass
    out = []  # kernels without CONFIG_PROC_CHILDREN: scan every process's parent
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat and stat[1] == pid:
                out.append(int(entry))
    return out


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _rank(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def _alive(pid: int, parent: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X") and stat[1] == parent


class Node:
    """One torchrun process and its worker groups, started in a session of its own."""

    def __init__(
        self, name: str, cmd: Sequence[str], env: dict[str, str], cwd: str | os.PathLike, log_path: Path
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.env = env
        self.cwd = cwd
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.groups: list[WorkerGroup] = []
        self.t_launch: float | None = None
        self.t_exit: float | None = None
        self.killed = False

    def start(self) -> Node:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.t_launch = time.time()
        try:
            self.proc = subprocess.Popen(
                self.cmd,
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.pid

    @property
    def group(self) -> WorkerGroup | None:
        return self.groups[-1] if self.groups else None

    def poll(self) -> int | None:
        """Update the worker groups; torchrun's exit status once it has exited."""
        now = time.time()
        group = self.group
        if group is not None and group.t_down is None:
            alive = [_alive(p, self.pid) for p in group.pids.values()]
            if not all(alive) and group.t_first_exit is None:
                group.t_first_exit = now
            if not any(alive):
                group.t_down = now
        rc = self.proc.poll() if self.proc else None
        if rc is None:
            known = {p for g in self.groups for p in g.pids.values()}
            fresh = {}
            for child in _children(self.pid):
                if child not in known and _alive(child, self.pid):
                    rank = _rank(child)
                    if rank is not None:
                        fresh[rank] = child
            if fresh:
                if group is not None and group.t_down is None and not fresh.keys() & group.pids.keys():
                    group.pids.update(fresh)  # a worker still exec'ing at the last poll
                else:
                    # torchrun starts a new group only once the last one is gone.
                    if group is not None and group.t_down is None:
                        group.t_first_exit = group.t_first_exit or now
                        group.t_down = now
                    self.groups.append(WorkerGroup(fresh, now))
        elif self.t_exit is None:
            self.t_exit = now
            if group is not None:
                group.t_first_exit = group.t_first_exit or now
                group.t_down = group.t_down or now
        return rc

    def kill_worker(self, rank: int, sig: int = signal.SIGKILL) -> int:
        """Send ``sig`` to the worker of ``rank`` in the current group; its pid."""
        group = self.group
        if group is None or rank not in group.pids:
            raise RuntimeError(f"{self.name}: no running worker of rank {rank}")
        pid = group.pids[rank]
        os.kill(pid, sig)
        return pid

    def kill(self) -> None:
        """SIGKILL torchrun and every worker: the machine is gone. torchrun starts each
        worker in a session of its own, so killing torchrun's process group alone would
        leave the workers training as orphans."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.killed = True
        workers = _children(self.pid)
        for pid in workers:
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)
        end = time.monotonic() + 10
        while time.monotonic() < end and any(_stat(p) and _stat(p)[0] not in ("Z", "X") for p in workers):
            time.sleep(0.02)
        self.poll()

    def wait(self, timeout: float) -> int | None:
        """Poll until torchrun exits or ``timeout`` passes; its exit status or None."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            rc = self.poll()
            if rc is not None:
                return rc
            time.sleep(0.02)
        return None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
