"""Retention: which committed checkpoints of a tier are kept, and deleting the rest.

* The fast tier keeps the newest ``checkpoint.keep`` committed checkpoints plus any
  pinned step (:func:`prune`).
* The durable tiers keep what a schedule says (:func:`prune_by_schedule`,
  ``checkpoint.retention``): rules of the form ``<every> for <window>``, e.g. the
  default ``all for 6h``, ``1d for 7d``, ``1w for 13w``: every checkpoint of the last six
  hours, the newest of each day of the last week, the newest of each week of the last
  thirteen weeks. Time slots are aligned to the epoch (UTC days; weeks that start on
  Thursdays, the epoch's first weekday), a checkpoint's time is its manifest's
  ``created_at``, and a window ends at the newest checkpoint's time, not at the
  clock's: a run that stopped a month ago
  keeps its last weeks as they were. Beyond any rule: the newest committed checkpoint
  and every pinned step are always kept, and a checkpoint whose time cannot be read is
  kept (and logged), never guessed at.
* Milestones (:func:`milestone_reasons`), the checkpoints saved as the best evaluation of
  their run (trainer/validation.py), are kept beyond both policies by what their
  manifests say: the best of each metric always; the others, marked ``keep: all``, by
  the durable tiers for good. Nothing outside the tier is consulted, so a sweep of a
  bucket whose run is gone keeps the same set.

Runs on rank 0 after a commit (local tier) or an upload (object tier). Deletion removes
the manifest first, so a checkpoint stops existing before it loses a file. Failures are
logged and the run goes on: retention must never cost training.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from ftfleet.errors import ConfigError
from ftfleet.trainer.checkpoint.manifest import Milestone

log = logging.getLogger("ftfleet.ckpt")


class Tier(Protocol):
    def committed_steps(self) -> list[int]: ...
    def all_steps(self) -> list[int]: ...
    def remove_step(self, step: int) -> None: ...
    def describe(self) -> str: ...


class DatedTier(Tier, Protocol):
    def read_manifest(self, step: int) -> object | None: ...


#: ``checkpoint.retention``'s default for the durable tiers.
DEFAULT_SCHEDULE = ("all for 6h", "1d for 7d", "1w for 13w")
#: Why a checkpoint is kept beyond the rules.
NEWEST, PINNED, UNDATED = "newest", "pinned", "undated"
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


def steps_to_delete(
    committed: Iterable[int], keep: int, pinned: Iterable[int] = (), protected: Iterable[int] = ()
) -> list[int]:
    committed = sorted(set(committed))
    keep_set = set(committed[-keep:]) | set(pinned) | set(protected)
    return [s for s in committed if s not in keep_set]


def debris(all_steps: Iterable[int], committed: Iterable[int], protected: Iterable[int] = ()) -> list[int]:
    """Uncommitted steps older than the newest committed one: leftovers of crashed saves
    or uploads. Newer uncommitted steps may be in flight and are left alone."""
    committed = set(committed)
    newest = max(committed, default=-1)
    skip = committed | set(protected)
    return [s for s in sorted(set(all_steps)) if s < newest and s not in skip]


def _remove(tier: Tier, victims: Iterable[int]) -> list[int]:
    """Delete ``victims`` from ``tier``, each on its own (a failure is logged, the rest go
    on); returns the steps deleted."""
    deleted = []
    for step in sorted(set(victims)):
        try:
            tier.remove_step(step)
            deleted.append(step)
        except Exception as exc:  # noqa: BLE001 - retention logs and keeps going
            log.warning("retention: cannot delete step-%d from %s: %s", step, tier.describe(), exc)
    if deleted:
        log.info("retention: deleted %s from %s", ", ".join(f"step-{s}" for s in deleted), tier.describe())
    return deleted


def prune(
    tier: DatedTier,
    keep: int,
    pinned: Iterable[int] = (),
    protected: Iterable[int] = (),
    milestones: str = BEST_ONLY,
) -> list[int]:
    """Apply the policy to ``tier``: the newest ``keep``, ``pinned``, ``protected`` and its
    milestones (``milestones``: :data:`BEST_ONLY`, or :data:`AS_MARKED` where the tier is
    the run's only one); returns the steps deleted."""
    try:
        committed = tier.committed_steps()
        marked = milestone_reasons({s: _milestone(tier, s) for s in committed}, milestones)
        victims = steps_to_delete(committed, keep, [*pinned, *marked], protected)
        victims += debris(tier.all_steps(), committed, protected)
    except Exception as exc:  # noqa: BLE001 - retention logs and keeps going
        log.warning("retention: cannot list %s: %s", tier.describe(), exc)
        return []
    return _remove(tier, victims)


def prune_by_schedule(
    tier: DatedTier, rules: Sequence[Rule], pinned: Iterable[int] = (), protected: Iterable[int] = ()
) -> list[int]:
    """Apply ``rules`` (:func:`keep_reasons`) to ``tier``, whose manifests date its
    checkpoints, and remove leftovers of crashed saves (:func:`debris`); returns the steps
    deleted. ``protected`` steps (being uploaded, or just restored) are never deleted."""
    try:
        committed = tier.committed_steps()
        manifests = {step: _manifest(tier, step) for step in committed}
        created = {step: _created_at(m) for step, m in manifests.items()}
        marked = milestone_reasons({s: getattr(m, "milestone", None) for s, m in manifests.items()})
        kept = keep_reasons(created, rules, pinned, marked)
        keep = set(kept) | set(protected)
        victims = [s for s in committed if s not in keep]
        victims += debris(tier.all_steps(), committed, protected)
    except Exception as exc:  # noqa: BLE001 - retention logs and keeps going
        log.warning("retention: cannot list %s: %s", tier.describe(), exc)
        return []
    return _remove(tier, victims)


def _manifest(tier: DatedTier, step: int) -> object | None:
    """The manifest, or None (logged) when it cannot be read: its checkpoint is then kept
    by the schedule (undated), never guessed at."""
    try:
        return tier.read_manifest(step)
    except Exception as exc:  # noqa: BLE001 - an unreadable manifest keeps its checkpoint
        log.warning("retention: step-%d of %s kept: its manifest does not read (%s)", step, tier.describe(), exc)
        return None


def _created_at(manifest: object | None) -> float | None:
    created = getattr(manifest, "created_at", None)
    return float(created) if isinstance(created, int | float) else None


def _milestone(tier: DatedTier, step: int) -> Milestone | None:
    """The fast tier's view: a manifest that does not read marks no milestone (the
    newest ``keep`` are kept regardless)."""
    try:
        return getattr(tier.read_manifest(step), "milestone", None)
    except Exception:  # noqa: BLE001 - the loaders refuse such a checkpoint anyway
        return None
