"""The drill itself: an uninterrupted reference run, then the faulted run, node after
node, with the faults of the plan injected as the run reaches their steps; then the
report. :func:`run_drill` is what ``python -m drill`` calls.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from drill import damage
from drill.cloud import CREDENTIALS, LocalCloud
from drill.faults import GCP_KINDS, KINDS, FaultRecord, measure
from drill.lives import steady_step_time
from drill.report import DrillReport, Goodput, predict
from drill.runner import EventTail, Node, WorkerGroup
from drill.scenario import Plan, SegmentPlan, build_plan
from ftfleet.contract import EXIT_OK, EXIT_PREEMPTED, GCP_PREEMPTION_NOTICE_S
from ftfleet.hostenv import host_memory_env

#: The repository root: children import the same ``drill`` and ``ftfleet`` as this process.
SOURCE_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = SOURCE_ROOT / "trainer" / "configs" / "tiny.yaml"


@dataclasses.dataclass(kw_only=True)
class DrillOptions:
    faults: list[str]
    workdir: Path
    cloud: str = "aws"
    """``aws``: moto S3 (primary and replica buckets) and IMDSv2. ``gcp``: a GCS emulator
    (one dual-region bucket) and the GCP metadata server (:mod:`drill.cloud_gcp`)."""
    nproc: int = 2
    first_step: int = 20
    spacing: int = 20
    step_delay_s: float = 0.05
    """Paces each step like a bigger model would (does not change the trajectory)."""
    nan_policy: str = "rollback"
    interval: str = "adaptive"
    """``adaptive`` (Daly, capped so that a checkpoint lands between two faults) or a
    number of steps (fixed interval)."""
    watchdog_s: float = 5.0
    poll_interval_s: float = 0.5
    """The trainer's metadata poll interval (AWS suggests 5 s; shorter keeps the drill short)."""
    max_restarts: int = 3
    node_timeout_s: float = 180.0
    launcher: str = "torchrun"
    """``torchrun`` (a failed worker restarts the whole group) or ``inprocess``
    (``python -m ftfleet.trainer.inprocess``: the survivors restart in place, a warm spare
    takes a dead rank's place, state from the in-memory snapshots)."""
    spares: int = 1
    """inprocess: warm spare processes per node."""
    collective_timeout_s: float = 1.0
    """inprocess: parallel.collective_timeout_s, how the survivors of a hung rank find out."""
    config: Path = DEFAULT_CONFIG
    overrides: list[str] = dataclasses.field(default_factory=list)


class DrillError(Exception):
    """The drill itself could not go on (not a failed recovery: those are reported)."""


class Drill:
    def __init__(self, opts: DrillOptions, cloud: Any, say: Callable[[str], None] = print, bar: Any = None) -> None:
        self.opts = opts
        self.cloud = cloud
        self.plan: Plan = build_plan(opts.faults, first_step=opts.first_step, spacing=opts.spacing)
        self.say_line = say
        self.bar = bar  # tqdm-like: .reset(total), .n, .refresh(), .set_description()
        self.t0 = time.monotonic()
        self.run_dir = opts.workdir / "run"
        self.fast_dir = opts.workdir / "fast-tier"
        self.ref_dir = opts.workdir / "reference"
        self.logs = opts.workdir / "logs"
        self.records: list[FaultRecord] = []
        self.notes: list[str] = []
        self._group_up = 0.0
        #: Each node's RAM (in-process: the in-memory snapshots), gone with the node.
        self.shm_root = Path("/dev/shm") / f"ftfleet-drill-{os.getpid()}"
        self._last_attempt = 0

    # -- plumbing ----------------------------------------------------------------

    def say(self, msg: str) -> None:
        self.say_line(f"[{time.monotonic() - self.t0:6.1f}s] {msg}")

    def common_overrides(self) -> list[str]:
        o, plan = self.opts, self.plan
        out = [
            "run_id=drill",
            f"train.steps={plan.steps}",
            "train.step_events=true",
            "train.state_hash=true",
            f"train.log_every={max(plan.steps, 1)}",
            f"faults.step_delay_s={o.step_delay_s}",
            f"resilience.anomaly.policy={o.nan_policy}",
            f"resilience.watcher.poll_interval_s={o.poll_interval_s}",
            "checkpoint.keep=3",
        ]
        if plan.nan_step:
            out.append(f"faults.nan_at_steps=[{plan.nan_step}]")
        if o.interval == "adaptive":
            # Never fewer than one checkpoint between two faults, whatever Daly says with
            # this drill's unrealistically frequent interruptions.
            cap = max(2, o.spacing // 2)
            out += [
                "resilience.interval.mode=adaptive",
                f"resilience.interval.fixed_steps={cap}",
                f"resilience.interval.max_steps={cap}",
            ]
        else:
            out += ["resilience.interval.mode=fixed", f"resilience.interval.fixed_steps={int(o.interval)}"]
        return out + list(o.overrides)

    @property
    def in_process(self) -> bool:
        return self.opts.launcher == "inprocess"

    def cmd(self, run_dir: Path, ckpt_dir: Path, overrides: list[str]) -> list[str]:
        if self.in_process:
            head = [
                sys.executable,
                "-m",
                "ftfleet.trainer.inprocess",
                f"--nproc={self.opts.nproc}",
                f"--spares={self.opts.spares}",
                "--worker=drill.inprocess_worker",
                # Far above the collective timeout: a hang is found by the failed
                # collective, not by the wrapper's progress watchdog.
                f"--soft-timeout={max(30.0, 10 * self.opts.collective_timeout_s)}",
                "--",
            ]
            overrides = [
                "checkpoint.memory=true",
                f"parallel.collective_timeout_s={self.opts.collective_timeout_s}",
                *overrides,
            ]
        else:
            head = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={self.opts.nproc}",
                f"--max-restarts={self.opts.max_restarts}",
                "-m",
                "drill.worker",  # the trainer, with this drill's faults as callbacks
            ]
        return [
            *head,
            "--config",
            str(self.opts.config),
            *self.common_overrides(),
            f"run_dir={run_dir}",
            f"checkpoint.dir={ckpt_dir}",
            *overrides,
        ]

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("FTFLEET_", "AWS_", "TORCHELASTIC_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        }
        env.update(CREDENTIALS)
        env.update(host_memory_env(os.environ))  # as the image's entrypoint (allocator, glibc tunables)
        env["OMP_NUM_THREADS"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(
            [str(SOURCE_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        env.update(extra or {})
        return env

    def _progress(self, desc: str, step: int | None = None) -> None:
        if self.bar is None:
            return
        if step is None:
            self.bar.reset(total=self.plan.steps)
        else:
            self.bar.n = step
        self.bar.set_description(desc)
        self.bar.refresh()

    # -- the reference ---------------------------------------------------------------

    def run_reference(self) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
        """Summary, events and wall seconds of the uninterrupted run (same data, same
        NaN batch, no faults, no buckets, no metadata service)."""
        self.say(f"reference: {self.plan.steps} steps on {self.opts.nproc} processes, no faults")
        shutil.rmtree(self.ref_dir, ignore_errors=True)
        node = Node(
            "reference",
            self.cmd(
                self.ref_dir,
                self.ref_dir / "ckpt",
                [f"resilience.watchdog.timeout_s={max(60.0, self.opts.watchdog_s)}"],
            ),
            self.env({"FTFLEET_SHM_DIR": str(self.shm_root / "reference")}),
            SOURCE_ROOT,
            self.logs / "reference.log",
        ).start()
        tail = EventTail(self.ref_dir)
        self._progress("reference")
        deadline = time.monotonic() + self.opts.node_timeout_s * 2
        while (rc := node.poll()) is None:
            for e in tail.poll():
                if e["event"] in ("step", "first_step"):
                    self._progress("reference", int(e["step"]))
            if time.monotonic() > deadline:
                node.kill()
                raise DrillError(f"the reference run did not finish in time; see {node.log_path}")
            time.sleep(0.05)
        tail.poll()
        summary = _read_summary(self.ref_dir)
        if rc != 0 or summary.get("status") != "completed":
            raise DrillError(
                f"the reference run failed (torchrun exit {rc}); see {node.log_path}:\n" + node.log_tail(1500)
            )
        wall = (node.t_exit or time.time()) - (node.t_launch or 0)
        self.say(f"reference: done in {wall:.1f}s, state_sha256 {summary['state_sha256'][:16]}")
        return summary, tail.events, wall

    # -- the faulted run -------------------------------------------------------------

    def run_faulted(self) -> tuple[dict[str, Any], list[dict[str, Any]], float, float, str]:
        """Summary, events, first launch and last exit (epoch seconds), and why the run
        did not complete ('' when it did)."""
        for d in (self.run_dir, self.fast_dir):
            shutil.rmtree(d, ignore_errors=True)
        tail = self._tail = EventTail(self.run_dir)
        self.cloud.start_replication()
        t_begin = t_end = time.time()
        problem = ""
        for i, seg in enumerate(self.plan.segments):
            self._before(seg)
            node = self._launch(seg)
            if i == 0:
                t_begin = node.t_launch or t_begin
            problem = self._watch(seg, node, tail)
            t_end = node.t_exit or time.time()
            if problem:
                break
        self.cloud.stop_replication()
        tail.poll()
        summary = _read_summary(self.run_dir)
        if not problem and summary.get("status") != "completed":
            problem = f"the faulted run ended with status {summary.get('status')!r}"
        return summary, tail.events, t_begin, t_end, problem

    def _launch(self, seg: SegmentPlan) -> Node:
        extra = [
            f"resilience.watchdog.timeout_s={self.opts.watchdog_s}",
            "resilience.watchdog.first_step_timeout_s=120",
            f"checkpoint.uri={self.cloud.primary_uri}",
        ]
        node_env = {"FTFLEET_CLOUD": self.opts.cloud, "FTFLEET_METADATA_ENDPOINT": self.cloud.metadata.url}
        if self.opts.cloud == "gcp":
            node_env.update(self.cloud.node_env())
            node_env["FTFLEET_PREEMPTION_NOTICE_S"] = str(GCP_PREEMPTION_NOTICE_S)
        else:
            extra += [
                f"checkpoint.replica_uri={self.cloud.replica_uri}",
                f"checkpoint.s3_endpoint_url={self.cloud.endpoint_url}",
            ]
        if self.plan.hang_step:
            extra += [f"faults.hang_at_step={self.plan.hang_step}", "faults.hang_rank=1"]
        if seg.stop_at_step:
            extra.append(f"train.stop_at_step={seg.stop_at_step}")
        node_env["FTFLEET_SHM_DIR"] = str(self.shm_root / seg.node)
        env = self.env({**node_env, "FTFLEET_NODE_ID": seg.node})
        node = Node(
            seg.node, self.cmd(self.run_dir, self.fast_dir, extra), env, SOURCE_ROOT, self.logs / f"{seg.node}.log"
        ).start()
        if self.in_process:
            self.say(
                f"{seg.node}: in-process launcher started ({self.opts.nproc} workers, {self.opts.spares} warm spare)"
            )
        else:
            self.say(
                f"{seg.node}: torchrun launched ({self.opts.nproc} workers, --max-restarts={self.opts.max_restarts})"
            )
        for rec in self.records:
            if rec.kind in seg.before and rec.t_fault == 0:
                rec.t_fault = node.t_launch or time.time()
        self._progress(seg.node)
        return node

    def _watch(self, seg: SegmentPlan, node: Node, tail: EventTail) -> str:
        """Follow one node until it exits (or is terminated after its notice); inject
        its faults. A problem that ends the drill, or ''."""
        pending = list(seg.triggers)
        step, preempted, deadline = 0, False, time.monotonic() + self.opts.node_timeout_s
        killed: list[tuple[WorkerGroup, FaultRecord]] = []
        expected_down: set[int] = set()
        groups_seen = 0
        while True:
            rc = node.poll()
            for e in tail.poll():
                step = self._on_event(seg, node, e, step)
                if e["event"] == "exit":
                    if node.group is not None:
                        expected_down.add(id(node.group))
                    preempted = preempted or e.get("code") == EXIT_PREEMPTED
            while groups_seen < len(node.groups):
                groups_seen += 1
                if groups_seen > 1:
                    self.say(f"{seg.node}: torchrun started worker group {groups_seen}")
            for kind, at in list(pending):
                group = node.group
                if step >= at and group is not None and group.t_down is None:
                    pending.remove((kind, at))
                    rec = self._inject(kind, at, node, step)
                    if kind == "sigkill":
                        killed.append((group, rec))
                        expected_down.add(id(group))
            self._check_groups(seg, node, tail, expected_down)
            if preempted and (node.group is None or node.group.t_down is not None or rc is not None):
                # The fleet terminates the instance (before torchrun restarts the group).
                node.kill()
                shutil.rmtree(self.shm_root / seg.node, ignore_errors=True)  # and its RAM
                self.say(f"{seg.node}: instance terminated (exit 75 after its emergency checkpoint)")
                self.cloud.metadata.reset()  # the replacement is another instance
                break
            if rc is not None:
                tail.poll()
                break
            if time.monotonic() > deadline:
                node.kill()
                return f"{seg.node} did not finish within {self.opts.node_timeout_s:.0f}s; see {node.log_path}"
            time.sleep(0.02)
        for group, rec in killed:
            rec.t_group_exit, rec.t_group_down = group.t_first_exit, group.t_down
        for kind, at in pending:
            self.records.append(
                FaultRecord(
                    kind, time.time(), at, error=(f"the run never reached step {at} on {seg.node} to inject it")
                )
            )
        if preempted:
            return ""
        if rc != EXIT_OK:
            return (
                f"{seg.node}: torchrun exited {rc} (restarts exhausted?); see {node.log_path}:\n{node.log_tail(1500)}"
            )
        summary = _read_summary(self.run_dir)
        if seg.stop_at_step and summary.get("step") != seg.stop_at_step:
            return f"{seg.node} should have stopped at step {seg.stop_at_step}, stopped at {summary.get('step')}"
        self.say(f"{seg.node}: exited 0 at step {summary.get('step')} ({summary.get('status')})")
        return ""

    def _on_event(self, seg: SegmentPlan, node: Node, e: dict[str, Any], step: int) -> int:
        kind = e["event"]
        if kind in ("step", "first_step"):
            step = int(e["step"])
            self._progress(f"{seg.node} attempt {e.get('attempt', 0)}", step)
        elif kind == "start":
            self._group_up = float(e["t"])
            attempt = int(e.get("attempt", 0))
            if self.in_process and attempt > self._last_attempt:
                self._restarted_in_place(node, attempt, float(e["t"]))
            self._last_attempt = attempt
        elif kind == "restored":
            step = int(e["step"])
            took = float(e["t"]) - self._group_up if self._group_up else float(e.get("seconds") or 0)
            self.say(
                f"{seg.node}: restored step {e['step']} from the {e.get('tier')} tier "
                f"({took:.1f}s after the process group was up)"
            )
        elif kind == "fresh":
            step = 0
            self.say(f"{seg.node}: no checkpoint, starting at step 0")
        elif kind == "notice":
            self.say(f"{seg.node}: ranks agreed on a {e.get('kind')} notice at step {e.get('step')}")
            if e.get("kind") in ("rebalance", "maintenance"):
                self.cloud.metadata.reset()  # acted on (GCP: the maintenance event ends)
        elif kind == "committed" and e.get("reason") not in ("interval", None):
            self.say(
                f"{seg.node}: committed step {e.get('step')} ({e.get('reason')}, {float(e.get('commit_s') or 0):.2f}s)"
            )
        elif kind == "anomaly":
            self.say(f"{seg.node}: anomaly at step {e.get('step')}: {e.get('reason')} -> {e.get('action')}")
        elif kind == "rollback":
            step = int(e["to_step"])
            self.say(f"{seg.node}: rolled back from step {e.get('from_step')} to {e.get('to_step')}")
        elif kind == "exit":
            self.say(f"{seg.node}: rank 0 exits {e.get('code')} at step {e.get('step')} ({e.get('reason')})")
        return step

    def _inject(self, kind: str, at: int, node: Node, step: int) -> FaultRecord:
        if kind == "notice" and self.opts.cloud == "gcp":
            self.cloud.metadata.preempt()
            what = f"instance/preempted set TRUE (stopped in {GCP_PREEMPTION_NOTICE_S} s)"
        elif kind == "rebalance" and self.opts.cloud == "gcp":
            self.cloud.metadata.maintenance("MIGRATE_ON_HOST_MAINTENANCE")
            what = "instance/maintenance-event set MIGRATE_ON_HOST_MAINTENANCE"
        elif kind == "notice":
            self.cloud.metadata.schedule_spot_interruption("terminate", in_seconds=120)
            what = "spot interruption notice posted (terminate in 120 s)"
        elif kind == "rebalance":
            self.cloud.metadata.recommend_rebalance()
            what = "rebalance recommendation posted"
        else:
            pid = node.kill_worker(rank=1 if self.opts.nproc > 1 else 0)
            what = f"SIGKILL sent to rank {1 if self.opts.nproc > 1 else 0} (pid {pid})"
        rec = FaultRecord(kind, time.time(), at, in_process=self.in_process and kind == "sigkill")
        self.records.append(rec)
        self.say(f"{node.name}: step {step}: {what}")
        return rec

    def _restarted_in_place(self, node: Node, attempt: int, t: float) -> None:
        """The in-process launcher began attempt ``attempt`` in the surviving processes:
        after the SIGKILL the drill sent, after the hang (the last progress was the step
        before it), or for no reason the drill knows (a note)."""
        last = _last_progress(self._tail.events, t)
        if any(r.kind == "sigkill" and r.in_process and r.t_fault <= t and not r.note for r in self.records):
            rec = next(r for r in self.records if r.kind == "sigkill" and r.in_process and not r.note)
            rec.note = f"attempt {attempt}"
            self.say(f"{node.name}: attempt {attempt} began in place {t - rec.t_fault:.2f}s after the SIGKILL")
        elif self._is_the_hang(last):
            rec = FaultRecord("hang", last["t"], self.plan.hang_step, in_process=True, note=f"attempt {attempt}")
            self.records.append(rec)
            self.say(
                f"{node.name}: attempt {attempt} began in place {t - last['t']:.2f}s after the last progress "
                f"at step {last['step']} (a collective timed out: the hang)"
            )
        else:
            where = last["step"] if last else "start-up"
            self.notes.append(f"unexpected: an in-process restart of {node.name} at step {where}")
            self.say(f"{node.name}: an unexpected in-process restart at step {where}")

    def _is_the_hang(self, last: dict[str, Any] | None) -> bool:
        """A failure whose last progress was the step before the planned hang, the first
        such failure: the hang (recorded once)."""
        hang = self.plan.hang_step
        return bool(
            hang
            and last is not None
            and int(last["step"]) == hang - 1
            and not any(r.kind == "hang" for r in self.records)
        )

    def _check_groups(self, seg: SegmentPlan, node: Node, tail: EventTail, expected_down: set[int]) -> None:
        """A group that went down on its own: the hang (once), or an unexpected failure."""
        for group in node.groups:
            if group.t_down is None or id(group) in expected_down:
                continue
            expected_down.add(id(group))
            if node.proc is not None and node.proc.poll() is not None:
                continue  # torchrun itself ended; judged by its exit status
            last = _last_progress(tail.events, group.t_first_exit or group.t_down)
            if self._is_the_hang(last):
                rec = FaultRecord(
                    "hang", last["t"], self.plan.hang_step, t_group_exit=group.t_first_exit, t_group_down=group.t_down
                )
                self.records.append(rec)
                self.say(
                    f"{node.name}: a worker exited {group.t_first_exit - last['t']:.1f}s after "
                    f"the last progress at step {last['step']} (the hang watchdog)"
                )
            else:
                where = last["step"] if last else "start-up"
                self.notes.append(f"unexpected: a worker group of {node.name} failed at step {where}")
                self.say(f"{node.name}: a worker group failed unexpectedly at step {where}")

    # -- faults applied while stopped ------------------------------------------------

    def _before(self, seg: SegmentPlan) -> None:
        for kind in seg.before:
            if kind == "corrupt":
                self.records.append(self._corrupt_newest())
            elif kind == "bucket_loss":
                self.records.append(self._lose_primary())

    def _corrupt_newest(self) -> FaultRecord:
        self.cloud.stop_replication()
        try:
            record, what = damage.corrupt_newest(self.cloud, self.fast_dir)
        finally:
            self.cloud.start_replication()
        self.say(what)
        return record

    def _lose_primary(self) -> FaultRecord:
        lose = damage.lose_location if self.opts.cloud == "gcp" else damage.lose_primary
        record, what = lose(self.cloud, self.fast_dir)
        self.say(what)
        return record

    # -- all of it ------------------------------------------------------------------

    def run(self) -> DrillReport:
        try:
            return self._run()
        finally:
            shutil.rmtree(self.shm_root, ignore_errors=True)

    def _run(self) -> DrillReport:
        names = GCP_KINDS if self.opts.cloud == "gcp" else KINDS
        self.say("plan: " + "; ".join(self.plan.describe(names)) + f"; {self.plan.steps} steps in all")
        ref_summary, ref_events, ref_wall = self.run_reference()
        summary, events, t_begin, t_end, problem = self.run_faulted()
        if self.plan.nan_step:  # configured, not injected: the event log says when it hit
            self.records.append(FaultRecord("nan", t_begin, self.plan.nan_step))
        if self.opts.cloud == "gcp":
            for r in self.records:
                r.label, r.notice_kind = GCP_KINDS[r.kind], "maintenance"
        results = [measure(r, events) for r in self.records]
        order = {k: i for i, k in enumerate(KINDS)}
        results.sort(key=lambda r: order[r.kind])
        missing = [k for k in self.plan.faults if k not in {r.kind for r in results}]
        ref_step_s = steady_step_time(ref_events)
        goodput = None
        if ref_step_s and summary.get("step"):
            goodput = Goodput(int(summary["step"]), t_end - t_begin, ref_step_s, ref_wall)
        final_ok = not problem and not missing
        final_reason = problem or (
            f"not injected: {', '.join(KINDS[k] for k in missing)}" if missing else "the faulted run completed"
        )
        if self.opts.cloud == "gcp":
            cloud_note = (
                "GCP: one dual-region bucket on a GCS emulator (fake-gcs-server); the loss of a location "
                "wipes the node's zonal fast tier and the next node restores from the bucket"
            )
        else:
            cloud_note = (
                f"moto has no bucket replication: the drill copies the primary's objects "
                f"to the replica every {self.cloud.replication_lag_s:g}s (manifests last)"
            )
        notes = [cloud_note, *self.notes]
        settings = {
            "cloud": self.opts.cloud,
            "faults": self.plan.faults,
            "steps": self.plan.steps,
            "nproc": self.opts.nproc,
            "fault_steps": {k: self.plan.step_of(k) for k in self.plan.faults},
            "step_delay_s": self.opts.step_delay_s,
            "interval": self.opts.interval,
            "nan_policy": self.opts.nan_policy,
            "watchdog_s": self.opts.watchdog_s,
            "launcher": self.opts.launcher,
            **(
                {"spares": self.opts.spares, "collective_timeout_s": self.opts.collective_timeout_s}
                if self.in_process
                else {}
            ),
            "workdir": str(self.opts.workdir),
        }
        return DrillReport(
            results,
            goodput,
            summary.get("state_sha256"),
            ref_summary.get("state_sha256"),
            final_ok,
            final_reason,
            notes,
            settings,
            prediction=predict(events, results, goodput),
        )


def _read_summary(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def run_drill(opts: DrillOptions, say: Callable[[str], None] = print, bar: Any = None) -> DrillReport:
    if opts.cloud == "gcp":
        from drill.cloud_gcp import GcpCloud

        with GcpCloud() as gcp:
            return Drill(opts, gcp, say, bar).run()
    with LocalCloud() as cloud:
        return Drill(opts, cloud, say, bar).run()


def _last_progress(events: Sequence[dict[str, Any]], t: float) -> dict[str, Any] | None:
    """The last step (or first step) event at or before ``t``."""
    steps = [e for e in events if e["event"] in ("step", "first_step") and e["t"] <= t]
    return steps[-1] if steps else None
