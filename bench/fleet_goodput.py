"""Fleet goodput: the in-process launcher across nodes against the torchrun fleet path,
in the same script run, on the multi-node bed (drill/bed.py).

Both run the same job (the drill's model and trainer settings: snapshots every step with
a peer copy, durable checkpoints every 10 steps) on ``--nodes`` simulated nodes, with a
failure every ``--mtbf`` seconds, the kinds in turn: a lost node (every process and its
memory), a SIGKILLed rank, a termination notice (SIGTERM to the node's launcher). A
stand-in for the fleet plays what the clouds and systemd do: a lost or noticed node is
replaced by a new one ``--boot`` seconds later (a spot replacement booting), and a
launcher that exits non-zero on a node still up is started again a second later
(systemd's ``Restart=on-failure``).

* ``inprocess``: ``--nodes`` training nodes and ``--spares`` spare nodes, the stores on
  a coordinator node (``python -m ftfleet.trainer.inprocess``; the image's default).
* ``inprocess-r2`` (``-rN``): the same under HSDP with N replica groups
  (``parallel.replicas``, no peer copies: a lost rank heals from its live replica's
  snapshot). Its state is HSDP's, so its end state is compared with the other HSDP
  runs' only (another reduction order than plain FSDP's).
* ``torchrun``: ``--nodes`` nodes under torchrun's elastic agent (c10d rendezvous on node
  0, which the faults spare, as the on-demand coordinator), ``--max-restarts``: every
  failure restarts every worker, and a lost node's replacement must join first.

* ``quiet``: the in-process fleet with no faults: what the machine allows the job
  at all (launch, per-step overhead, contention); each run's ``of_quiet`` is its goodput
  against this one's.

*Goodput*: steps × the run's median quiet step ÷ wall time (launch to the summary).
Per fault: from the fault to the next step trained, and the steps trained again.
Raw results: bench/results/fleet-goodput-*.json (bench/record.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import record  # noqa: E402
from drill.bed import Bed  # noqa: E402
from drill.cli import add_overrides_option  # noqa: E402
from drill.fleet import SOURCE_ROOT, FleetJob, FleetOptions, child_env, free_port, trainer_overrides  # noqa: E402
from ftfleet.trainer.events import read_events  # noqa: E402

KINDS = ("lose-node", "sigkill", "notice")
#: The in-process fleet with no faults: the goodput this machine allows the job at all,
#: against which the others' losses are read (``of_quiet``).
QUIET = "quiet"
#: torchrun's rendezvous: a node gone for this long leaves it (keep-alives every second).
ELASTIC = "last_call_timeout=5,join_timeout=600,keep_alive_interval=1,keep_alive_max_attempt=5"


@dataclasses.dataclass
class Fault:
    kind: str
    node: int
    t: float
    step_before: int = 0
    to_next_step_s: float | None = None
    steps_again: int | None = None


class TorchrunFleet:
    """torchrun agents on bed nodes 0 .. nodes-1 (the rendezvous on node 0)."""

    def __init__(self, bed: Bed, logs: Path, args: list[str], nodes: int, max_restarts: int) -> None:
        self.bed, self.logs, self.args, self.nodes, self.max_restarts = bed, logs, args, nodes, max_restarts
        self.host = bed[0].addr
        self.port = 29400 if bed.isolated else free_port(self.host)
        self.launchers: dict[int, subprocess.Popen] = {}
        self.starts: dict[int, int] = {}
        for i in range(nodes):
            self.start(i)

    def start(self, index: int) -> subprocess.Popen:
        node = self.bed[index]
        conf = f"is_host={'true' if index == 0 else 'false'},{ELASTIC}"
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={self.nodes}", "--nproc-per-node=1"]
        cmd += [f"--max-restarts={self.max_restarts}", "--monitor-interval=0.1", "--rdzv-backend=c10d"]
        cmd += [f"--rdzv-endpoint={self.host}:{self.port}", "--rdzv-id=fleet", f"--rdzv-conf={conf}"]
        cmd += [f"--local-addr={node.addr}", "-m", "drill.worker", *self.args]
        self.starts[index] = self.starts.get(index, -1) + 1
        env = child_env({"GLOO_SOCKET_IFNAME": node.ifname, "FTFLEET_SHM_DIR": str(node.shm)})
        with open(self.logs / f"node{index}.{self.starts[index]}.log", "w") as log:
            proc = node.popen(cmd, cwd=SOURCE_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.launchers[index] = proc
        return proc

    def workers(self, index: int) -> list[int]:
        from drill.bed import process_tree

        proc = self.launchers[index]
        return [p for p in process_tree(proc.pid)[1:] if _is_worker(p)]


def _is_worker(pid: int) -> bool:
    try:
        return (
            b"drill.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
            or b"drill.inprocess_worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
        )
    except OSError:
        return False


class Fleet:
    """The clouds' and systemd's part: replace lost and noticed nodes after ``boot_s``,
    start a failed launcher again after ``restart_s`` on a node still up."""

    def __init__(self, job: Any, bed: Bed, boot_s: float, restart_s: float = 1.0) -> None:
        self.job, self.bed, self.boot_s, self.restart_s = job, bed, boot_s, restart_s
        self.back_at: dict[int, float] = {}  # node -> when its replacement boots
        self.restart_at: dict[int, float] = {}
        self.done: set[int] = set()

    def replace(self, index: int) -> None:
        self.back_at[index] = time.monotonic() + self.boot_s

    def tick(self) -> None:
        now = time.monotonic()
        for index, proc in list(self.job.launchers.items()):
            if proc.poll() is None or index in self.done:
                continue
            if index in self.back_at:
                if now >= self.back_at[index]:
                    del self.back_at[index]
                    node = self.bed[index]
                    self.bed._kill_all(node)
                    shutil.rmtree(node.shm, ignore_errors=True)
                    node.shm.mkdir(mode=0o700)  # a new machine: empty memory
                    self.job.start(index)
            elif proc.returncode == 0:
                self.done.add(index)
            elif index not in self.restart_at:
                self.restart_at[index] = now + self.restart_s
            elif now >= self.restart_at[index]:
                del self.restart_at[index]
                self.job.start(index)


def replicas_of(name: str) -> int:
    """``inprocess-rN``: N replica groups (HSDP); any other configuration: 1."""
    base, _, suffix = name.rpartition("-r")
    return int(suffix) if base == "inprocess" and suffix.isdigit() else 1


def run_config(name: str, opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    where = workdir / name
    shutil.rmtree(where, ignore_errors=True)  # an earlier run's checkpoints would be resumed
    where.mkdir(parents=True)
    run_dir = where / "run"
    fleet_opts = FleetOptions(
        nodes=opts.nodes,
        spare_nodes=opts.spares,
        workdir=where,
        steps=opts.steps,
        step_delay_s=opts.step_delay,
        collective_timeout_s=opts.collective_timeout,
        replicas=replicas_of(name),
        overrides=list(opts.overrides),
    )
    args = ["--config", str(fleet_opts.config), *trainer_overrides(fleet_opts, run_dir)]
    in_process = name == QUIET or name.startswith("inprocess")
    bed_size = opts.nodes + opts.spares + 1 if in_process else opts.nodes
    faults: list[Fault] = []
    with Bed(bed_size) as bed:
        t0 = time.time()
        if in_process:
            job: Any = FleetJob(
                bed,
                where,
                args,
                nnodes=opts.nodes,
                spare_nodes=opts.spares,
                heartbeat_timeout=opts.heartbeat_timeout,
                env=child_env(),
                extra=["--settle=3"],
            )
        else:
            job = TorchrunFleet(bed, where, args, opts.nodes, opts.max_restarts)
        fleet = Fleet(job, bed, opts.boot)
        next_fault = time.monotonic() + opts.mtbf
        deadline = time.monotonic() + opts.timeout
        while not done(run_dir, opts.steps) and time.monotonic() < deadline:
            fleet.tick()
            if name != QUIET and time.monotonic() >= next_fault and len(faults) < opts.failures:
                fault = inject(name, job, bed, fleet, KINDS[len(faults) % len(KINDS)], run_dir, opts)
                if fault is not None:
                    faults.append(fault)
                next_fault = time.monotonic() + opts.mtbf
            time.sleep(0.1)
        wall = time.time() - t0
        finished = done(run_dir, opts.steps)
    events = list(read_events(run_dir))
    steps = [e for e in events if e["event"] == "step"]
    quiet = statistics.median(e["seconds"] for e in steps[1:]) if len(steps) > 1 else None
    for f in faults:
        measure(f, events)
    final = json.loads((run_dir / "summary.json").read_text()) if finished else {}
    goodput = round(opts.steps * quiet / wall, 4) if finished and quiet else None
    return {
        "configuration": name,
        "replicas": replicas_of(name),
        "finished": finished,
        "wall_s": round(wall, 2),
        "quiet_step_s": round(quiet, 4) if quiet else None,
        "goodput": goodput,
        "state_sha256": final.get("state_sha256"),
        "faults": [dataclasses.asdict(f) for f in faults],
    }


def done(run_dir: Path, steps: int) -> bool:
    """The run's summary says it trained every step (an attempt that ends early writes
    one too)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return summary.get("step") == steps and bool(summary.get("state_sha256"))


def inject(name: str, job: Any, bed: Bed, fleet: Fleet, kind: str, run_dir: Path, opts) -> Fault | None:
    training = (
        [i for i in job.launchers if (job.slot(i) or 0) < opts.nodes and job.slot(i) is not None]
        if name.startswith("inprocess")
        else list(range(1, opts.nodes))  # node 0 hosts torchrun's rendezvous
    )
    training = [i for i in training if i not in fleet.back_at and job.launchers[i].poll() is None and i != 0]
    if not training:
        return None
    victim = training[len(fleet.back_at) % len(training)]
    before = max((e["step"] for e in read_events(run_dir) if e["event"] == "step"), default=0)
    fault = Fault(kind, victim, time.time(), before)
    if kind == "lose-node":
        bed.lose(victim)
        fleet.replace(victim)
    elif kind == "sigkill":
        pids = job.workers(victim) if name == "torchrun" else list(job.pids(victim).values())
        if not pids:
            return None
        bed.kill(pids[0])
    else:  # a notice: SIGTERM to the node's launcher, which passes it on to its processes
        os.kill(job.launchers[victim].pid, signal.SIGTERM)
        fleet.replace(victim)
    print(f"fleet goodput: {name}: {kind} on node {victim} at step {before}", file=sys.stderr, flush=True)
    return fault


def measure(fault: Fault, events: list[dict[str, Any]]) -> None:
    """From the fault to the next step trained after a restart, and the steps trained
    again (the first step after it, less one, against the last one before)."""
    starts = [e for e in events if e["event"] == "start" and e["t"] > fault.t]
    if not starts:
        return
    after = next((e for e in events if e["event"] == "step" and e["t"] > starts[0]["t"]), None)
    if after is None:
        return
    fault.to_next_step_s = round(after["t"] - fault.t, 2)
    fault.steps_again = max(0, fault.step_before - (after["step"] - 1))


def same_states(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the finished runs of each world shape ended in one state (HSDP reduces the
    gradients in another order than plain FSDP, so shapes are compared apart):
    ``same_state`` over the shapes with two or more finished runs (None: no such shape),
    and ``compared``, the number of finished runs per replica count (a shape with one
    run was compared with nothing)."""
    shas: dict[int, list[str]] = {}
    for r in results:
        if r["finished"]:
            shas.setdefault(r["replicas"], []).append(r["state_sha256"])
    checked = [len(set(v)) == 1 for v in shas.values() if len(v) > 1]
    return {"same_state": all(checked) if checked else None, "compared": {str(k): len(v) for k, v in shas.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--spares", type=int, default=1, help="inprocess: spare nodes")
    parser.add_argument("--mtbf", type=float, default=120.0, help="seconds between failures")
    parser.add_argument("--failures", type=int, default=3)
    parser.add_argument("--boot", type=float, default=30.0, help="seconds for a replacement node to boot")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--step-delay", type=float, default=0.1, help="seconds added to each step")
    parser.add_argument("--heartbeat-timeout", type=float, default=2.0)
    parser.add_argument("--collective-timeout", type=float, default=5.0)
    parser.add_argument("--max-restarts", type=int, default=20, help="torchrun's")
    parser.add_argument("--timeout", type=float, default=3600.0, help="give up on a configuration after this")
    parser.add_argument(
        "--configs", default=f"{QUIET},inprocess,torchrun", help="comma-separated; also inprocess-r2 (HSDP, 2 replicas)"
    )
    add_overrides_option(parser, "a trainer override for both configurations, after the drill's (repeatable)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/ftfleet-fleet-goodput"))
    record.add_arguments(parser)
    opts = parser.parse_args(argv)
    results = []
    for name in opts.configs.split(","):
        if name not in (QUIET, "torchrun", "inprocess") and replicas_of(name) < 2:
            parser.error(f"--configs: {name!r} is not one of {QUIET}, inprocess, inprocess-rN, torchrun")
        if opts.nodes % replicas_of(name):
            parser.error(f"--configs {name}: {replicas_of(name)} replica groups do not divide --nodes {opts.nodes}")
    for name in opts.configs.split(","):
        results.append(run_config(name, opts, opts.workdir))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    ceiling = next((r["goodput"] for r in results if r["configuration"] == QUIET), None)
    for r in results:
        r["of_quiet"] = round(r["goodput"] / ceiling, 4) if ceiling and r["goodput"] else None
    figures = {"results": results, **same_states(results), "options": {k: str(v) for k, v in vars(opts).items()}}
    for r in results:
        print(
            f"{r['configuration']}: goodput {r['goodput']} ({r['of_quiet']} of the quiet run's), "
            f"wall {r['wall_s']} s, quiet step {r['quiet_step_s']} s"
        )
        for f in r["faults"]:
            print(
                f"  {f['kind']} on node {f['node']}: next step after {f['to_next_step_s']} s, {f['steps_again']} again"
            )
    record.write("fleet-goodput", figures, opts)
    return 0 if all(r["finished"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
