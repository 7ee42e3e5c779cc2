"""The fleet drill: ``python -m drill --nodes N --spares S``.

An in-process job (:mod:`ftfleet.trainer.inprocess`) across N simulated nodes and S
spare nodes on the multi-node bed (:mod:`drill.bed`: a network namespace per node,
joined by a bridge; loopback addresses where namespaces cannot be made), its stores on
a coordinator node that trains nothing, as on the fleet. First an uninterrupted
reference run (the same world on one machine under torchrun), then, for each fault, a
run of its own with that fault injected once training is under way:

* ``lose-node``: every process of a training node SIGKILLed and its shared memory
  removed at once;
* ``sigkill``: one training process SIGKILLed;
* ``notice``: SIGTERM to a training node's launcher (a termination notice, which it
  forwards to its processes): the node hands its ranks to the spare node and leaves
  (:mod:`ftfleet.trainer.inprocess.handoff`);
* ``partition``: a training node's link down (healed once the job has ended);
* ``slow-link``: a training node's link rate-limited (``tc ... tbf``) for the run;
* ``shrink-grow``: no spare node and ``--min-ranks`` one block short (a replica group
  under HSDP, else a node): a training node is lost, the others train on as a smaller
  world, then a replacement node boots and the world grows back
  (:mod:`ftfleet.trainer.inprocess.resize`). Another trajectory: the row checks that
  every sample was consumed once (:mod:`drill.samples`) instead of the final state, and
  adds the grow's pause (the smaller world's last step to the full world's first) and
  the steps it computed again.

Each row says when the fault was injected, how long until the job trained its first
step after it, how many steps were computed again, whether the survivors' processes
were the same ones afterwards, whether any process of the faulted node committed
anything after the fault, and whether the final ``state_sha256`` equals the
reference's. Exit 0 when every row ends equal to the reference with its survivors
never exiting (``shrink-grow``: every sample once), 1 otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drill.bed import Bed, LinksUnavailable
from ftfleet.errors import UserError
from ftfleet.trainer.events import read_events

SOURCE_ROOT = Path(__file__).resolve().parents[1]
FLEET_FAULTS = ("lose-node", "sigkill", "notice", "partition", "slow-link", "shrink-grow")
#: The fault whose run trains another trajectory (a smaller world for a while).
SHRINK_GROW = "shrink-grow"
#: The port of the job's stores on the coordinator, in a bed of namespaces (each node
#: has its own ports); on loopback a free one is taken.
STORE_PORT = 29400


def free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The drill's children: this environment without the contract's FTFLEET_* (no cloud),
    one thread per process, the repository on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTFLEET_")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(SOURCE_ROOT)})
    env.update(extra or {})
    return env


class FleetJob:
    """The in-process launcher on bed nodes ``0 .. nnodes + spare_nodes - 1``, each taking
    its node slot from the job's store (``--node-rank auto``: the first ``nnodes`` to
    register train ``nproc`` ranks each, the next wait as spare nodes), and the job's
    stores on the bed's last node (``--nproc 0 --host-stores``). Every node's shared
    memory is its own (FTFLEET_SHM_DIR). ``trainer_args`` follow the launcher's ``--``."""

    def __init__(
        self,
        bed: Bed,
        logs: Path,
        trainer_args: Sequence[str],
        *,
        nnodes: int,
        spare_nodes: int,
        nproc: int = 1,
        heartbeat_timeout: float = 2.0,
        soft_timeout: float = 30.0,
        worker: str = "drill.inprocess_worker",
        env: dict[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        if len(bed.nodes) != nnodes + spare_nodes + 1:
            raise ValueError(f"a bed of {nnodes + spare_nodes + 1} nodes: the job's and the coordinator")
        self.bed, self.logs = bed, logs
        self.nnodes, self.spare_nodes, self.nproc = nnodes, spare_nodes, nproc
        self.env = env or child_env()
        coordinator = bed[nnodes + spare_nodes]
        self.port = STORE_PORT if bed.isolated else free_port(coordinator.addr)
        self.common = [f"--master-addr={coordinator.addr}", f"--soft-timeout={soft_timeout}", f"--worker={worker}"]
        self.common += [f"--heartbeat-timeout={heartbeat_timeout}"]
        self.trainer_args = list(trainer_args)
        self.extra = list(extra)  # more launcher options for the nodes
        self.stores = self._start(coordinator, ["--nproc=0", "--host-stores", *self.common, "--"], "coordinator")
        time.sleep(0.5)  # the stores listen before the first launcher connects
        self.launchers: dict[int, subprocess.Popen] = {}
        self.starts: dict[int, int] = {}  # bed node -> launches so far
        for node in bed.nodes[: nnodes + spare_nodes]:
            self.start(node.index)

    def start(self, index: int) -> subprocess.Popen:
        """(Re)start bed node ``index``'s launcher (its log: ``node<index>.<n>.log``)."""
        node = self.bed[index]
        cmd = [f"--nproc={self.nproc}", "--spares=0", f"--nnodes={self.nnodes}", f"--spare-nodes={self.spare_nodes}"]
        cmd += ["--node-rank=auto", "--no-host-stores", *self.common, *self.extra, "--", *self.trainer_args]
        self.starts[index] = self.starts.get(index, -1) + 1
        env = {"GLOO_SOCKET_IFNAME": node.ifname, "FTFLEET_SHM_DIR": str(node.shm)}
        self.launchers[index] = self._start(node, cmd, f"node{index}.{self.starts[index]}", env)
        return self.launchers[index]

    def _start(self, node, launcher_args, name, env=None) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "ftfleet.trainer.inprocess", *launcher_args]
        env = {**self.env, "MASTER_PORT": str(self.port), **(env or {})}
        with open(self.logs / f"{name}.log", "w") as log:
            return node.popen(cmd, cwd=SOURCE_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def log(self, index: int) -> str:
        """Bed node ``index``'s current launcher's output so far."""
        return (self.logs / f"node{index}.{self.starts[index]}.log").read_text()

    def slot(self, index: int) -> int | None:
        """The node slot bed node ``index``'s current launcher took, once it has."""
        for line in self.log(index).splitlines():
            if line.startswith("ftfleet.inprocess: round ") and ", node " in line:
                return int(line.split(", node ")[1].split()[0])
        return None

    def slots(self, timeout: float = 60.0) -> dict[int, int]:
        """node slot -> bed node, once every launcher has taken its slot."""
        nodes = list(self.launchers)
        _wait(lambda: all(self.slot(i) is not None for i in nodes), timeout, "every node's slot")
        return {self.slot(i): i for i in nodes}

    def pids(self, index: int) -> dict[int, int]:
        """rank -> pid of the processes bed node ``index``'s current launcher started."""
        out = {}
        for line in self.log(index).splitlines():
            if line.startswith("ftfleet.inprocess: process "):
                _, _, rank, _, pid = line.split()
                out[int(rank)] = int(pid)
        return out

    def wait(self, timeout: float, nodes: Sequence[int] | None = None) -> dict[int, int | None]:
        """Bed node -> its launcher's exit code once those of ``nodes`` (default: all) have
        ended, or None for one still running at ``timeout``."""
        waited = [self.launchers[i] for i in (self.launchers if nodes is None else nodes)]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(a.poll() is None for a in waited):
            time.sleep(0.1)
        return {i: a.poll() for i, a in self.launchers.items()}

    def log_tail(self, chars: int = 3000) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.read_text()[-chars:]}" for p in sorted(self.logs.glob("*.log")))


def _wait(predicate, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise UserError(f"the drill timed out after {timeout:.0f} s waiting for {what}")


# ---------------------------------------------------------------------------------------
# The drill
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class FleetRow:
    fault: str
    injected_at_step: int | None = None
    fault_to_first_step_s: float | None = None
    steps_lost: int | None = None
    resumed_from: str | None = None
    survivors_kept: bool | None = None
    faulted_node_wrote_after: bool | None = None
    restarts: int = 0
    state_equal: bool | None = False
    """None where the run trains another trajectory (``shrink-grow``)."""
    samples_once: bool | None = None
    """``shrink-grow``: every sample consumed once, in order."""
    grow_pause_s: float | None = None
    """``shrink-grow``: the smaller world's last step to the full world's first."""
    grow_steps_lost: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        same = self.samples_once if self.fault == SHRINK_GROW else self.state_equal
        return self.error is None and bool(same) and bool(self.survivors_kept) and not self.faulted_node_wrote_after


@dataclasses.dataclass(kw_only=True)
class FleetOptions:
    nodes: int = 3
    spare_nodes: int = 1
    replicas: int = 1
    """HSDP's replica groups (``parallel.replicas``): at 2 or more, no peer copies; a
    lost rank's state comes from its live replica."""
    faults: list[str] = dataclasses.field(default_factory=lambda: list(FLEET_FAULTS))
    workdir: Path
    config: Path = SOURCE_ROOT / "trainer" / "configs" / "tiny.yaml"
    steps: int = 40
    fault_step: int = 15
    step_delay_s: float = 0.05
    heartbeat_timeout_s: float = 1.0
    collective_timeout_s: float = 2.0
    slow_rate: str = "20mbit"
    """``slow-link``: the faulted node's rate; a peer copy of a snapshot must still
    cross it within the collective timeout, or the slow link turns into restarts."""
    overrides: list[str] = dataclasses.field(default_factory=list)


def shrink_block(opts: FleetOptions) -> int:
    """The nodes a smaller world drops together (a rank each), as the workers take it: a
    replica group under HSDP, else one."""
    from ftfleet.trainer.inprocess.worker import shrink_block as block

    return block(1, opts.replicas, opts.nodes)


#: ``shrink-grow`` trains this many steps more: the smaller world must still be training
#: when the replacement node has booted (its processes import torch) and registered.
GROW_STEPS = 200


def run_steps(opts: FleetOptions, fault: str | None = None) -> int:
    return opts.steps + (GROW_STEPS if fault == SHRINK_GROW else 0)


def global_batch(opts: FleetOptions, fault: str | None = None) -> int:
    """Two samples per rank; for ``shrink-grow`` also a whole number per rank of the
    smaller world."""
    if fault == SHRINK_GROW:
        return 2 * opts.nodes * (opts.nodes - shrink_block(opts))
    return 2 * opts.nodes


def trainer_overrides(opts: FleetOptions, run_dir: Path, fault: str | None = None) -> list[str]:
    """The drill's run: snapshots every step with a peer copy on the next node (one rank
    per node; under HSDP, ``opts.replicas`` > 1, none: the replicas hold each shard),
    durable checkpoints every 10 steps, each step paced like a bigger model; for
    ``shrink-grow`` each rank's samples traced."""
    hsdp = [f"parallel.replicas={opts.replicas}", "checkpoint.memory_peer_every=0"] if opts.replicas > 1 else []
    trace = ["data.trace_samples=true"] if fault == SHRINK_GROW else []
    return [
        "run_id=fleet",
        f"train.steps={run_steps(opts, fault)}",
        f"train.global_batch_size={global_batch(opts, fault)}",
        "train.step_events=true",
        "train.state_hash=true",
        "data.num_workers=0",
        "resilience.interval.mode=fixed",
        "resilience.interval.fixed_steps=10",
        "resilience.interval.snapshot_fixed_steps=1",
        "checkpoint.memory=true",
        "checkpoint.ranks_per_node=1",
        "checkpoint.keep=100",
        f"parallel.collective_timeout_s={opts.collective_timeout_s}",
        f"faults.step_delay_s={opts.step_delay_s}",
        *hsdp,
        *trace,
        *opts.overrides,
        f"run_dir={run_dir}",
    ]


def reference(opts: FleetOptions) -> str:
    """The uninterrupted run's state_sha256: the same world on one machine, under torchrun,
    from nothing (its run directory and its shared memory are new: a snapshot of an
    earlier run with the same run id and world would be restored)."""
    run_dir, shm = opts.workdir / "reference", opts.workdir / "reference-shm"
    for old in (run_dir, shm):
        shutil.rmtree(old, ignore_errors=True)
    args = ["--config", str(opts.config), *trainer_overrides(opts, run_dir)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={opts.nodes}"]
    cmd += ["-m", "drill.worker", *args]
    env = child_env({"FTFLEET_SHM_DIR": str(shm)})
    with open(opts.workdir / "reference.log", "w") as log:
        done = subprocess.run(cmd, cwd=SOURCE_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=600)
    shutil.rmtree(shm, ignore_errors=True)
    if done.returncode != 0:
        raise UserError(f"the reference run failed with exit {done.returncode}: see {opts.workdir / 'reference.log'}")
    return json.loads((run_dir / "summary.json").read_text())["state_sha256"]


def run_fault(opts: FleetOptions, fault: str, want_sha: str) -> FleetRow:
    row = FleetRow(fault)
    where = opts.workdir / fault
    shutil.rmtree(where, ignore_errors=True)  # a run directory of an earlier drill would be resumed
    where.mkdir(parents=True)
    run_dir = where / "run"
    args = ["--config", str(opts.config), *trainer_overrides(opts, run_dir, fault)]
    grow = fault == SHRINK_GROW
    spare_nodes = 0 if grow else opts.spare_nodes  # a spare node would take the lost ranks
    # The next round's processes warm from 5 s into the round: as on a fleet, where a
    # round has run past the launcher's --warm-after by the time capacity comes back.
    extra = [f"--min-ranks={opts.nodes - shrink_block(opts)}", "--warm-after=5"] if grow else []
    with Bed(opts.nodes + spare_nodes + 1) as bed:
        job = FleetJob(
            bed,
            where,
            args,
            nnodes=opts.nodes,
            spare_nodes=spare_nodes,
            heartbeat_timeout=opts.heartbeat_timeout_s,
            extra=extra,
        )
        try:
            slots = job.slots()
            _wait(lambda: _last_step(run_dir) >= opts.fault_step, 300, f"step {opts.fault_step}")
            victim = slots[1]  # a training node that does not hold rank 0
            victim_pids = sorted(job.pids(victim).values())
            training = [slots[n] for n in range(opts.nodes)]
            survivors = {r: p for i in training if i != victim for r, p in job.pids(i).items()}
            row.injected_at_step = _last_step(run_dir)
            t_fault = time.time()
            if fault == "lose-node":
                bed.lose(victim)
            elif fault == "sigkill":
                bed.kill(victim_pids[0])
            elif fault == "notice":
                os.kill(job.launchers[victim].pid, signal.SIGTERM)
            elif fault == "partition":
                bed.partition(victim)
            elif fault == "slow-link":
                bed.slow(victim, rate=opts.slow_rate, burst="256kbit", latency="200ms")
            elif grow:
                bed.lose(victim)
                smaller = opts.nodes - shrink_block(opts)
                _wait(lambda: _world_started(run_dir, smaller, t_fault), 300, f"the world of {smaller} ranks")
                job.start(victim)  # capacity returns: a replacement node boots
            else:
                raise UserError(f"fault {fault!r}: use one of {', '.join(FLEET_FAULTS)}")
            others = list(job.launchers) if grow else [i for i in job.launchers if i != victim]
            rcs = job.wait(300, nodes=others)
            if fault == "partition":
                bed.heal(victim)  # it finds itself fenced, and ends
            if any(rcs[i] != 0 for i in others):
                raise UserError(f"launchers ended {rcs}: see {where}")
            if grow:
                _measure_shrink_grow(row, run_dir, t_fault, survivors, opts)
            else:
                _measure(row, run_dir, t_fault, survivors, bed[victim].shm, fault)
                row.state_equal = json.loads((run_dir / "summary.json").read_text())["state_sha256"] == want_sha
        except (UserError, LinksUnavailable, OSError, KeyError, ValueError) as exc:
            row.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return row


def _last_step(run_dir: Path) -> int:
    return max((e["step"] for e in read_events(run_dir) if e["event"] == "step"), default=-1)


def _measure(
    row: FleetRow, run_dir: Path, t_fault: float, survivors: dict[int, int], victim_shm: Path, fault: str
) -> None:
    """The row's figures from rank 0's event log and summary (rank 0 is never on the
    faulted node), and the faulted node's own shared memory."""
    events = list(read_events(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    restarted = [e for e in events if e["event"] == "start" and e["t"] > t_fault]
    after = [e for e in events if e["event"] == "step" and e["t"] > t_fault]
    before = max((e["step"] for e in events if e["event"] == "step" and e["t"] <= t_fault), default=0)
    row.restarts = len(restarted)
    if restarted and fault != "slow-link":
        first = next((e for e in after if e["t"] > restarted[0]["t"]), None)
        row.fault_to_first_step_s = round(first["t"] - t_fault, 2) if first else None
        resumed = summary.get("resumed_from") or {}
        row.resumed_from = resumed.get("tier")
        row.steps_lost = before - resumed["step"] if "step" in resumed else None
        pids = restarted[-1]["pids"]
        row.survivors_kept = all(r < len(pids) and pids[r] == p for r, p in survivors.items())
    else:  # a slow link: the same processes train on (a restart shows in ``restarts``)
        row.fault_to_first_step_s = round(after[0]["t"] - t_fault, 2) if after else None
        row.steps_lost = 0 if not restarted else None
        row.survivors_kept = not restarted
    # What the faulted node committed once the others restarted without it: its snapshots
    # (and the copies it held) are in its shared memory, which nothing else writes.
    cut_off = restarted[0]["t"] if restarted and fault != "slow-link" else None
    row.faulted_node_wrote_after = cut_off is not None and committed_after(victim_shm, cut_off)
    if fault == "notice":  # it left on its own, at the step whose snapshot it handed over
        handoff = next((e for e in events if e["event"] == "handoff" and e["t"] > t_fault), None)
        if handoff is None:
            row.survivors_kept = False  # the job stopped instead
        elif "step" in (summary.get("resumed_from") or {}):
            row.steps_lost = handoff["step"] - summary["resumed_from"]["step"]


def _world_started(run_dir: Path, size: int, after: float) -> bool:
    return any(e["event"] == "start" and e["t"] > after and e["world_size"] == size for e in read_events(run_dir))


def _measure_shrink_grow(
    row: FleetRow, run_dir: Path, t_fault: float, survivors: dict[int, int], opts: FleetOptions
) -> None:
    """The shrink's figures as :func:`_measure` takes them (fault to the smaller world's
    first step, steps computed again, the smaller world's processes all survivors'), the
    grow's (its pause, its steps computed again), and every sample once."""
    from drill.samples import each_sample_once, final_trace

    events = list(read_events(run_dir))
    steps = [e for e in events if e["event"] == "step"]
    starts = [e for e in events if e["event"] == "start" and e["t"] > t_fault]
    restored = [e for e in events if e["event"] == "restored" and e["t"] > t_fault]
    notice = next((e for e in reversed(events) if e["event"] == "notice" and e["kind"] == "resize"), None)
    if len(starts) < 2 or len(restored) < 2 or notice is None:
        raise UserError(f"no shrink and grow in the event log: {len(starts)} starts after the loss, notice {notice}")
    smaller, grown = starts[0], starts[-1]
    before = max((e["step"] for e in steps if e["t"] <= t_fault), default=0)
    row.restarts = len(starts)
    first = next((e for e in steps if e["t"] > smaller["t"]), None)
    row.fault_to_first_step_s = round(first["t"] - t_fault, 2) if first else None
    row.steps_lost = before - restored[0]["step"]
    row.survivors_kept = set(smaller["pids"]) <= set(survivors.values())
    row.faulted_node_wrote_after = False  # lost with its memory; the replacement on its bed node trains
    last_small = max((e["t"] for e in steps if smaller["t"] < e["t"] < grown["t"]), default=None)
    first_full = next((e for e in steps if e["t"] > grown["t"]), None)
    if last_small is not None and first_full is not None:
        row.grow_pause_s = round(first_full["t"] - last_small, 2)
    row.grow_steps_lost = notice["step"] - restored[-1]["step"]
    row.resumed_from = json.loads((run_dir / "summary.json").read_text())["resumed_from"]["tier"]
    row.state_equal = None
    trace = final_trace(run_dir)
    row.samples_once = each_sample_once(trace, run_steps(opts, SHRINK_GROW), global_batch(opts, SHRINK_GROW)) is None


#: Faults that need a link of the node's own (a bed of network namespaces).
LINK_FAULTS = ("partition", "slow-link")


def committed_after(shm: Path, t: float) -> bool:
    """Whether a snapshot (or a peer's copy) in ``shm`` was committed after ``t``: its
    manifest, written last, is newer. (Bytes staged into a snapshot that is then refused
    at its commit are not a write of the run.)"""
    return any(m.stat().st_mtime > t for m in shm.rglob("manifest.json"))


def run_fleet_drill(opts: FleetOptions) -> tuple[list[FleetRow], str]:
    """The reference run, then one run per fault. On a loopback bed (not root) the faults
    that need a link are left out, with a line on stderr saying why."""
    from drill.bed import namespaces_available

    opts.workdir.mkdir(parents=True, exist_ok=True)
    why = namespaces_available()
    if why and any(f in LINK_FAULTS for f in opts.faults):
        left = [f for f in opts.faults if f in LINK_FAULTS]
        print(f"fleet drill: leaving out {', '.join(left)}: {why}", file=sys.stderr)
        opts.faults = [f for f in opts.faults if f not in LINK_FAULTS]
    want = reference(opts)
    rows = [run_fault(opts, fault, want) for fault in opts.faults]
    return rows, want


def render(rows: Sequence[FleetRow], opts: FleetOptions) -> str:
    head = (
        f"fleet drill: {opts.nodes} nodes + {opts.spare_nodes} spare node(s), 1 rank each, "
        + (f"{opts.replicas} replica groups (HSDP), " if opts.replicas > 1 else "")
        + f"{opts.steps} steps, fault at step {opts.fault_step}\n"
    )
    lines = [
        "| fault | at step | fault -> first step | steps lost | resumed from | restarts | survivors kept "
        "| faulted node wrote after | state equal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(v: Any) -> str:
        return "-" if v is None else ("yes" if v is True else "no" if v is False else str(v))

    notes = []
    for r in rows:
        if r.error:
            lines.append(f"| {r.fault} | error: {r.error} | | | | | | | |")
            continue
        t = f"{r.fault_to_first_step_s:.2f} s" if r.fault_to_first_step_s is not None else "-"
        lines.append(
            f"| {r.fault} | {fmt(r.injected_at_step)} | {t} | {fmt(r.steps_lost)} | {fmt(r.resumed_from)} "
            f"| {r.restarts} | {fmt(r.survivors_kept)} | {fmt(r.faulted_node_wrote_after)} | {fmt(r.state_equal)} |"
        )
        if r.fault == SHRINK_GROW:
            pause = f"{r.grow_pause_s:.2f} s" if r.grow_pause_s is not None else "-"
            notes.append(
                f"{r.fault}: another trajectory (state equal: -); every sample once: {fmt(r.samples_once)}; "
                f"the world grew back with a pause of {pause} between steps, {fmt(r.grow_steps_lost)} steps again"
            )
    return head + "\n".join(lines + notes)
