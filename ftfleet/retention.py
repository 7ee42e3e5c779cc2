"""What a checkpoint tier keeps: the retention schedule, the milestones, and the policy a
manifest records. Shared by the trainer (trainer/checkpoint/retention.py, which applies
it to its tiers), ``ftfleet ckpt list`` and the retention sweep function
(lambdas/retention_sweep), so every one of them keeps the same set; the standard
library only (a Lambda package carries it).

* A schedule is rules ``<every> for <window>`` (units m, h, d, w), e.g. the default
  ``all for 6h``, ``1d for 7d``, ``1w for 13w``: every checkpoint of the last six hours,
  the newest of each day of the last week, the newest of each week of the last thirteen
  weeks. Slots are aligned to the epoch (UTC days; weeks that start on Thursdays, the
  epoch's first weekday), a checkpoint's time is its manifest's ``created_at``, and a
  window ends at the newest checkpoint's time, not at the clock's: a run that stopped a
  month ago keeps its last weeks as they were.
* Beyond the rules: the newest committed checkpoint and every pinned step are kept, and
  a checkpoint whose time cannot be read is kept, never guessed at.
* Milestones (:func:`milestone_reasons`), checkpoints saved as the best evaluation of
  their run, are kept by what their manifests say: the best of each metric always, the
  others marked ``keep: all`` by the durable tiers for good.
* A checkpoint another one references (an incremental checkpoint's unchanged tensors
  live in its files) is kept while any manifest in the tier names it, committed or not:
  a sweep deletes the referencing checkpoint first (manifest first), the referenced one
  in a later sweep, so no crash between deletions leaves a manifest naming a file that
  is gone. A manifest that does not read may name any earlier step: every earlier step
  stays while it is there (:func:`referenced`).
* A manifest records the :class:`Policy` of the run that wrote it (its rules and pinned
  steps), so a sweep of a bucket applies the run's own schedule, also for a run that is
  gone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence

from ftfleet.errors import ConfigError

#: ``checkpoint.retention``'s default for the durable tiers.
DEFAULT_SCHEDULE = ("all for 6h", "1d for 7d", "1w for 13w")
#: Why a checkpoint is kept beyond the rules.
NEWEST, PINNED, UNDATED, REFERENCED = "newest", "pinned", "undated", "referenced"
#: Why a step below a manifest that does not read is kept (it may reference the step).
BELOW_UNREADABLE = "below an unreadable manifest"
#: Which milestones a tier keeps: each as its manifest says, or only the best of each metric.
AS_MARKED, BEST_ONLY = "as marked", "best only"

_UNITS = {"m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_RULE = re.compile(r"^\s*(all|\d+[mhdw])\s+for\s+(\d+[mhdw])\s*$")


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """Keep, of the checkpoints in the last ``window_s`` seconds, every one (``every_s``
    None) or the newest of each ``every_s``-second slot."""

    text: str
    every_s: float | None
    window_s: float


def parse_rule(text: str, key: str = "checkpoint.retention") -> Rule:
    """``all for 6h``, ``1d for 7d``, ``1w for 13w`` (units m, h, d, w); ConfigError otherwise."""
    match = _RULE.match(text) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(
            f"{key}: {text!r} is not a rule; use '<all|N><m|h|d|w> for N<m|h|d|w>', e.g. 'all for 6h' or '1d for 7d'"
        )
    every, window = match.groups()
    every_s = None if every == "all" else _seconds(every)
    window_s = _seconds(window)
    if every_s == 0 or window_s == 0:
        raise ConfigError(f"{key}: {text!r} has a zero duration; use a count of at least 1")
    return Rule(" ".join(text.split()), every_s, window_s)


def parse_schedule(texts: Sequence[str], key: str = "checkpoint.retention") -> tuple[Rule, ...]:
    return tuple(parse_rule(t, f"{key}[{i}]") for i, t in enumerate(texts))


def _seconds(text: str) -> float:
    return int(text[:-1]) * _UNITS[text[-1]]


@dataclasses.dataclass(frozen=True, slots=True)
class Milestone:
    """A checkpoint that was the best of its run by ``metric`` when it was saved."""

    metric: str
    mode: str
    """``min`` or ``max``: which way is better."""
    value: float
    keep: str
    """``best``: kept until a better milestone of the same metric exists in the tier;
    ``all``: kept for good."""

    def better_than(self, other: Milestone) -> bool:
        return self.value < other.value if self.mode == "min" else self.value > other.value

    def describe(self) -> str:
        return f"milestone ({self.metric} {self.value:.6g})"

    @classmethod
    def from_json(cls, data: object) -> Milestone:
        if not isinstance(data, dict):
            raise ValueError(f"milestone is {type(data).__name__}, not an object")
        metric, mode, value, keep = (data.get(k) for k in ("metric", "mode", "value", "keep"))
        if not isinstance(metric, str) or not metric or mode not in ("min", "max") or keep not in ("best", "all"):
            raise ValueError(f"bad milestone {data!r}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"milestone value {value!r}")
        return cls(metric, mode, float(value), keep)


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """A run's retention policy for its durable tiers, as its manifests record it."""

    rules: tuple[str, ...] = DEFAULT_SCHEDULE
    pinned: tuple[int, ...] = ()

    def schedule(self) -> tuple[Rule, ...]:
        return parse_schedule(self.rules)

    def to_json(self) -> dict[str, list]:
        return {"rules": list(self.rules), "pinned": sorted(self.pinned)}

    @classmethod
    def from_json(cls, data: object) -> Policy:
        """ValueError (naming what is wrong) for anything but rules that parse and
        pinned steps that are integers >= 0."""
        if not isinstance(data, dict):
            raise ValueError(f"retention is {type(data).__name__}, not an object")
        rules, pinned = data.get("rules"), data.get("pinned", [])
        if not isinstance(rules, list) or not isinstance(pinned, list):
            raise ValueError(f"retention: rules and pinned must be lists: {str(data)[:200]}")
        if any(isinstance(p, bool) or not isinstance(p, int) or p < 0 for p in pinned):
            raise ValueError(f"retention: pinned steps must be integers >= 0: {pinned[:10]}")
        try:
            parse_schedule(rules, key="retention.rules")
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return cls(tuple(rules), tuple(pinned))


def milestone_reasons(milestones: Mapping[int, Milestone | None], keep: str = AS_MARKED) -> dict[int, str]:
    """step -> why it is kept, for the milestones among ``milestones`` (step -> the
    manifest's milestone, or None) that are kept: of each metric (name and direction) the
    best (ties: the newest), and with ``keep`` :data:`AS_MARKED` every one marked
    ``keep: all``."""
    best: dict[tuple[str, str], int] = {}
    kept: set[int] = set()
    for step in sorted(s for s, m in milestones.items() if m is not None):
        mark = milestones[step]
        group = (mark.metric, mark.mode)
        if group not in best or not milestones[best[group]].better_than(mark):
            best[group] = step
        if keep == AS_MARKED and mark.keep == "all":
            kept.add(step)
    kept.update(best.values())
    return {step: milestones[step].describe() for step in sorted(kept)}


def keep_reasons(
    created: Mapping[int, float | None],
    rules: Sequence[Rule],
    pinned: Iterable[int] = (),
    milestones: Mapping[int, str] | None = None,
) -> dict[int, str]:
    """step -> why it is kept, for the committed checkpoints ``created`` (step -> commit
    time, None where unknown); a step absent from the result is not kept. The first reason
    that applies is given: a milestone (``milestones``: step -> reason,
    :func:`milestone_reasons`), newest, pinned, undated, then the rules in order."""
    reasons: dict[int, str] = {}
    if not created:
        return reasons
    for step, why in (milestones or {}).items():
        if step in created:
            reasons[step] = why
    reasons.setdefault(max(created), NEWEST)
    for step in pinned:
        if step in created:
            reasons.setdefault(step, PINNED)
    dated = {s: t for s, t in created.items() if t is not None and math.isfinite(t)}
    for step in created.keys() - dated.keys():
        reasons.setdefault(step, UNDATED)
    if not dated:
        return reasons
    end = max(dated.values())  # windows end at the newest checkpoint, not at the clock
    for rule in rules:
        inside = {s: t for s, t in dated.items() if t > end - rule.window_s}
        if rule.every_s is None:
            chosen = set(inside)
        else:
            best: dict[int, tuple[float, int]] = {}
            for s, t in inside.items():
                slot = math.floor(t / rule.every_s)
                if slot not in best or (t, s) > best[slot]:
                    best[slot] = (t, s)
            chosen = {s for _, s in best.values()}
        for step in sorted(chosen):
            reasons.setdefault(step, rule.text)
    return reasons


# --- a sweep of a bucket ---------------------------------------------------------------

#: An uncommitted step directory (objects without a manifest) older than the newest
#: committed checkpoint is debris of a crashed save or upload once its newest object is
#: this old; younger, it may still be arriving (an export, a replication, an upload).
DEBRIS_AGE_S = 86400.0


#: A manifest dated further ahead of the sweep's clock than this is kept as undated.
FUTURE_S = 3600.0


@dataclasses.dataclass(frozen=True, slots=True)
class Recorded:
    """What retention reads in a manifest: when it was committed, whether it is a
    milestone, the writer's policy (None in a manifest written without one), and the
    earlier steps whose files it references."""

    created_at: float
    milestone: Milestone | None = None
    policy: Policy | None = None
    references: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: bytes | str) -> Recorded:
        """ValueError for a manifest that is not JSON, has no finite ``created_at``, or
        has a malformed milestone or policy."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"not valid JSON ({type(exc).__name__})") from None
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        created = data.get("created_at")
        if isinstance(created, bool) or not isinstance(created, int | float) or not math.isfinite(created):
            raise ValueError(f"created_at {created!r}")
        milestone = Milestone.from_json(data["milestone"]) if data.get("milestone") is not None else None
        policy = Policy.from_json(data["retention"]) if data.get("retention") is not None else None
        listed = data.get("references") or {}
        if not isinstance(listed, dict) or not all(isinstance(k, str) and k.isascii() and k.isdigit() for k in listed):
            raise ValueError(f"references {str(listed)[:100]!r}")
        return cls(float(created), milestone, policy, frozenset(int(k) for k in listed))


def referenced(references: Mapping[int, Iterable[int] | None], steps: Iterable[int] = ()) -> dict[int, str]:
    """step -> why it is referenced, of ``steps`` (every step of the tier, committed or
    not) and those ``references`` names: each committed step -> the steps its manifest
    references, or None where it does not read, which may reference any earlier step."""
    out: dict[int, str] = {}
    every = sorted({*steps, *references})
    for owner, named in sorted(references.items()):
        if named is None:
            out.update({s: BELOW_UNREADABLE for s in every if s < owner and s not in out})
        else:
            out.update({s: REFERENCED for s in named if s not in out})
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class SweepPlan:
    kept: dict[int, str]
    """step -> why it stays, for every committed step kept."""
    delete: list[int]
    """Committed steps to delete (manifest first), oldest first."""
    debris: list[int]
    """Uncommitted step directories to delete."""
    policy: Policy
    """The policy applied: the newest readable manifest's, else the fallback."""


def plan_sweep(
    recorded: Mapping[int, Recorded | None],
    complete: Iterable[int],
    uncommitted: Mapping[int, float],
    now: float,
    fallback: Policy = Policy(),
) -> SweepPlan:
    """What a sweep of a bucket deletes. ``recorded``: each step with a manifest -> what
    it records, or None when it does not read (kept: undated); ``complete``: the steps
    whose every listed file is there; ``uncommitted``: each step directory without a
    manifest -> the time of its newest object. A manifest dated more than
    :data:`FUTURE_S` ahead of ``now`` counts as undated. Kept: everything
    :func:`keep_reasons` keeps under the newest readable manifest's policy (``fallback`` where none records
    one), with the milestones as marked, the newest complete checkpoint (the newest
    committed one may still be missing files where a bucket receives objects one by one),
    and every step a readable manifest references (:func:`referenced`), which is no debris
    either."""
    readable = {s: r for s, r in recorded.items() if r is not None}
    with_policy = [s for s in sorted(readable) if readable[s].policy is not None]
    policy = readable[with_policy[-1]].policy if with_policy else fallback
    # A time ahead of the clock (a skewed writer) would move every window past the rest.
    created = {
        s: (r.created_at if r is not None and r.created_at <= now + FUTURE_S else None) for s, r in recorded.items()
    }
    marks = milestone_reasons({s: r.milestone for s, r in readable.items()})
    kept = keep_reasons(created, policy.schedule(), policy.pinned, marks)
    newest_complete = max((s for s in complete if s in recorded), default=None)
    if newest_complete is not None:
        kept.setdefault(newest_complete, NEWEST)
    needed = referenced({s: None if r is None else r.references for s, r in recorded.items()}, uncommitted)
    for step in sorted(needed.keys() & recorded.keys()):
        kept.setdefault(step, needed[step])
    newest = max(recorded, default=-1)
    debris = sorted(s for s, t in uncommitted.items() if s < newest and now - t >= DEBRIS_AGE_S and s not in needed)
    return SweepPlan(kept, sorted(s for s in recorded if s not in kept), debris, policy)
