"""What each fault cost and whether the run recovered, computed from the event log and
the :class:`FaultRecord` the drill filled in from outside the trainer (a SIGKILLed or
hung process writes no ``exit`` line), so the maths can be tested on synthetic logs.

* The **fault moment** is when the drill injected the fault (notice posted, signal
  sent); for a hang, the last step event before it (the last progress); for a NaN
  batch, the end of the step before it; for damage done while the run is stopped
  (corrupted checkpoint, lost bucket), the launch of the replacement node.
* **Time to detect**: fault moment to the trainer acting on it: the ranks agreed on a
  notice; torchrun tore the group down after the SIGKILL; the watchdog ended a hung
  worker; under the in-process launcher, the restarted attempt's process group was up
  (detection, abort and re-rendezvous in the surviving processes); the anomaly
  detector flagged the step; for damage done while stopped, the restore's search from
  the group being up to a good checkpoint chosen.
* **Work lost**: steps computed and then thrown away: the furthest step reached before
  the failure minus the step the run resumed from (a skipped NaN batch is not counted:
  skipping it is the point).
* **Time to resume**: fault moment to the first training step after recovery.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from drill.lives import STEP_EVENTS, Life, life_after, life_at, split_lives

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
#: How the faults are named, and what they are, when the drill plays GCP: a preemption
#: (instance/preempted), a live-migration maintenance event (advisory, like a rebalance
#: recommendation), and the loss of the location holding the node and its zonal fast
#: tier (the dual-region bucket survives it).
GCP_KINDS: dict[str, str] = {
    **KINDS,
    "notice": "GCP preemption (instance/preempted)",
    "rebalance": "maintenance event (MIGRATE_ON_HOST_MAINTENANCE)",
    "bucket_loss": "loss of one location (node and fast tier)",
}


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
    label: str | None = None
    """The report's name for the fault, when not the AWS one of :data:`KINDS`."""
    notice_kind: str = "rebalance"
    """The advisory notice the ``rebalance`` fault raises (GCP: ``maintenance``)."""
    expected_tier: str = "replica"
    """The tier ``bucket_loss`` must restore from (GCP: the one dual-region bucket, ``primary``)."""
    in_process: bool = False
    """SIGKILL or hang under the in-process launcher: the survivors restart in place."""

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
    label: str | None = None

    @property
    def name(self) -> str:
        return self.label or KINDS[self.kind]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "ok": self.ok,
            "reason": self.reason,
            "at_step": self.at_step,
            "detect_s": _round(self.detect_s),
            "lost_steps": self.lost_steps,
            "resume_s": _round(self.resume_s),
        }


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
    return next((life for life in lives if life.t_start > after and life.first_step is not None), None)


def measure(rec: FaultRecord, events: Sequence[dict[str, Any]]) -> FaultResult:
    """Time to detect, work lost and time to resume for one fault, and whether the run
    recovered from it."""
    if rec.error:
        return dataclasses.replace(_fail(rec, rec.error), label=rec.label)
    lives = split_lives(events)
    result = _MEASURES[rec.kind](rec, lives)
    result.label = rec.label
    return result


def _commit_of(life: Life, notice: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint taken for a notice: the commit of the step the ranks agreed at (a
    save of an earlier step still in flight may land first), else the next commit."""
    return life.first("committed", after=notice["t"], step=notice.get("step")) or life.first(
        "committed", after=notice["t"]
    )


def _notice(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    life = life_at(lives, rec.t_fault)
    notice = life and life.first("notice", after=rec.t_fault, kind="termination")
    if notice is None:
        return _fail(rec, "no termination notice was agreed on after the notice was posted")
    detect = notice["t"] - rec.t_fault
    commit = _commit_of(life, notice)
    if commit is None:
        return _fail(rec, "no emergency checkpoint was committed after the notice", detect_s=detect)
    deadline = float(notice.get("deadline") or commit.get("deadline") or math.inf)
    within = bool(commit.get("within_deadline", commit["t"] <= deadline))
    if not within:
        return _fail(
            rec, f"emergency checkpoint of step {commit['step']} committed after the deadline", detect_s=detect
        )
    if life.exit_code != 75:
        return _fail(rec, f"the node did not exit 75 after the notice (exit event: {life.exit_code})", detect_s=detect)
    nxt = _replacement(rec, lives, life.t_end)
    if nxt is None:
        return _fail(rec, "the replacement node never trained a step", detect_s=detect)
    reached, _ = life.progress()
    lost = max(0, reached - nxt.resumed_from)
    left = deadline - commit["t"]
    return FaultResult(
        rec.kind,
        True,
        f"emergency checkpoint step {commit['step']} committed "
        f"{commit['t'] - notice['t']:.2f}s after agreement, {left:.0f}s before "
        f"the deadline; exit 75; replacement resumed from step {nxt.resumed_from}"
        f" ({nxt.restored.get('tier', '?') if nxt.restored else 'fresh'}; "
        f"{_breakdown(nxt, life.t_end)})",
        detect_s=detect,
        lost_steps=lost,
        resume_s=nxt.first_step["t"] - rec.t_fault,
        at_step=rec.at_step,
    )


def _rebalance(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    life = life_at(lives, rec.t_fault)
    notice = life and life.first("notice", after=rec.t_fault, kind=rec.notice_kind)
    if notice is None:
        return _fail(rec, f"no {rec.notice_kind} notice was agreed on after it was posted")
    detect = notice["t"] - rec.t_fault
    commit = _commit_of(life, notice)
    if commit is None:
        return _fail(rec, "no early checkpoint was committed after the recommendation", detect_s=detect)
    if life.first("exit", after=notice["t"], code=75) is not None:
        return _fail(
            rec, f"the run exited after an advisory {rec.notice_kind} notice (not a termination)", detect_s=detect
        )
    nxt_step = life.step_after(notice["t"], min_step=int(notice.get("step") or 0) + 1)
    if nxt_step is None:
        return _fail(rec, "training did not continue after the early checkpoint", detect_s=detect)
    return FaultResult(
        rec.kind,
        True,
        f"early checkpoint step {commit['step']} committed, training went on",
        detect_s=detect,
        lost_steps=0,
        resume_s=nxt_step["t"] - rec.t_fault,
        at_step=rec.at_step,
    )


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
    return FaultResult(
        rec.kind,
        True,
        f"group restarted (attempt {nxt.attempt}), resumed from step "
        f"{nxt.resumed_from} ({nxt.restored.get('tier', '?') if nxt.restored else 'fresh'}; "
        f"{_breakdown(nxt, rec.t_group_down or seen)})",
        detect_s=detect,
        lost_steps=max(0, reached - nxt.resumed_from),
        resume_s=nxt.first_step["t"] - rec.t_fault,
        at_step=rec.at_step,
    )


def _in_process_failure(rec: FaultRecord, lives: Sequence[Life], what: str) -> FaultResult:
    """SIGKILL or hang under the in-process launcher: the next attempt starts in the
    surviving processes (a warm spare takes a dead rank's place). The ``start`` events'
    ``pids`` (every rank's) say which processes the restart kept."""
    life = life_at(lives, rec.t_fault)
    if life is None:
        return _fail(rec, f"no running attempt when the {what} was injected")
    nxt = _replacement(rec, lives, rec.t_fault)
    if nxt is None:
        return _fail(rec, f"no restarted attempt trained a step after the {what}")
    before = (life.first("start") or {}).get("pids") or []
    after = (nxt.first("start") or {}).get("pids") or []
    kept = sorted(set(before) & set(after))
    replaced = [f"rank {r}: pid {a} -> {b}" for r, (a, b) in enumerate(zip(before, after, strict=False)) if a != b]
    exited = "every process kept" if not replaced else "; ".join(replaced)
    reached, _ = life.progress(before=nxt.t_start)
    restored = nxt.restored
    up = nxt.t_start - rec.t_fault
    return FaultResult(
        rec.kind,
        True,
        f"in-process restart (attempt {nxt.attempt}): {len(kept)} of {len(before)} processes never exited "
        f"({exited}); resumed from step {nxt.resumed_from} "
        f"({restored.get('tier', '?') if restored else 'fresh'}; restart {up:.1f}s, restore "
        f"{(restored['t'] - nxt.t_start) if restored else 0:.2f}s)",
        detect_s=up,
        lost_steps=max(0, reached - nxt.resumed_from),
        resume_s=nxt.first_step["t"] - rec.t_fault,
        at_step=rec.at_step,
    )


def _sigkill(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    if rec.in_process:
        return _in_process_failure(rec, lives, "SIGKILL")
    return _group_failure(rec, lives, "SIGKILL")


def _hang(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    if rec.in_process:
        return _in_process_failure(rec, lives, "hang")
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
    before = [
        e
        for e in life.events
        if e["event"] in STEP_EVENTS and e["t"] <= anomaly["t"] and int(e["step"]) < int(rec.at_step or 0)
    ]
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
        return _fail(rec, f"training did not continue after the NaN batch ({how})", detect_s=detect, lost_steps=lost)
    return FaultResult(
        rec.kind,
        True,
        f"non-finite loss at step {rec.at_step}: {how}",
        detect_s=detect,
        lost_steps=lost,
        resume_s=nxt["t"] - t0,
        at_step=rec.at_step,
    )


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
        return _fail(
            rec, f"resumed from step {got}: the corrupted step {rec.newest_step} was not skipped", detect_s=detect
        )
    if rec.previous_step is not None and got != rec.previous_step:
        return _fail(
            rec, f"resumed from step {got}, expected the previous checkpoint {rec.previous_step}", detect_s=detect
        )
    return FaultResult(
        rec.kind,
        True,
        f"step {rec.newest_step} skipped in every tier, resumed from step {got}"
        f" ({restored.get('tier', '?') if restored else 'fresh'}; "
        f"{_breakdown(nxt, rec.t_fault)})",
        detect_s=detect,
        lost_steps=max(0, (rec.newest_step or got) - got),
        resume_s=nxt.first_step["t"] - rec.t_fault,
        at_step=rec.at_step,
    )


def _bucket_loss(rec: FaultRecord, lives: Sequence[Life]) -> FaultResult:
    nxt, problem = _restart_from_stopped(rec, lives)
    if nxt is None:
        return _fail(rec, problem or "")
    restored = nxt.restored
    if restored is None:
        return _fail(rec, f"the new node started from step 0: the {rec.expected_tier} bucket was not used")
    detect = restored["t"] - nxt.t_start
    if restored.get("tier") != rec.expected_tier:
        return _fail(
            rec, f"restored from the {restored.get('tier')} tier, expected the {rec.expected_tier}", detect_s=detect
        )
    got = nxt.resumed_from
    return FaultResult(
        rec.kind,
        True,
        f"restored step {got} from the {rec.expected_tier} bucket ({_breakdown(nxt, rec.t_fault)})",
        detect_s=detect,
        lost_steps=max(0, (rec.newest_step or got) - got),
        resume_s=nxt.first_step["t"] - rec.t_fault,
        at_step=rec.at_step,
    )


_MEASURES = {
    "notice": _notice,
    "rebalance": _rebalance,
    "sigkill": _sigkill,
    "corrupt": _corrupt,
    "nan": _nan,
    "hang": _hang,
    "bucket_loss": _bucket_loss,
}
