"""The drill's plan: which faults, at which steps, on which node.

A faulted run is a sequence of **segments**, one per node (a torchrun invocation):

* injected while a node trains, at a step: a spot interruption ``notice`` (the node
  commits an emergency checkpoint and exits 75; the segment ends and a replacement
  node takes over), a ``rebalance`` recommendation (an early checkpoint, the run goes
  on), a ``sigkill`` of one worker (torchrun restarts the group in place);
* configured in the trainer, at a step: a ``nan`` batch (``faults.nan_at_steps``) and a
  ``hang`` (``faults.hang_at_step`` with a short watchdog; torchrun restarts the group);
* applied while the run is stopped (the segment before stops cleanly at a step with
  ``train.stop_at_step``): a ``corrupt``-ed newest checkpoint and a ``bucket_loss`` (the
  primary bucket and the local fast tier are gone: a new node in the other region).

Faults are ``spacing`` steps apart, in the order of :data:`FAULTS`, the first at
``first_step``; the run ends ``spacing`` steps after the last.
"""

from __future__ import annotations

import dataclasses
import itertools

from drill.faults import KINDS
from ftfleet.errors import UserError

#: Every fault, in the order the drill injects them.
FAULTS: tuple[str, ...] = tuple(KINDS)
IN_RUN = ("notice", "rebalance", "sigkill")
CONFIGURED = ("nan", "hang")
WHILE_STOPPED = ("corrupt", "bucket_loss")


@dataclasses.dataclass
class SegmentPlan:
    """One node's life."""

    index: int
    triggers: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    """(fault, step): injected by the drill once the run reaches the step."""
    stop_at_step: int | None = None
    """The node stops cleanly here (train.stop_at_step) for a fault applied while stopped."""
    before: list[str] = dataclasses.field(default_factory=list)
    """Faults applied before this node starts."""

    @property
    def node(self) -> str:
        return f"node-{self.index}"

    @property
    def ends_with_notice(self) -> bool:
        return any(kind == "notice" for kind, _ in self.triggers)


@dataclasses.dataclass
class Plan:
    faults: list[str]
    steps: int
    segments: list[SegmentPlan]
    nan_step: int | None = None
    hang_step: int | None = None

    def step_of(self, kind: str) -> int | None:
        if kind == "nan":
            return self.nan_step
        if kind == "hang":
            return self.hang_step
        for seg in self.segments:
            for k, step in seg.triggers:
                if k == kind:
                    return step
        for prev, seg in itertools.pairwise(self.segments):
            if kind in seg.before:
                return prev.stop_at_step
        return None

    def describe(self, names: dict[str, str] = KINDS) -> list[str]:
        """One line per fault; ``names``: how the report names the kinds (the cloud's)."""
        return [f"{names[kind]} at step {self.step_of(kind)}" for kind in self.faults]


def parse_faults(text: str) -> list[str]:
    """``all`` or a comma-separated subset of :data:`FAULTS` (put in drill order)."""
    if text.strip() in ("", "all"):
        return list(FAULTS)
    wanted = [t.strip().replace("-", "_") for t in text.split(",") if t.strip()]
    unknown = [w for w in wanted if w not in FAULTS]
    if unknown:
        raise UserError(
            f"--faults: unknown fault {', '.join(unknown)}; use all or a comma-separated list of {', '.join(FAULTS)}"
        )
    return [f for f in FAULTS if f in wanted]


def build_plan(faults: list[str], *, first_step: int = 20, spacing: int = 20) -> Plan:
    if not faults:
        raise UserError("--faults: choose at least one fault")
    if first_step < 2 or spacing < 2:
        raise UserError(
            "the first fault and the spacing must be at least 2 steps, so that a checkpoint precedes each fault"
        )
    segments = [SegmentPlan(1)]
    plan = Plan(list(faults), 0, segments)
    step = first_step
    for kind in FAULTS:
        if kind not in faults:
            continue
        current = segments[-1]
        if kind in IN_RUN:
            current.triggers.append((kind, step))
            if kind == "notice":
                segments.append(SegmentPlan(len(segments) + 1))
        elif kind == "nan":
            plan.nan_step = step
        elif kind == "hang":
            plan.hang_step = step
        else:
            current.stop_at_step = step
            segments.append(SegmentPlan(len(segments) + 1, before=[kind]))
        step += spacing
    plan.steps = step
    return plan
