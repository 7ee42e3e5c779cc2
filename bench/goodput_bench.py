"""Goodput under a failure every T seconds: naive synchronous saves, async saves, and
ftfleet (adaptive async saves + emergency checkpoints on notices), in the same run.

    .venv/bin/python bench/goodput_bench.py --mtbf 60 --failures 4 --out /tmp/goodput

* Failures strike every ``--mtbf`` T seconds of wall time, counted from the first
  training step, alternating a spot interruption notice (posted on the fake metadata
  service; the node is terminated once its commit marker is written, the fleet's lifecycle
  handoff, or ``--notice-lead`` seconds later at the latest)
  and a SIGKILL of one worker (torchrun restarts the group in place). A terminated node
  is replaced by a new torchrun at once.
* The model is sized so that a synchronous save costs about T/72: a 5-minute save
  against a 6-hour MTBF (measured by calibration runs, then reported).
* Configurations, each training the same number of steps (about ``--failures`` x T of
  uninterrupted work):
  (a) ``sync``: blocking saves every Young interval sqrt(2 C M) with C the measured
      synchronous save cost and M = T; it does not watch for notices;
  (b) ``async``: the same interval, asynchronous saves; no notices either;
  (c) ``ftfleet``: the adaptive (Daly) interval, each save in the mode measured
      cheaper (``checkpoint.async_save=auto``), M given as T (``mtbf_source=config``, as
      the fleet's metrics would give it), notices watched: emergency checkpoint, exit
      75, replacement node;
  (d) ``inprocess``: ftfleet's settings plus in-process restart, a warm spare process
      and a warm spare node, in-memory snapshots at their own Daly interval.
* The in-process run's nodes share this machine, each with its own RAM file system
  (``FTFLEET_SHM_DIR``). Its spare node is a launcher started with ``--wait-for`` (torch
  imported, waiting); the first one is up before the first node trains, as a fleet's
  spare nodes are booted before the job, and each take-over starts the next one,
  niced. A node gone leaves its snapshot files to the next spare node as its reserve
  (:func:`recycle_memory`): on a fleet the gone node's RAM vanishes and the spare's is
  its own, and neither costs the training node; here freeing 4 GB and allocating 4 GB
  again would each cost it seconds of the host's page work.
* Where the wall time went: ``overhead_s`` (see :func:`overhead`).
* Goodput = steps x useful seconds per step / wall time from the end of the first
  training step to the last (the steps after the first, which fill that time), where
  useful seconds per step is the median step of the same run that had no save or
  snapshot in flight (``saving``, ``snapshotting`` in the step events): checkpoint blocking, the slowdown of
  steps under a background save, restarts and lost work are the overhead. The
  uninterrupted reference's s/step gives a second figure (``goodput_vs_reference``),
  which the machine's drift between runs skews.
* Restart cost R: from a failed group's end (torchrun tore it down, or the node was
  terminated) to the start of the first step after the restore, averaged over every
  failure; split into process start (to the process group being up: torchrun,
  ``import torch``, rendezvous) and restore (find, verify, load).
* Daly's model (exponential failures, mean M = T): goodput(tau) = tau / (M e^(R/M)
  (e^((tau + C)/M) - 1)), at its best at Daly's interval; computed with the measured C
  and R. The PNG plots it against the checkpoint interval with the measured points.

Every process gets the host allocator the image's entrypoint gives its trainers
(``FTFLEET_HOST_ALLOCATOR``; unset, jemalloc where installed: ``apt-get install
libjemalloc2``), recorded as ``setup.host_allocator``.

Timings on a small shared machine are noisy; every figure comes with what it was
computed from in the JSON (``--out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import record  # noqa: E402
from drill.fake_metadata import FakeMetadataServer  # noqa: E402
from drill.lives import split_lives, steady_step_time  # noqa: E402
from drill.runner import EventTail, Node, _children  # noqa: E402
from ftfleet.contract import RESERVE_DIR, ContractError, reserved_name  # noqa: E402
from ftfleet.hostenv import host_memory_env, is_malloc  # noqa: E402
from ftfleet.trainer.inprocess.worker import snapshot_bytes_estimate  # noqa: E402  (no torch: the bench never imports it)
from ftfleet.trainer.resilience.interval.adaptive import (  # noqa: E402
    daly_goodput,  # noqa: E402
    daly_interval,
    young_interval,
)

CONFIG = REPO / "trainer" / "configs" / "tiny.yaml"
VOCAB, LAYERS, HEADS = 8192, 2, 8


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Running the trainer
# ---------------------------------------------------------------------------


def model_overrides(d_model: int) -> list[str]:
    # A short sequence and one sample per rank: the state is large, the step cheap.
    return [
        f"model.vocab_size={VOCAB}",
        "model.seq_len=16",
        f"model.d_model={d_model}",
        f"model.n_layers={LAYERS}",
        f"model.n_heads={HEADS}",
        "model.dropout=0.0",
        "train.global_batch_size=2",
        "train.log_every=100000",
        "train.step_events=true",
        "checkpoint.keep=2",
        "resilience.watchdog.timeout_s=600",
        "run_id=goodput",
    ]


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("FTFLEET_", "AWS_", "TORCHELASTIC_"))}
    out.update(host_memory_env(os.environ))  # as the image's entrypoint (allocator, glibc tunables)
    out.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    out.update(extra or {})
    return out


#: The niceness of a spare node's processes until it takes over (only where it can be
#: given back: lowering a niceness needs root).
SPARE_NICE = 19
CAN_UNNICE = os.geteuid() == 0


def set_autogroup_nice(pid: int, value: int) -> None:
    """The niceness of ``pid``'s autogroup (its session's), where the kernel groups tasks by
    session (``/proc/sys/kernel/sched_autogroup_enabled``): the scheduler first shares the
    CPU between autogroups, and a thread's own niceness weighs only within its group. A
    spare node runs in a session of its own, so a nice of 19 on its threads alone left it
    an equal share beside the active node's session. (Tasks in a cpu cgroup other than
    the root one are shared by their cgroup instead; then this changes nothing.)"""
    for _ in range(3):
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(value))
            return
        except FileNotFoundError:  # no autogroups (or the process is gone): the threads' nice is all
            return
        except BlockingIOError:
            # Without CAP_SYS_ADMIN the kernel takes one such write per 100 ms, machine-wide:
            # a take-over writes the old spare's 0 and the new spare's 19 in a row.
            time.sleep(0.11)
        except OSError as exc:
            say(f"cannot set the autogroup niceness of pid {pid}: {exc}")
            return
    say(f"cannot set the autogroup niceness of pid {pid}: refused 3 times (EAGAIN)")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (the children of each process's main thread)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(_children(p))
    return out


def unnice(pid: int) -> None:
    """Every thread of ``pid`` and its descendants back to niceness 0 (nice is per thread
    on Linux; threads started later inherit their creator's), and its autogroup."""
    set_autogroup_nice(pid, 0)
    for p in process_tree(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:  # gone meanwhile
            continue
        for tid in tids:
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), 0)
            except ProcessLookupError:
                pass
            except PermissionError:
                say(f"cannot give pid {p} its priority back (not root): the spare node stays niced")
                return


def cmd(
    nproc: int,
    run_dir: Path,
    overrides: list[str],
    *,
    spares: int = 0,
    wait_for: Path | None = None,
    config: Path = CONFIG,
) -> list[str]:
    """torchrun (``spares`` 0) or, with ``spares`` >= 1, the in-process launcher with
    that many warm spare processes; ``wait_for``: a spare node, held until the file exists."""
    trainer = ["--config", str(config), f"run_dir={run_dir}", *overrides]
    if spares:
        gate = ["--wait-for", str(wait_for)] if wait_for else []
        return [
            sys.executable,
            "-m",
            "ftfleet.trainer.inprocess",
            f"--nproc={nproc}",
            f"--spares={spares}",
            "--soft-timeout=600",
            *gate,
            "--",
            *trainer,
        ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "--max-restarts=100",
        "-m",
        "ftfleet.trainer",
        *trainer,
    ]


def run_plain(name: str, run_dir: Path, overrides: list[str], nproc: int, timeout: float = 900) -> list[dict[str, Any]]:
    """One uninterrupted run to completion; its events."""
    shutil.rmtree(run_dir, ignore_errors=True)
    node = Node(name, cmd(nproc, run_dir, overrides), env(), REPO, run_dir.parent / f"{name}.log").start()
    rc = node.wait(timeout)
    if rc != 0:
        node.kill()
        raise SystemExit(f"{name}: trainer exited {rc}; see {node.log_path}\n{node.log_tail(2000)}")
    return list(EventTail(run_dir).poll())


def reference_step_s(work: Path, base: list[str], nproc: int) -> float | None:
    """Seconds per step of an uninterrupted run without checkpoints (steady state)."""
    events = run_plain("reference", work / "reference", base + ["train.steps=12", "checkpoint.enabled=false"], nproc)
    return steady_step_time(events)


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def state_bytes(d_model: int) -> int:
    """Model + AdamW's two moments, fp32 (12 bytes a parameter)."""
    d = d_model
    params = 2 * VOCAB * d + 32 * d + LAYERS * (12 * d * d + 13 * d) + 2 * d
    return 12 * params


# ---------------------------------------------------------------------------
# Calibration: size the state so that a synchronous save costs T / ratio
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Calibration:
    d_model: int
    save_s: float
    step_s: float
    bytes: int


def calibrate(work: Path, d_model: int, nproc: int) -> Calibration:
    run_dir = work / f"calibrate-{d_model}"
    events = run_plain(
        f"calibrate-{d_model}",
        run_dir,
        model_overrides(d_model)
        + [
            "train.steps=13",
            "checkpoint.async_save=false",
            "resilience.interval.mode=fixed",
            "resilience.interval.fixed_steps=3",
            "checkpoint.enabled=true",
        ],
        nproc,
    )
    saves = [e["blocked_s"] for e in events if e["event"] == "committed" and e.get("reason") == "interval"]
    steps = [e["seconds"] for e in events if e["event"] == "step"]
    size = max((dir_bytes(p) for p in (run_dir / "checkpoints").glob("step-*")), default=0)
    shutil.rmtree(run_dir, ignore_errors=True)
    return Calibration(d_model, statistics.median(saves[1:] or saves), statistics.median(steps), size)


def size_state(work: Path, target_s: float, nproc: int) -> Calibration:
    cal = calibrate(work, 512, nproc)
    say(f"calibration: d_model 512, {cal.bytes / 1e6:.0f} MB, sync save {cal.save_s:.2f}s, step {cal.step_s:.3f}s")
    for _ in range(2):
        want = state_bytes(cal.d_model) * target_s / max(cal.save_s, 1e-3)
        d = max(64, min(4096, cal.d_model))
        while state_bytes(d) < want and d < 4096:
            d += 64
        while state_bytes(d) > want and d > 128:
            d -= 64
        if d == cal.d_model:
            break
        cal = calibrate(work, d, nproc)
        say(
            f"calibration: d_model {d}, {cal.bytes / 1e6:.0f} MB, sync save {cal.save_s:.2f}s "
            f"(target {target_s:.2f}s), step {cal.step_s:.3f}s"
        )
        if abs(cal.save_s - target_s) < 0.25 * target_s:
            break
    return cal


# ---------------------------------------------------------------------------
# A run under failures
# ---------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by ``pid`` and its live descendants (utime + stime; the
    children of each process's main thread, where the launcher and torch start theirs).
    A child that exits takes its seconds with it: the sum can fall."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for p in process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


#: Files smaller than this in a node's snapshot tier are not snapshots (manifests, markers).
RECYCLE_MIN_BYTES = 1 << 20


def recycle_memory(old: Path, new: Path, nproc: int, size: int) -> int:
    """Make the snapshot files a gone node left in its RAM file system (``old``, its
    ``FTFLEET_SHM_DIR``) the reserve of the spare node just started on ``new``, under the
    names its local ranks fill (:func:`~ftfleet.contract.reserved_name`, for each of the
    ``nproc``), each grown past ``size`` (the spare's estimate) by a quarter: the growth
    is a hole, no new pages, and a spare whose own estimate comes out a little larger
    (a newer checkpoint) still finds them big enough. Hidden files (one being reserved
    when the node went) are left. Returns how many files were moved.

    On a fleet the two are different machines: the gone node's RAM vanishes with it, and
    the spare's reserve is its own RAM, neither at the training node's expense. On the
    bench's one virtual machine, 4 GB freed goes back to the host, and 4 GB reserved
    comes back through the host's faults, each costing the training node seconds whatever
    the niceness; moving the files costs neither. What the files hold is stale: the reserve is never read as a
    snapshot (no manifest), and a snapshot taken into one writes its bytes and takes its
    CRC32C over the file's mapped bytes before its manifest commits it."""
    moved = 0
    for tier in sorted(old.glob("ftfleet-*")):
        found = []
        for p in tier.rglob("*"):
            try:
                if p.name.startswith(".") or not p.is_file() or p.is_symlink():
                    continue
                n = p.stat().st_size
            except OSError:
                continue
            if n >= RECYCLE_MIN_BYTES:
                found.append((n, p))
        reserve = new / tier.name / RESERVE_DIR
        reserve.mkdir(parents=True, exist_ok=True)
        for i, (n, p) in enumerate(sorted(found, reverse=True)):
            target = reserve / reserved_name(i % nproc, i // nproc)
            os.replace(p, target)
            os.truncate(target, max(n, size) * 5 // 4)
            moved += 1
    return moved


#: Seconds between looks at a spare node booting before the first node trains.
BOOT_POLL_S = 1.0


@dataclasses.dataclass
class Failure:
    kind: str  # "notice" | "sigkill"
    t: float
    """When it struck (notice posted / signal sent)."""
    t_end: float | None = None
    """When the failed group was gone (torn down, exited 75, or the node terminated)."""
    how: str = ""


class FaultedRun:
    def __init__(
        self,
        name: str,
        overrides: list[str],
        *,
        watch_notices: bool,
        args: Any,
        work: Path,
        metadata: FakeMetadataServer,
        spares: int = 0,
    ) -> None:
        self.name, self.overrides, self.watch = name, overrides, watch_notices
        self.args, self.metadata = args, metadata
        self.spares = spares
        """0: torchrun; >= 1: the in-process launcher with that many warm spare processes,
        and one warm spare node behind the active one."""
        self.run_dir = work / name
        self.failures: list[Failure] = []
        self.nodes: list[Node] = []
        self.standby: Node | None = None
        self._gates: dict[str, Path] = {}
        self._shm: dict[str, Path] = {}
        #: Each spare node's start beside the training node: [started, ready] (time.time();
        #: ready once its snapshot files are reserved, or when it takes over first).
        self.spare_boots: dict[str, list[float | None]] = {}
        self._spare_looked = 0.0
        #: The last node gone's RAM (its snapshot tier), until the next spare node
        #: takes it as its reserve (:func:`recycle_memory`).
        self._left: Path | None = None

    def _start(self, gate: Path | None = None) -> Node:
        n = len(self.nodes) + 1
        extra = {"FTFLEET_NODE_ID": f"{self.name}-node-{n}"}
        if self.watch:
            extra.update(FTFLEET_CLOUD="aws", FTFLEET_METADATA_ENDPOINT=self.metadata.url)
        name = f"{self.name}-{n}"
        if self.spares:
            # Each node's own RAM: a replacement node does not find its predecessor's.
            self._shm[name] = Path(self.args.shm_root) / f"ftfleet-goodput-{os.getpid()}-{name}"
            extra["FTFLEET_SHM_DIR"] = str(self._shm[name])
            if gate is not None and self._left is not None:
                self._recycle(self._shm[name])
        command = cmd(self.args.nproc, self.run_dir, self.overrides, spares=self.spares, wait_for=gate)
        if gate is not None and CAN_UNNICE:
            # A spare node is another machine on the fleet: its boot (three processes
            # importing torch) must not take the active node's CPU here. Niced until it
            # takes over (launch() gives its processes their priority back).
            command = ["nice", "-n", str(SPARE_NICE), *command]
        node = Node(
            name,
            command,
            env(extra),
            REPO,
            self.run_dir.parent / f"{name}.log",
        ).start()
        if gate is not None:
            self._gates[name] = gate
            self.spare_boots[name] = [time.time(), None]
            if CAN_UNNICE:
                set_autogroup_nice(node.pid, SPARE_NICE)
        self.nodes.append(node)
        return node

    def launch(self) -> Node:
        """The next node to train. On the first call of an in-process run, a spare node
        (a launcher started with ``--wait-for``: torch imported, waiting) is started and
        waited for before a fresh node trains, as a fleet's spare nodes are up before the
        job starts; on later calls the spare node is told to go and the next one starts.
        Otherwise (torchrun, or no spare left) a fresh node."""
        first = not self.nodes
        if self.spares and first:
            self.standby = self._start(self._gate())
            if not self._booted(self.standby):
                self.spare_boots.pop(self.standby.name, None)  # no start to count beside training
                self.gone(self.standby)
                self.standby = None
        if self.standby is not None and not first:
            node, self.standby = self.standby, None
            self._spare_ready(node, take_over=True)
            unnice(node.pid)
            self._gates[node.name].touch()
        else:
            node = self._start()
        if self.spares and self.standby is None:
            self.standby = self._start(self._gate())
        return node

    def _gate(self) -> Path:
        return self.run_dir.parent / f"{self.name}-go-{len(self.nodes) + 1}"

    def _booted(self, node: Node, timeout: float = 300.0) -> bool:
        """Wait until ``node`` (a spare) is warm: its log says it waits, and its processes
        used under 0.05 s of CPU in each of two looks in a row (the other ranks' imports
        end about then too). From then until a durable checkpoint exists to size its
        reserve by, it only waits: its start window opens again at the first commit
        (:meth:`_run`). False (and said) when it exited; one not settled in ``timeout`` is
        said, and training starts beside it (True)."""
        end, last, quiet = time.monotonic() + timeout, None, 0
        while time.monotonic() < end:
            if node.poll() is not None:
                say(f"{self.name}: the spare node exited while it booted (see {node.log_path}); none before the job")
                return False
            if "warm: waiting for" in node.log_tail(20000):
                used = cpu_seconds(node.pid)
                quiet = quiet + 1 if last is not None and 0 <= used - last < 0.05 else 0
                if quiet >= 2:
                    self.spare_boots[node.name] = [None, None]
                    return True
                last = used
            time.sleep(BOOT_POLL_S)
        say(f"{self.name}: the spare node was not idle after {timeout:.0f}s; training starts beside it")
        return True

    def _recycle(self, shm: Path) -> None:
        """The last node gone's snapshot files become the reserve of the spare node to
        start on ``shm`` (:func:`recycle_memory`); the rest of its RAM is freed."""
        left, self._left = self._left, None
        size = self.reserve_bytes()
        if not size:
            say(f"{self.name}: no durable checkpoint to size the reserve by; the files are grown by a quarter only")
        try:
            moved = recycle_memory(left, shm, self.args.nproc, size)
        except OSError as exc:
            say(f"{self.name}: the node gone's snapshot files were not moved ({exc}); freed instead")
        else:
            say(f"{self.name}: the node gone's {moved} snapshot files are the new spare's reserve")
        shutil.rmtree(left, ignore_errors=True)

    def reserve_bytes(self) -> int:
        """What a spare node sizes each reserved file by (the newest durable checkpoint);
        0 before there is one."""
        try:
            return snapshot_bytes_estimate(str(self.run_dir / "checkpoints"), self.args.nproc) or 0
        except (OSError, ValueError):
            return 0

    def _spare_ready(self, node: Node, take_over: bool = False) -> None:
        """Close ``node``'s boot window once its log says its snapshot files are reserved
        (the last thing a spare node does before it only waits), or at its take-over."""
        window = self.spare_boots.get(node.name)
        if window is None or window[1] is not None:
            return
        now = time.time()
        if not take_over:
            if now - self._spare_looked < 0.5:  # its log, twice a second
                return
            self._spare_looked = now
            if "reserved for snapshots" not in node.log_tail(20000):
                return
        window[1] = now

    def gone(self, node: Node) -> None:
        """The machine is gone: its processes, and its RAM, which the next spare node
        started takes as its reserve (:func:`recycle_memory`)."""
        node.kill()
        shm = self._shm.pop(node.name, None)
        if shm is not None:
            if self._left is not None:
                shutil.rmtree(self._left, ignore_errors=True)
            self._left = shm

    def close(self) -> None:
        self.standby = None
        for node in self.nodes:  # each node still running, whichever role (kill() skips an exited one)
            node.kill()
        for name in list(self._shm):
            shutil.rmtree(self._shm.pop(name), ignore_errors=True)
        if self._left is not None:
            shutil.rmtree(self._left, ignore_errors=True)
            self._left = None
        for gate in self._gates.values():
            gate.unlink(missing_ok=True)

    def run(self) -> list[dict[str, Any]]:
        try:
            return self._run()
        finally:
            self.close()

    def _run(self) -> list[dict[str, Any]]:
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.metadata.reset()
        tail, node = EventTail(self.run_dir), self.launch()
        T, lead = self.args.mtbf, self.args.notice_lead
        clock0, k, notice, marker = None, 0, None, False
        pending_kill: Failure | None = None
        end = time.monotonic() + self.args.run_timeout
        while True:
            rc = node.poll()
            for e in tail.poll():
                if clock0 is None and e["event"] == "first_step":
                    clock0 = e["t"]
                if e["event"] == "marker":
                    marker = True  # the handoff contract: the node may go now
                if e["event"] == "committed":  # a booted spare can size its reserve now
                    for window in self.spare_boots.values():
                        if window[0] is None:
                            window[0] = e["t"]
            now = time.time()
            if clock0 is not None and notice is None and now >= clock0 + (k + 1) * T:
                kind = "notice" if k % 2 == 0 else "sigkill"
                group = node.group
                if kind == "notice":
                    self.metadata.schedule_spot_interruption("terminate", in_seconds=lead)
                    notice = Failure("notice", now)
                    self.failures.append(notice)
                    k += 1
                    say(f"{self.name}: failure {k}: spot notice, {lead:.0f}s to go")
                elif group is not None and group.t_down is None:
                    pid = node.kill_worker(1 if self.args.nproc > 1 else 0)
                    pending_kill = Failure("sigkill", now, how=f"pid {pid}")
                    pending_kill._group = group  # type: ignore[attr-defined]
                    self.failures.append(pending_kill)
                    if self.spares:  # the survivors never stop: the failure ends at once
                        pending_kill.t_end, pending_kill = now, None
                    k += 1
                    say(f"{self.name}: failure {k}: SIGKILL of a worker")
            if pending_kill is not None and pending_kill._group.t_down is not None:  # type: ignore[attr-defined]
                pending_kill.t_end = pending_kill._group.t_down  # type: ignore[attr-defined]
                pending_kill = None
            if notice is not None:
                if marker or now >= notice.t + lead or rc is not None:
                    self.gone(node)  # the instance is gone
                    notice.t_end = time.time()
                    notice.how = (
                        "terminated once its commit marker was written" if marker else "terminated at the deadline"
                    )
                    say(f"{self.name}: node {notice.how}; replacement launched")
                    self.metadata.reset()
                    notice, marker = None, False
                    if rc == 0:
                        break
                    node = self.launch()
                    continue
            if rc is not None:
                if rc != 0:
                    raise SystemExit(
                        f"{self.name}: the launcher exited {rc}; see {node.log_path}\n{node.log_tail(2000)}"
                    )
                break
            if time.monotonic() > end:
                node.kill()
                raise SystemExit(f"{self.name}: no end after {self.args.run_timeout:.0f}s")
            if self.standby is not None:
                self._spare_ready(self.standby)
            time.sleep(0.02)
        tail.poll()
        return tail.events


# ---------------------------------------------------------------------------
# Measurements and the model
# ---------------------------------------------------------------------------


def measure(name: str, run: FaultedRun, events: list[dict[str, Any]], ref_step_s: float, steps: int) -> dict[str, Any]:
    lives = split_lives(events)
    first = lives[0].first_step["t"]
    last = max(e["t"] for e in events if e["event"] in ("step", "first_step"))
    wall = last - first
    # The wall time runs from the end of the first step: the steps after it fill it.
    counted = steps - int(lives[0].first_step["step"])
    commits = [e for e in events if e["event"] == "committed" and e.get("reason") == "interval"]
    intervals = [e["steps"] for e in events if e["event"] == "interval"]
    fixed = next(
        (int(o.split("=")[1]) for o in run.overrides if o.startswith("resilience.interval.fixed_steps=")), None
    )
    interval_steps = statistics.median(intervals) if intervals and "adaptive" in " ".join(run.overrides) else fixed
    # Useful seconds per step: the median step of this very run with no save and no
    # snapshot in flight (the machine's speed drifts between runs; a save's blocking and
    # the slowdown of steps beside a background save or snapshot are overhead, not
    # useful work).
    quiet = [
        float(e["seconds"])
        for e in events
        if e["event"] == "step" and not e.get("saving") and not e.get("snapshotting")
    ]
    useful_s = statistics.median(quiet) if quiet else None
    per_failure = []
    for f in run.failures:
        t_end = f.t_end or f.t
        before = [life for life in lives if life.t_start <= f.t]
        after = next((life for life in lives if life.t_start > t_end and life.first_step), None)
        if not before or after is None:
            continue
        reached, _ = before[-1].progress(before=t_end)
        # The first step after the restore is useful work, not restart: its own compute
        # time is taken off.
        first_step = after.first_step
        own = after.first("step", after=first_step["t"] - 1e-3, step=first_step["step"])
        resumed_at = first_step["t"] - (float(own["seconds"]) if own else 0.0)
        start = after.first("start")
        phases = {
            "process_start_s": _phase(t_end, start),
            "restore_s": _phase(start["t"] if start else None, after.restored or after.first("fresh")),
        }
        per_failure.append(
            {
                "kind": f.kind,
                "how": f.how,
                "at": round(f.t - first, 1),
                "lost_steps": max(0, reached - after.resumed_from),
                "restart_s": round(resumed_at - t_end, 2),
                **phases,
            }
        )
    restarts = [p["restart_s"] for p in per_failure]
    costs = [e["cost_s"] for e in events if e["event"] == "interval" and e.get("cost_s") is not None]
    emergency = [e for e in events if e["event"] == "committed" and e.get("reason") == "emergency"]
    snaps = [e for e in events if e["event"] == "snapshot"]
    done = [e for e in events if e["event"] == "snapshotted"]

    def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
        return round(statistics.mean(float(e[key]) for e in rows), 3) if rows else None

    return {
        "name": name,
        "steps": steps,
        "wall_s": round(wall, 1),
        "overhead_s": overhead(lives, first, useful_s, spare_windows(run, last)) if useful_s else None,
        "spare_boots_s": [round(b - a, 1) for a, b in spare_windows(run, last)],
        "goodput": round(counted * useful_s / wall, 4) if wall > 0 and useful_s else None,
        "useful_step_s": round(useful_s, 4) if useful_s else None,
        "goodput_vs_reference": round(counted * ref_step_s / wall, 4) if wall > 0 else None,
        "interval_steps": interval_steps,
        "interval_s": round(interval_steps * ref_step_s, 2) if interval_steps else None,
        "saves": len(commits),
        "save_blocked_s": round(statistics.mean(e["blocked_s"] for e in commits), 3) if commits else None,
        "failures": per_failure,
        "lost_steps": sum(p["lost_steps"] for p in per_failure),
        "restart_s": round(statistics.mean(restarts), 2) if restarts else None,
        "adaptive_cost_s": round(statistics.median(costs), 3) if costs else None,
        "emergency_blocked_s": round(statistics.mean(e["blocked_s"] for e in emergency), 3) if emergency else None,
        "snapshots": len(snaps),
        "snapshot_blocked_s": _mean(snaps, "blocked_s"),
        "snapshot_background_s": _mean(done, "background_s"),
        "snapshot_slowdown_s": _mean(done, "slowdown_s"),
    }


#: Where a run's wall time went (:func:`overhead`).
PARTS = ("useful", "redo", "save", "snapshot", "noise", "spare", "between", "restart")

#: A life's first steps stay noise in :func:`overhead`, even beside a spare node's start:
#: they are the new process's own warm-up (its first memory, its first collectives),
#: which a fleet pays too, and the next spare starts right at a take-over.
OWN_WARM_UP_STEPS = 2


def spare_windows(run: Any, end: float | None = None) -> list[tuple[float, float]]:
    """The spare nodes' start windows (started, ready), from ``run.spare_boots``: from a
    spare's launch, or for the one booted before the job, from the first durable commit
    (when it can size its reserve); to its snapshot files reserved. One still open (the
    run ended first) closes at ``end``, else it is left out."""
    out = []
    for a, b in getattr(run, "spare_boots", {}).values():
        if a is None:  # booted before the job, no checkpoint yet to reserve by
            continue
        b = b if b is not None else end
        if b is not None and b > a:
            out.append((a, b))
    return out


def overhead(
    lives: list[Any], first: float, useful_s: float, spares: Sequence[tuple[float, float]] = ()
) -> dict[str, float]:
    """Where the wall time beyond the useful steps went, summed over every pair of
    consecutive step events (rank 0's, in time order, from the first step on), so that
    ``useful + the parts = wall`` exactly:

    - ``save`` / ``snapshot`` / ``noise``: each step's own time above the run's useful
      step, for steps with a save in flight / a snapshot in flight / neither (the last
      is the machine's spread; a quiet step below the median counts negative);
    - ``spare``: what would be ``noise``, for steps that ran while a spare node started
      beside the training node (``spares``: its processes importing torch, its snapshot
      files reserved; on a fleet, another machine's work; on the bench's one machine it
      shares the cores and the memory), except each life's first
      :data:`OWN_WARM_UP_STEPS` steps;
    - ``between``: time between one step's end and the next one's start in the same
      life (a save's or a snapshot's blocking part, the schedule's collectives, logging);
    - ``restart``: from a life's last step to the start of the next life's first step;
    - ``redo``: the useful time of steps computed again (at or below a step reached);
    - ``useful``: the useful time of the steps that advanced the run."""
    marks = sorted(
        ((e, i) for i, life in enumerate(lives) for e in life.events if e["event"] == "step" and e["t"] >= first),
        key=lambda m: m[0]["t"],
    )
    out = dict.fromkeys(PARTS, 0.0)
    reached = int(marks[0][0]["step"]) if marks else 0
    seen = {marks[0][1]: 1} if marks else {}  # steps of each life so far
    for (a, life_a), (b, life_b) in zip(marks, marks[1:], strict=False):
        seen[life_b] = seen.get(life_b, 0) + 1
        seconds = float(b["seconds"])
        gap = b["t"] - a["t"] - seconds
        out["restart" if life_b != life_a else "between"] += gap
        out["useful" if int(b["step"]) > reached else "redo"] += useful_s
        reached = max(reached, int(b["step"]))
        part = "save" if b.get("saving") else "snapshot" if b.get("snapshotting") else "noise"
        beside = any(t0 < b["t"] and b["t"] - seconds < t1 for t0, t1 in spares)
        if part == "noise" and beside and seen[life_b] > OWN_WARM_UP_STEPS:
            part = "spare"
        out[part] += seconds - useful_s
    return {k: round(v, 1) for k, v in out.items()}


def _phase(t0: float | None, event: dict[str, Any] | None) -> float | None:
    return round(event["t"] - t0, 2) if event is not None and t0 is not None else None


def plot(path: Path, model: dict[str, Any], results: list[dict[str, Any]]) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            "matplotlib is not installed (pip install -c constraints.txt -e '.[bench]'): "
            "no PNG (the curve is in the JSON)"
        )
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [p["interval_s"] for p in model["curve"]]
    ax.plot(
        xs,
        [p["goodput"] for p in model["curve"]],
        label=f"Daly model (C={model['cost_s']:.2f}s, R={model['restart_s']:.1f}s, M={model['mtbf_s']:.0f}s)",
    )
    ax.axvline(model["daly_interval_s"], linestyle=":", color="grey")
    eff = model.get("adaptive_cost_s")
    if eff:
        ax.plot(
            xs,
            [daly_goodput(x, eff, model["restart_s"], model["mtbf_s"]) for x in xs],
            linestyle="--",
            label=f"Daly model, ftfleet's measured C={eff:.2f}s",
        )
    for i, r in enumerate(results):
        if r["interval_s"] and r["goodput"] is not None:
            ax.scatter([r["interval_s"]], [r["goodput"]], zorder=3)
            # Points often share an interval: labels go to alternating sides.
            ax.annotate(
                f"{r['name']} {r['goodput']:.3f}",
                (r["interval_s"], r["goodput"]),
                textcoords="offset points",
                xytext=(8 if i % 2 == 0 else -8, -4),
                ha="left" if i % 2 == 0 else "right",
                fontsize=9,
            )
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (s of training)")
    ax.set_ylabel("goodput")
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"wrote {path}"


def two_level_model(r: dict[str, Any], mtbf_s: float, notice_share: float) -> dict[str, float] | None:
    """A first-order (Young-style) model of a configuration with in-memory snapshots, from
    its own measured costs: the share of the wall time each part wastes, and the goodput
    they leave, at the snapshot interval that is best for them and the durable interval
    the run used. Snapshots: ``C_s / tau_s + (1 - q) tau_s / (2 M)`` (a failure without a
    notice loses half an interval), best at ``tau_s = sqrt(2 C_s M / (1 - q))``; durable
    saves: ``C_d / tau_d`` (the failures they are planned for, ``memory_share``'s rest,
    are not injected here); failures: ``(q (C_e + R_n) + (1 - q) (R_k + t / 2)) / M``
    (an emergency save and a restart per notice, a restart and half a step per SIGKILL).
    C_s is a snapshot's blocked time plus its slowdown, C_d a save's blocked time plus
    the save slowdown per save; q the share of notices. None without the measurements."""
    needed = ("snapshots", "saves", "interval_s", "emergency_blocked_s", "overhead_s")
    measured = ("snapshot_blocked_s", "snapshot_slowdown_s", "save_blocked_s", "useful_step_s")
    if not all(r.get(k) for k in needed) or any(r.get(k) is None for k in measured) or not 0 <= notice_share < 1:
        return None
    failures = {k: [f["restart_s"] for f in r["failures"] if f["kind"] == k] for k in ("notice", "sigkill")}
    if not all(failures.values()):
        return None
    c_s = r["snapshot_blocked_s"] + r["snapshot_slowdown_s"]
    c_d = r["save_blocked_s"] + r["overhead_s"]["save"] / r["saves"]
    q, m = notice_share, mtbf_s
    tau_s = math.sqrt(2 * c_s * m / (1 - q))
    snapshots = c_s / tau_s + (1 - q) * tau_s / (2 * m)
    durable = c_d / r["interval_s"]
    notice = r["emergency_blocked_s"] + statistics.mean(failures["notice"])
    sigkill = statistics.mean(failures["sigkill"]) + r["useful_step_s"] / 2
    lost = (q * notice + (1 - q) * sigkill) / m
    return {
        "snapshot_interval_s": round(tau_s, 2),
        "snapshots": round(snapshots, 4),
        "durable": round(durable, 4),
        "failures": round(lost, 4),
        "goodput": round(1 - snapshots - durable - lost, 4),
    }


def markdown(setup: dict[str, Any], model: dict[str, Any], results: list[dict[str, Any]]) -> str:
    lines = [
        "| configuration | interval | saves (blocked s each) | failures | work lost (steps) "
        "| restart (s, mean) | wall (s) | goodput | useful s/step | goodput vs reference |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        kinds = [f["kind"] for f in r["failures"]]
        lines.append(
            f"| {r['name']} | {r['interval_steps']} steps ({r['interval_s']} s) | "
            f"{r['saves']} ({r['save_blocked_s']}) | {kinds.count('notice')} notices, "
            f"{kinds.count('sigkill')} SIGKILL | {r['lost_steps']} | {r['restart_s']} | "
            f"{r['wall_s']} | **{r['goodput']}** | {r['useful_step_s']} | "
            f"{r['goodput_vs_reference']} |"
        )
    for r in results:
        two = two_level_model(r, setup["mtbf_s"], setup.get("notice_share", 0.5))
        if two:
            lines.append(
                f"\n- {r['name']}: a first-order model with its measured costs (`two_level_model`) gives "
                f"goodput {two['goodput']:.3f} at its best snapshot interval {two['snapshot_interval_s']:.1f} s: "
                f"snapshots {two['snapshots']:.1%}, durable saves {two['durable']:.1%}, failures "
                f"{two['failures']:.1%} of the wall time."
            )
        if r.get("snapshots"):
            lines.append(
                f"\n- {r['name']}: {r['snapshots']} in-memory snapshots, each blocking "
                f"{r['snapshot_blocked_s']} s; their background part took {r['snapshot_background_s']} s "
                f"and cost the steps beside it {r['snapshot_slowdown_s']} s (means)."
            )
    lines += [
        "",
        "| configuration | wall (s) | " + " | ".join(PARTS) + " |",
        "|---|---:|" + "---:|" * len(PARTS),
    ]
    for r in results:
        if r.get("overhead_s"):
            cells = " | ".join(str(r["overhead_s"][k]) for k in PARTS)
            lines.append(f"| {r['name']} | {r['wall_s']} | {cells} |")
    lines += [
        "",
        "- Where the wall time went (s; `overhead()`): useful = the steps that advanced x useful s/step; "
        "redo = steps computed again; save / snapshot / noise = step time above the useful step with a "
        "save / a snapshot / neither in flight; spare = the same as noise, for steps beside a spare node's "
        "start (from its launch, or the first commit for the one booted before the job, to its snapshot files "
        "reserved, rank 0's log; on a fleet another machine's "
        f"work), a life's first {OWN_WARM_UP_STEPS} steps left as noise; "
        "between = time between steps in one life (blocking "
        "parts of saves and snapshots, collectives); restart = from a life's last step to the next "
        "life's first.",
        f"- T = {setup['mtbf_s']:.0f} s between failures; notice lead {setup['notice_lead_s']:.0f} s; "
        f"model d_model {setup['d_model']} ({setup['state_mb']:.0f} MB of state), synchronous save "
        f"{setup['sync_save_s']:.2f} s = T/{setup['mtbf_s'] / setup['sync_save_s']:.0f}; "
        f"{setup['steps']} steps at {setup['ref_step_s']:.3f} s/step uninterrupted (measured "
        f"before and after: {setup['ref_step_s_before']:.3f}, {setup['ref_step_s_after']:.3f}), "
        f"{setup['nproc']} processes; host allocator {setup.get('host_allocator', 'glibc')}.",
        "- goodput: steps after the first x useful seconds per step over the wall time from the end of "
        "the first step to the last; useful s/step is the median step of the same run with no save or "
        "snapshot in flight "
        "(so saves, their slowdown of training, restarts and lost work are the overhead, and "
        "the machine's drift between runs cancels). goodput vs reference uses the "
        "uninterrupted reference's s/step instead.",
        f"- Daly's model with the measured C = {model['cost_s']:.2f} s and R = {model['restart_s']:.1f} s, "
        f"M = {model['mtbf_s']:.0f} s: best interval {model['daly_interval_s']:.1f} s, "
        f"goodput {model['daly_goodput']:.3f} (Young's interval {model['young_interval_s']:.1f} s: "
        f"{model['young_goodput']:.3f}); with R = 0 it would be {model['restart_free_goodput']:.3f}.",
        f"- Restart phases (mean over all failures): {model['restart_phases']}; process start runs "
        "from the failed group's end to the new process group being up.",
        (
            f"- ftfleet's adaptive interval measured C = {model['adaptive_cost_s']:.2f} s (blocked + k x "
            f"persist); Daly's optimum with that C and the same R: {model['adaptive_daly_goodput']:.3f}."
            if model["adaptive_cost_s"]
            else "- (no adaptive cost measured)"
        ),
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------


def replot(json_path: Path, png: Path) -> str:
    """Draw the PNG again from a run's goodput.json."""
    data = json.loads(json_path.read_text())
    return plot(png, data["model"], data["results"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--mtbf",
        type=float,
        default=60.0,
        metavar="T",
        help="seconds of wall time between failures (default 60; the issue's 120 takes ~30 minutes)",
    )
    p.add_argument("--failures", type=int, default=4, help="size the run to about this many failures (default 4)")
    p.add_argument(
        "--ratio", type=float, default=72.0, help="T over the synchronous save cost (default 72: 5 min vs 6 h)"
    )
    p.add_argument(
        "--notice-lead",
        type=float,
        default=None,
        metavar="S",
        help="seconds from a notice to the termination (default T/6)",
    )
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--d-model", type=int, default=None, help="skip the calibration and use this model width")
    p.add_argument(
        "--configs",
        default="sync,async,ftfleet,inprocess",
        help="which configurations (default sync,async,ftfleet,inprocess)",
    )
    p.add_argument(
        "--memory-share",
        type=float,
        default=0.9,
        help="inprocess: the share of failures recovered without an interval checkpoint "
        "(resilience.interval.memory_share): the bench's SIGKILLs restore from memory and its "
        "notices from their emergency checkpoint, so all of them; default 0.9 leaves a margin",
    )
    p.add_argument(
        "--notice-share",
        type=float,
        default=0.5,
        help="inprocess: the share of failures that come with a notice (resilience.interval.notice_share), "
        "for which its snapshot interval is not planned: the bench alternates notices and SIGKILLs, so half",
    )
    p.add_argument(
        "--peer-every",
        type=int,
        default=4,
        help="inprocess: a peer copy every this many snapshots (checkpoint.memory_peer_every; "
        "default 4: the bench loses no node without notice, which is what the copies cover)",
    )
    p.add_argument(
        "--sweep",
        default="",
        metavar="FACTORS",
        help="extra synchronous runs at these multiples of Young's interval, e.g. 0.5,2",
    )
    p.add_argument(
        "--ftfleet-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra trainer override for the ftfleet configuration",
    )
    p.add_argument(
        "--shm-root",
        default="/dev/shm",
        metavar="DIR",
        help="inprocess: the RAM file system of the nodes' snapshots (default /dev/shm; the fleet mounts "
        "a tmpfs on huge pages: mount -t tmpfs -o huge=within_size,size=8G ftfleet-shm DIR)",
    )
    p.add_argument("--run-timeout", type=float, default=1800.0)
    p.add_argument(
        "--out",
        type=Path,
        default=Path("/tmp/ftfleet-goodput"),
        help="work directory; goodput.json, goodput.md and goodput.png land here",
    )
    p.add_argument(
        "--replot",
        type=Path,
        metavar="GOODPUT_JSON",
        help="only draw goodput.png again (into --out) from a run's goodput.json",
    )
    record.add_arguments(p)
    args = p.parse_args(argv)
    try:
        host_memory_env(os.environ)  # a bad FTFLEET_HOST_ALLOCATOR stops here, not at a node's start
    except ContractError as exc:
        p.error(str(exc))
    if args.replot:
        args.out.mkdir(parents=True, exist_ok=True)
        say(replot(args.replot, args.out / "goodput.png"))
        return 0
    T = args.mtbf
    args.notice_lead = args.notice_lead or T / 6
    work = args.out.resolve()
    work.mkdir(parents=True, exist_ok=True)

    target = T / args.ratio
    cal = calibrate(work, args.d_model, args.nproc) if args.d_model else size_state(work, target, args.nproc)
    base = model_overrides(cal.d_model)
    ref_before = reference_step_s(work, base, args.nproc) or cal.step_s
    ref_step_s = ref_before
    # Enough steps for the failures even if the machine (shared) runs faster later on.
    steps = max(20, round(args.failures * T / min(ref_step_s, cal.step_s)))
    tau_young = young_interval(cal.save_s, T)
    young_steps = max(1, round(tau_young / ref_step_s))
    say(
        f"state {cal.bytes / 1e6:.0f} MB, sync save {cal.save_s:.2f}s, {ref_step_s:.3f}s/step: "
        f"{steps} steps; Young's interval {tau_young:.1f}s = {young_steps} steps"
    )

    common = base + [f"train.steps={steps}"]
    configs: dict[str, tuple[list[str], bool]] = {
        "sync": (
            common
            + [
                "checkpoint.async_save=false",
                "resilience.interval.mode=fixed",
                f"resilience.interval.fixed_steps={young_steps}",
            ],
            False,
        ),
        "async": (
            common
            + [
                "checkpoint.async_save=true",
                "resilience.interval.mode=fixed",
                f"resilience.interval.fixed_steps={young_steps}",
            ],
            False,
        ),
        "ftfleet": (
            common
            + [
                "checkpoint.async_save=auto",
                "resilience.interval.mode=adaptive",
                f"resilience.interval.fixed_steps={young_steps}",
                "resilience.interval.mtbf_source=config",
                f"resilience.interval.mtbf_s={T}",
                "resilience.watcher.poll_interval_s=1",
                *args.ftfleet_set,
            ],
            True,
        ),
        # ftfleet's recovery from memory: in-process restart with a warm spare process,
        # in-memory snapshots at their own Daly interval, a warm spare node behind the
        # active one; durable saves planned for the failures memory cannot recover.
        "inprocess": (
            common
            + [
                "checkpoint.async_save=auto",
                "checkpoint.memory=true",
                "resilience.interval.mode=adaptive",
                f"resilience.interval.fixed_steps={young_steps}",
                "resilience.interval.snapshot_fixed_steps=2",
                f"resilience.interval.memory_share={args.memory_share}",
                f"resilience.interval.notice_share={args.notice_share}",
                f"checkpoint.memory_peer_every={args.peer_every}",
                "resilience.interval.mtbf_source=config",
                f"resilience.interval.mtbf_s={T}",
                "resilience.watcher.poll_interval_s=1",
                *args.ftfleet_set,
            ],
            True,
        ),
    }
    for factor in [float(f) for f in args.sweep.split(",") if f.strip()]:
        configs[f"sync x{factor:g}"] = (
            common
            + [
                "checkpoint.async_save=false",
                "resilience.interval.mode=fixed",
                f"resilience.interval.fixed_steps={max(1, round(factor * tau_young / ref_step_s))}",
            ],
            False,
        )
    wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
    wanted += [n for n in configs if n.startswith("sync x")]

    runs = []
    with FakeMetadataServer() as metadata:
        for name in wanted:
            overrides, watch = configs[name]
            say(f"{name}: {steps} steps, a failure every {T:.0f}s")
            run = FaultedRun(
                name,
                overrides,
                watch_notices=watch,
                args=args,
                work=work,
                metadata=metadata,
                spares=1 if name == "inprocess" else 0,
            )
            runs.append((name, run, run.run()))
            shutil.rmtree(run.run_dir / "checkpoints", ignore_errors=True)
    # The machine's speed drifts (shared cores): the reference is measured before and
    # after, and goodput uses the mean.
    ref_after = reference_step_s(work, base, args.nproc) or ref_before
    ref_step_s = (ref_before + ref_after) / 2
    results = [measure(name, run, events, ref_step_s, steps) for name, run, events in runs]
    for r in results:
        say(f"{r['name']}: goodput {r['goodput']} (vs reference {r['goodput_vs_reference']}), wall {r['wall_s']}s")

    restarts = [f["restart_s"] for r in results for f in r["failures"]]
    restart = statistics.mean(restarts) if restarts else 0.0
    sync_costs = [r["save_blocked_s"] for r in results if r["name"].startswith("sync") and r["save_blocked_s"]]
    cost = statistics.mean(sync_costs) if sync_costs else cal.save_s
    tau_daly = daly_interval(cost, T)
    lo, hi = max(0.05, cost / 4), 4 * T
    curve = [lo * (hi / lo) ** (i / 80) for i in range(81)]
    phases = {
        k: round(statistics.mean(v), 2)
        for k in ("process_start_s", "restore_s")
        if (v := [f[k] for r in results for f in r["failures"] if f.get(k) is not None])
    }
    # ftfleet's own optimum: Daly with the cost its adaptive interval measured (blocked +
    # k x persist), the same R and M.
    eff = next((r["adaptive_cost_s"] for r in results if r["adaptive_cost_s"]), None)
    model = {
        "mtbf_s": T,
        "cost_s": cost,
        "restart_s": restart,
        "daly_interval_s": tau_daly,
        "restart_phases": phases,
        "adaptive_cost_s": eff,
        "adaptive_daly_goodput": (daly_goodput(daly_interval(eff, T), eff, restart, T) if eff else None),
        "restart_free_goodput": daly_goodput(tau_daly, cost, 0.0, T),
        "daly_goodput": daly_goodput(tau_daly, cost, restart, T),
        "young_interval_s": young_interval(cost, T),
        "young_goodput": daly_goodput(young_interval(cost, T), cost, restart, T),
        "curve": [{"interval_s": round(x, 3), "goodput": round(daly_goodput(x, cost, restart, T), 4)} for x in curve],
    }
    setup = {
        "mtbf_s": T,
        "notice_lead_s": args.notice_lead,
        "d_model": cal.d_model,
        "state_mb": cal.bytes / 1e6,
        "sync_save_s": cal.save_s,
        "steps": steps,
        "ref_step_s": ref_step_s,
        "ref_step_s_before": ref_before,
        "ref_step_s_after": ref_after,
        "nproc": args.nproc,
        "calibration_step_s": cal.step_s,
        "shm_root": args.shm_root,
        "notice_share": args.notice_share,
        "host_allocator": next((p for p in env().get("LD_PRELOAD", "").split() if is_malloc(p)), "glibc"),
    }
    (work / "goodput.json").write_text(
        json.dumps({"setup": setup, "model": model, "results": results}, indent=1) + "\n"
    )
    record.write("goodput", {"setup": setup, "model": model, "results": results}, args)
    md = markdown(setup, model, results)
    (work / "goodput.md").write_text(md)
    print(md, end="")
    say(plot(work / "goodput.png", model, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
