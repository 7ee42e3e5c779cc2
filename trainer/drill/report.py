"""What the drill measured, computed from the run's event log and the drill's own clock.

Everything here is a pure function of ``<run_dir>/events.jsonl`` (see
:mod:`trainer.events`) and of :class:`FaultRecord` objects the drill filled in while it
injected faults, so the maths can be tested on synthetic event logs.

Definitions (the report prints them too):

* A **life** is one process group of one torchrun attempt, seen through the events its
  rank 0 wrote (one ``pid``). A SIGKILL or a hang ends a life and torchrun starts the
  next one; a preempted node's replacement is a new torchrun, hence a new life.
* The **fault moment** is when the drill injected the fault (notice posted, signal
  sent); for a hang, the last step event before it (the last progress); for a NaN
  batch, the end of the step before it; for faults applied while the run is stopped
  (corrupted checkpoint, lost bucket), the launch of the replacement node.
* **Time to detect**: fault moment to the trainer acting on it: the ranks agreed on a
  notice; torchrun tore the group down after the SIGKILL; the watchdog ended a hung
  worker; the anomaly detector flagged the step; the restore had chosen a good
  checkpoint (measured from the group being up, for faults applied while stopped).
* **Work lost**: steps computed and then thrown away: the furthest step reached before
  the failure minus the step the run resumed from (a skipped NaN batch is not counted:
  skipping it is the point).
* **Time to resume**: fault moment to the first training step after recovery.
* **Goodput**: useful step time over wall time, where useful time is the final step
  count times the uninterrupted reference run's seconds per step (steady state, its
  checkpoint saves included) and wall time runs from the launch of the faulted run's
  first node to the exit of its last.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Iterable, Sequence

#: Fault kinds, in the order the drill injects them, and how the report names them.
KINDS: dict[str, str] = {
    "notice": "spot interruption notice",
    "rebalance": "rebalance recommendation",
    "sigkill": "SIGKILL of one worker",
    "corrupt": "corrupted newest checkpoint",
    "nan": "NaN batch",
    "hang": "hung rank",
    "bucket_loss": "loss of the primary bucket",
}

_STEP_EVENTS = ("first_step", "step")


@dataclasses.dataclass
class Life:
    """One worker group's life: the events of one rank-0 process."""

    pid: int
    attempt: int
    events: list[dict[str, Any]]

    @property
    def t_start(self) -> float:
        return self.events[0]["t"]

    @property
    def t_end(self) -> float:
        return self.events[-1]["t"]

    def first(self, name: str, after: float = -math.inf, **match: Any) -> dict[str, Any] | None:
        for e in self.events:
            if e["event"] == name and e["t"] >= after and all(e.get(k) == v for k, v in match.items()):
                return e
        return None

    @property
    def restored(self) -> dict[str, Any] | None:
        return self.first("restored")

    @property
    def resumed_from(self) -> int:
        """The step this life started from (0 when it started fresh)."""
        r = self.restored
        return int(r["step"]) if r else 0

    @property
    def first_step(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e["event"] in _STEP_EVENTS), None)

    def progress(self, before: float = math.inf) -> tuple[int, float | None]:
        """(step, t) of the last step event before ``before``; the resumed-from step when
        there is none. After a rollback this is where the run is, not the furthest step."""
        last = None
        for e in self.events:
            if e["event"] in _STEP_EVENTS and e["t"] <= before:
                last = e
        if last is None:
            return self.resumed_from, None
        return int(last["step"]), last["t"]

    def step_after(self, t: float, min_step: int = 0) -> dict[str, Any] | None:
        """The first step event after ``t`` whose step is at least ``min_step``."""
        return next((e for e in self.events if e["event"] in _STEP_EVENTS and e["t"] > t
                     and int(e["step"]) >= min_step), None)

    @property
    def exit_code(self) -> int | None:
        e = self.first("exit")
        return None if e is None else int(e["code"])


def split_lives(events: Iterable[dict[str, Any]]) -> list[Life]:
    """Group events by the rank-0 process that wrote them, in order of appearance."""
    lives: list[Life] = []
    by_pid: dict[int, Life] = {}
    for e in sorted(events, key=lambda e: e["t"]):
        pid = int(e.get("pid", 0))
        life = by_pid.get(pid)
        if life is None or e["event"] == "start" and life.first("start") is not None:
            life = Life(pid, int(e.get("attempt", 0)), [])
            by_pid[pid] = life
            lives.append(life)
        life.events.append(e)
    return lives


def life_at(lives: Sequence[Life], t: float) -> Life | None:
    """The life that was running at ``t``: the last one started at or before it."""
    running = [life for life in lives if life.t_start <= t]
    return running[-1] if running else None


def life_after(lives: Sequence[Life], t: float) -> Life | None:
    """The first life started after ``t``."""
    return next((life for life in lives if life.t_start > t), None)


# ---------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class FaultRecord:
    """What the drill did and saw from outside the trainer."""

    kind: str
    t_fault: float
    """Epoch seconds: the fault moment (see the module doc)."""
    at_step: int | None = None
    """The step the fault was planned at (nan/hang: the configured step)."""
    t_group_exit: float | None = None
    """When the first worker of the affected group exited (the runner's process watch)."""
    t_group_down: float | None = None
    """When every worker of the affected group had exited."""
    newest_step: int | None = None
    """Faults applied while stopped: the newest committed step that was damaged."""
    previous_step: int | None = None
    """Corrupted checkpoint: the committed step before it, which the restore should use."""
    note: str = ""
    error: str | None = None
    """The drill could not inject or observe this fault (the fault fails)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind {self.kind!r}: use one of {', '.join(KINDS)}")


@dataclasses.dataclass
class FaultResult:
    kind: str
    ok: bool
    reason: str
    """Why it failed, or a one-line account of the recovery."""
    detect_s: float | None = None
    lost_steps: int | None = None
    resume_s: float | None = None
    at_step: int | None = None

    @property
    def name(self) -> str:
        return KINDS[self.kind]

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "ok": self.ok, "reason": self.reason,
                "at_step": self.at_step, "detect_s": _round(self.detect_s),
                "lost_steps": self.lost_steps, "resume_s": _round(self.resume_s)}


def _round(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def _fail(rec: FaultRecord, reason: str, **measured: Any) -> FaultResult:
    return FaultResult(rec.kind, False, reason, at_step=rec.at_step, **measured)


def _breakdown(nxt: Life, since: float) -> str:
    """Where the time to resume went: process start-up (torchrun, imports, process group)
    and the restore."""
    restored = nxt.restored or nxt.first("fresh")
    up = nxt.t_start - since
    if restored is None:
        return f"start-up {up:.1f}s"
    return f"start-up {up:.1f}s, restore {restored['t'] - nxt.t_start:.1f}s"


def _replacement(rec: FaultRecord, lives: Sequence[Life], after: float) -> Life | None:
    """The first life started after ``after`` that trained a step (a group torchrun
    started and that died before training, e.g. on a node being terminated, is skipped)."""
    return next((life for life in lives if life.t_start > after and life.first_step is not None),
                None)


def measure(rec: FaultRecord, events: Sequence[dict[str, Any]]) -> FaultResult:
    """Time to detect, work lost and time to resume for one fault, and whether the run
    recovered from it."""
    if rec.error:
        return _fail(rec, rec.error)
    lives = split_lives(events)
    return _MEASURES[rec.kind](rec, lives)


def _notice(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    life = life_at(lives, rec.t_fault)
    notice = life and life.first("notice", after=rec.t_fault, kind="termination")
    if notice is None:
        return _fail(rec, "no termination notice was agreed on after the notice was posted")
    detect = notice["t"] - rec.t_fault
    commit = life.first("committed", after=notice["t"])
    if commit is None:
        return _fail(rec, "no emergency checkpoint was committed after the notice", detect_s=detect)
    deadline = float(notice.get("deadline") or commit.get("deadline") or math.inf)
    within = bool(commit.get("within_deadline", commit["t"] <= deadline))
    if not within:
        return _fail(rec, f"emergency checkpoint of step {commit['step']} committed after "
                          "the deadline", detect_s=detect)
    if life.exit_code != 75:
        return _fail(rec, f"the node did not exit 75 after the notice (exit event: "
                          f"{life.exit_code})", detect_s=detect)
    nxt = _replacement(rec, lives, life.t_end)
    if nxt is None:
        return _fail(rec, "the replacement node never trained a step", detect_s=detect)
    reached, _ = life.progress()
    lost = max(0, reached - nxt.resumed_from)
    left = deadline - commit["t"]
    return FaultResult(rec.kind, True,
                       f"emergency checkpoint step {commit['step']} committed "
                       f"{commit['t'] - notice['t']:.2f}s after agreement, {left:.0f}s before "
                       f"the deadline; exit 75; replacement resumed from step {nxt.resumed_from}"
                       f" ({nxt.restored.get('tier', '?') if nxt.restored else 'fresh'}; "
                       f"{_breakdown(nxt, life.t_end)})",
                       detect_s=detect, lost_steps=lost,
                       resume_s=nxt.first_step["t"] - rec.t_fault, at_step=rec.at_step)


def _rebalance(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    life = life_at(lives, rec.t_fault)
    notice = life and life.first("notice", after=rec.t_fault, kind="rebalance")
    if notice is None:
        return _fail(rec, "no rebalance notice was agreed on after the recommendation")
    detect = notice["t"] - rec.t_fault
    commit = life.first("committed", after=notice["t"])
    if commit is None:
        return _fail(rec, "no early checkpoint was committed after the recommendation",
                     detect_s=detect)
    if life.first("exit", after=notice["t"], code=75) is not None:
        return _fail(rec, "the run exited after a rebalance recommendation (it is not a "
                          "termination)", detect_s=detect)
    nxt_step = life.step_after(notice["t"], min_step=int(notice.get("step") or 0) + 1)
    if nxt_step is None:
        return _fail(rec, "training did not continue after the early checkpoint",
                     detect_s=detect)
    return FaultResult(rec.kind, True,
                       f"early checkpoint step {commit['step']} committed, training went on",
                       detect_s=detect, lost_steps=0, resume_s=nxt_step["t"] - rec.t_fault,
                       at_step=rec.at_step)


def _group_failure(rec: FaultRecord, lives: Sequence[Life], what: str) -> FaultResult:
    """SIGKILL or hang: torchrun restarts the group in place."""
    life = life_at(lives, rec.t_fault)
    if life is None:
        return _fail(rec, f"no running group when the {what} was injected")
    if rec.kind == "sigkill":
        seen = rec.t_group_down
        if seen is None:
            return _fail(rec, "torchrun never tore the group down after the SIGKILL")
    else:
        seen = rec.t_group_exit
        if seen is None:
            return _fail(rec, "no worker exited: the hang was not detected")
    detect = seen - rec.t_fault
    nxt = _replacement(rec, lives, rec.t_fault)
    if nxt is None:
        return _fail(rec, f"no restarted group trained a step after the {what}", detect_s=detect)
    reached, _ = life.progress(before=seen)
    return FaultResult(rec.kind, True,
                       f"group restarted (attempt {nxt.attempt}), resumed from step "
                       f"{nxt.resumed_from} ({nxt.restored.get('tier', '?') if nxt.restored else 'fresh'}; "
                       f"{_breakdown(nxt, rec.t_group_down or seen)})",
                       detect_s=detect, lost_steps=max(0, reached - nxt.resumed_from),
                       resume_s=nxt.first_step["t"] - rec.t_fault, at_step=rec.at_step)


def _sigkill(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    return _group_failure(rec, lives, "SIGKILL")


def _hang(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    return _group_failure(rec, lives, "hang")


def _nan(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    anomaly, life = None, None
    for candidate in lives:
        anomaly = candidate.first("anomaly", after=rec.t_fault, step=rec.at_step)
        if anomaly is not None:
            life = candidate
            break
    if anomaly is None or life is None:
        return _fail(rec, f"no anomaly was reported at step {rec.at_step}")
    before = [e for e in life.events if e["event"] in _STEP_EVENTS and e["t"] <= anomaly["t"]
              and int(e["step"]) < int(rec.at_step or 0)]
    t0 = before[-1]["t"] if before else anomaly["t"]
    detect = anomaly["t"] - t0
    action = anomaly.get("action")
    lost = 0
    if action == "rollback":
        rb = life.first("rollback", after=anomaly["t"])
        if rb is None:
            return _fail(rec, "rollback was decided but no rollback happened", detect_s=detect)
        lost = max(0, int(rb["from_step"]) - int(rb["to_step"]))
        after = rb["t"]
        how = f"rolled back from step {rb['from_step']} to {rb['to_step']}, batch skipped"
    elif action == "skip":
        after = anomaly["t"]
        how = "step skipped"
    else:
        return _fail(rec, f"anomaly at step {rec.at_step} with action {action!r}", detect_s=detect)
    nxt = life.step_after(after)
    if nxt is None:
        nxt_life = life_after(lives, after)
        nxt = nxt_life.first_step if nxt_life else None
    if nxt is None:
        return _fail(rec, f"training did not continue after the NaN batch ({how})",
                     detect_s=detect, lost_steps=lost)
    return FaultResult(rec.kind, True, f"non-finite loss at step {rec.at_step}: {how}",
                       detect_s=detect, lost_steps=lost, resume_s=nxt["t"] - t0,
                       at_step=rec.at_step)


def _restart_from_stopped(rec: FaultRecord, lives: Sequence[Life]) -> tuple[Life | None, str | None]:
    nxt = life_after(lives, rec.t_fault - 1e-6)
    if nxt is None or nxt.first("start") is None:
        return None, "the replacement node never started"
    if nxt.first_step is None:
        return None, "the replacement node never trained a step"
    return nxt, None


def _corrupt(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    nxt, problem = _restart_from_stopped(rec, lives)
    if nxt is None:
        return _fail(rec, problem or "")
    restored = nxt.restored
    detect = restored["t"] - nxt.t_start if restored else None
    got = nxt.resumed_from
    if rec.newest_step is not None and got >= rec.newest_step:
        return _fail(rec, f"resumed from step {got}: the corrupted step {rec.newest_step} "
                          "was not skipped", detect_s=detect)
    if rec.previous_step is not None and got != rec.previous_step:
        return _fail(rec, f"resumed from step {got}, expected the previous checkpoint "
                          f"{rec.previous_step}", detect_s=detect)
    return FaultResult(rec.kind, True,
                       f"step {rec.newest_step} skipped in every tier, resumed from step {got}"
                       f" ({restored.get('tier', '?') if restored else 'fresh'}; "
                       f"{_breakdown(nxt, rec.t_fault)})",
                       detect_s=detect,
                       lost_steps=max(0, (rec.newest_step or got) - got),
                       resume_s=nxt.first_step["t"] - rec.t_fault, at_step=rec.at_step)


def _bucket_loss(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    nxt, problem = _restart_from_stopped(rec, lives)
    if nxt is None:
        return _fail(rec, problem or "")
    restored = nxt.restored
    if restored is None:
        return _fail(rec, "the new node started from step 0: the replica was not used")
    detect = restored["t"] - nxt.t_start
    if restored.get("tier") != "replica":
        return _fail(rec, f"restored from the {restored.get('tier')} tier, expected the replica",
                     detect_s=detect)
    got = nxt.resumed_from
    return FaultResult(rec.kind, True, f"restored step {got} from the replica bucket "
                                       f"({_breakdown(nxt, rec.t_fault)})",
                       detect_s=detect, lost_steps=max(0, (rec.newest_step or got) - got),
                       resume_s=nxt.first_step["t"] - rec.t_fault, at_step=rec.at_step)


_MEASURES = {"notice": _notice, "rebalance": _rebalance, "sigkill": _sigkill,
             "corrupt": _corrupt, "nan": _nan, "hang": _hang, "bucket_loss": _bucket_loss}


# ---------------------------------------------------------------------------
# Goodput
# ---------------------------------------------------------------------------


def steady_step_time(events: Iterable[dict[str, Any]]) -> float | None:
    """Seconds per step of a run in steady state: the time between its first and last
    step event, over the steps in between, summed over its lives (start-up and restore
    excluded; periodic saves, skipped and rolled-back steps included)."""
    seconds, steps = 0.0, 0
    for life in split_lives(events):
        marks = [e for e in life.events if e["event"] in _STEP_EVENTS]
        if len(marks) >= 2:
            seconds += marks[-1]["t"] - marks[0]["t"]
            steps += int(marks[-1]["step"]) - int(marks[0]["step"])
    return seconds / steps if steps > 0 and seconds > 0 else None


def daly_goodput(interval_s: float, cost_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's (2006) model under exponential failures of mean ``mtbf_s``: a save costing
    ``cost_s`` after every ``interval_s`` seconds of work, ``restart_s`` lost per failure
    before work resumes. Expected wall time per second of work is
    ``M e^(R/M) (e^((tau + C)/M) - 1) / tau``; goodput is its inverse. Its maximum is
    near :func:`trainer.resilience.interval.daly_interval`."""
    if not (interval_s > 0 and cost_s >= 0 and restart_s >= 0 and mtbf_s > 0):
        raise ValueError("interval and MTBF must be > 0, save and restart costs >= 0")
    m = mtbf_s
    return interval_s / (m * math.exp(restart_s / m) * math.expm1((interval_s + cost_s) / m))


@dataclasses.dataclass
class Goodput:
    final_step: int
    wall_s: float
    """Faulted run: launch of the first node to the exit of the last."""
    ref_step_s: float
    ref_wall_s: float
    """Uninterrupted reference run: launch to exit."""

    @property
    def useful_s(self) -> float:
        return self.final_step * self.ref_step_s

    @property
    def goodput(self) -> float:
        return self.useful_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def relative(self) -> float:
        """Reference wall time over faulted wall time: the slowdown the faults cost,
        start-up included."""
        return self.ref_wall_s / self.wall_s if self.wall_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"final_step": self.final_step, "wall_s": round(self.wall_s, 2),
                "ref_step_s": round(self.ref_step_s, 5), "ref_wall_s": round(self.ref_wall_s, 2),
                "useful_s": round(self.useful_s, 2), "goodput": round(self.goodput, 4),
                "relative_to_reference": round(self.relative, 4)}


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class DrillReport:
    faults: list[FaultResult]
    goodput: Goodput | None
    state_sha256: str | None
    reference_sha256: str | None
    final_ok: bool
    final_reason: str
    notes: list[str] = dataclasses.field(default_factory=list)
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def sha_match(self) -> bool:
        return bool(self.state_sha256) and self.state_sha256 == self.reference_sha256

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.faults) and self.final_ok and self.sha_match

    @property
    def reason(self) -> str:
        """One line: why the drill failed, or that it passed."""
        for f in self.faults:
            if not f.ok:
                return f"{f.name}: {f.reason}"
        if not self.final_ok:
            return self.final_reason
        if not self.sha_match:
            return (f"final state_sha256 {str(self.state_sha256)[:12]} differs from the "
                    f"reference's {str(self.reference_sha256)[:12]}")
        return f"all {len(self.faults)} recoveries succeeded; final state equals the reference"

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason,
                "faults": [f.to_json() for f in self.faults],
                "goodput": self.goodput.to_json() if self.goodput else None,
                "state_sha256": self.state_sha256, "reference_sha256": self.reference_sha256,
                "state_matches_reference": self.sha_match, "final_ok": self.final_ok,
                "final_reason": self.final_reason, "notes": self.notes,
                "settings": self.settings}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    def table_rows(self) -> list[list[str]]:
        rows = []
        for f in self.faults:
            rows.append([f.name, "-" if f.at_step is None else str(f.at_step), _fmt_s(f.detect_s),
                         "-" if f.lost_steps is None else str(f.lost_steps), _fmt_s(f.resume_s),
                         "ok" if f.ok else "FAILED", f.reason])
        return rows

    def to_markdown(self) -> str:
        head = ["fault", "at step", "detect", "work lost (steps)", "resume", "result", "what happened"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |"
                  for row in self.table_rows()]
        lines += ["", f"- {LEGEND}."] + [f"- {line}" for line in self.summary_lines()]
        lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"

    def to_text(self) -> str:
        head = ["fault", "step", "detect", "lost", "resume", "result"]
        rows = [row[:6] for row in self.table_rows()]
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
        out += [fmt.format(*r) for r in rows]
        out += [""] + [f"{r[0]}: {r[6]}" for r in self.table_rows()]
        out += ["", LEGEND, ""] + self.summary_lines() + self.notes
        out += ["", ("PASS: " if self.ok else "FAIL: ") + self.reason]
        return "\n".join(out) + "\n"

    def summary_lines(self) -> list[str]:
        lines = []
        g = self.goodput
        if g is not None:
            lines.append(f"goodput {g.goodput:.3f}: {g.final_step} steps x {g.ref_step_s:.3f} s/step "
                         f"(reference, steady state) = {g.useful_s:.1f} s useful in {g.wall_s:.1f} s "
                         f"wall; the uninterrupted reference took {g.ref_wall_s:.1f} s "
                         f"({g.relative:.2f} of the faulted run's wall time)")
        same = "equals" if self.sha_match else "DIFFERS FROM"
        lines.append(f"final state_sha256 {str(self.state_sha256)[:16]} {same} the reference's "
                     f"{str(self.reference_sha256)[:16]}")
        return lines


#: How to read the table; printed under it.
LEGEND = ("detect: from the fault to the trainer acting on it (notice agreed, group torn down, "
          "watchdog fired, anomaly flagged; for damage done while stopped, the restore's search); "
          "lost: steps computed again; resume: from the fault (for damage done while stopped, the "
          "replacement's launch) to the first step after recovery, start-up and restore included")


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"
