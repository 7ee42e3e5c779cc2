"""The drill's report: every fault's measures (:mod:`drill.faults`), the goodput,
and whether the final state equals the uninterrupted reference run's; as text, Markdown
and JSON.

**Goodput** is useful step time over wall time: useful time is the final step count
times the reference run's seconds per step (steady state, its periodic saves included);
wall time runs from the launch of the faulted run's first node to the exit of its last.

**The model's prediction** beside it (:func:`predict`): the costs Daly's model prices
(the model `ftfleet plan` uses), at what this run measured: each save its blocked time
C, each failure a restart R (the mean time from a fault to the first step after its
recovery) and half an interval of work computed again; plus the one start-up the
reference paid too. The drill's faults come at fixed steps, not at a rate over wall
time, so the prediction takes their number from the plan instead of ``e^(R/M)``:
wall = start-up + useful (1 + C / interval) + faults (R + interval / 2).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from typing import Any

from drill.faults import FaultResult


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
        return {
            "final_step": self.final_step,
            "wall_s": round(self.wall_s, 2),
            "ref_step_s": round(self.ref_step_s, 5),
            "ref_wall_s": round(self.ref_wall_s, 2),
            "useful_s": round(self.useful_s, 2),
            "goodput": round(self.goodput, 4),
            "relative_to_reference": round(self.relative, 4),
        }


@dataclasses.dataclass
class Prediction:
    """The model's goodput at the costs one faulted run measured (module doc)."""

    interval_s: float
    """The median interval between two interval saves, in seconds of steps."""
    cost_s: float
    """A save's median blocked time."""
    restart_s: float
    """The faults' mean time from the fault to the first step after recovery."""
    faults: int
    startup_s: float
    """The reference run's wall time beyond its steps (start-up, the end)."""
    goodput: float

    def to_json(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in dataclasses.asdict(self).items()}


def predict(events: Sequence[dict[str, Any]], faults: Sequence[FaultResult], g: Goodput | None) -> Prediction | None:
    """The model's goodput for the run of ``events`` (its rank 0's event log), with the
    measured ``faults`` and goodput ``g``; None without two interval saves or a fault."""
    saves = [e for e in events if e.get("event") == "committed" and e.get("reason") == "interval"]
    steps = sorted({int(e["step"]) for e in saves})
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    resumes = [f.resume_s for f in faults if f.resume_s is not None]
    if g is None or not gaps or not resumes or g.ref_step_s <= 0:
        return None
    interval_s = statistics.median(gaps) * g.ref_step_s
    cost_s = statistics.median(float(e.get("blocked_s") or 0.0) for e in saves)
    restart_s = statistics.mean(resumes)
    startup_s = max(0.0, g.ref_wall_s - g.useful_s)
    wall = startup_s + g.useful_s * (1 + cost_s / interval_s) + len(faults) * (restart_s + interval_s / 2)
    return Prediction(interval_s, cost_s, restart_s, len(faults), startup_s, g.useful_s / wall)


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
    prediction: Prediction | None = None

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
            return (
                f"final state_sha256 {str(self.state_sha256)[:12]} differs from the "
                f"reference's {str(self.reference_sha256)[:12]}"
            )
        return f"all {len(self.faults)} recoveries succeeded; final state equals the reference"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "reason": self.reason,
            "faults": [f.to_json() for f in self.faults],
            "goodput": self.goodput.to_json() if self.goodput else None,
            "prediction": self.prediction.to_json() if self.prediction else None,
            "state_sha256": self.state_sha256,
            "reference_sha256": self.reference_sha256,
            "state_matches_reference": self.sha_match,
            "final_ok": self.final_ok,
            "final_reason": self.final_reason,
            "notes": self.notes,
            "settings": self.settings,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    def table_rows(self) -> list[list[str]]:
        rows = []
        for f in self.faults:
            rows.append(
                [
                    f.name,
                    "-" if f.at_step is None else str(f.at_step),
                    _fmt_s(f.detect_s),
                    "-" if f.lost_steps is None else str(f.lost_steps),
                    _fmt_s(f.resume_s),
                    "ok" if f.ok else "FAILED",
                    f.reason,
                ]
            )
        return rows

    def to_markdown(self) -> str:
        head = ["fault", "at step", "detect", "work lost (steps)", "resume", "result", "what happened"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in self.table_rows()]
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
            lines.append(
                f"goodput {g.goodput:.3f}: {g.final_step} steps x {g.ref_step_s:.3f} s/step "
                f"(reference, steady state) = {g.useful_s:.1f} s useful in {g.wall_s:.1f} s "
                f"wall; the uninterrupted reference took {g.ref_wall_s:.1f} s "
                f"({g.relative:.2f} of the faulted run's wall time)"
            )
        p = self.prediction
        if g is not None and p is not None:
            off = (g.goodput - p.goodput) / p.goodput if p.goodput > 0 else float("nan")
            lines.append(
                f"the model (Daly's costs, as `ftfleet plan` prices them) predicts {p.goodput:.3f} at this run's: "
                f"interval {p.interval_s:.1f} s, save {p.cost_s:.2f} s, {p.faults} faults of {p.restart_s:.1f} s "
                f"(mean resume) and half an interval each, start-up {p.startup_s:.1f} s; measured {off:+.1%} from it"
            )
        same = "equals" if self.sha_match else "DIFFERS FROM"
        lines.append(
            f"final state_sha256 {str(self.state_sha256)[:16]} {same} the reference's {str(self.reference_sha256)[:16]}"
        )
        return lines


#: How to read the table; printed under it.
LEGEND = (
    "detect: from the fault to the trainer acting on it (notice agreed, group torn down, "
    "watchdog fired, anomaly flagged; for damage done while stopped, the restore's search); "
    "lost: steps computed again; resume: from the fault (for damage done while stopped, the "
    "replacement's launch) to the first step after recovery, start-up and restore included"
)


def _fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}s"
