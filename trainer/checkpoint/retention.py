"""Retention applied to the trainer's tiers: which committed checkpoints stay, and
deleting the rest. What a schedule, a pin and a milestone keep is ftfleet/retention.py's
(shared with ``ftfleet ckpt list`` and the retention sweep function).

* The fast tier keeps the newest ``checkpoint.keep`` committed checkpoints, pinned steps
  and its milestones (:func:`prune`): the best of each metric, or every one as marked
  where it is the run's only tier.
* The durable tiers keep what ``checkpoint.retention`` says (:func:`prune_by_schedule`),
  and every milestone as its manifest marks it.
* Both keep every step whose files a manifest in the tier references (incremental
  checkpoints), committed or not, until no manifest names it any more, and every step
  below a manifest that does not read (it may name any of them).

Runs on rank 0 after a commit (local tier) or an upload (object tier). Deletion removes
the manifest first, so a checkpoint stops existing before it loses a file. Failures are
logged and the run goes on: retention must never cost training.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from ftfleet.retention import (  # noqa: F401 - re-exported: the trainer's tiers apply them
    AS_MARKED,
    BELOW_UNREADABLE,
    BEST_ONLY,
    DEFAULT_SCHEDULE,
    NEWEST,
    PINNED,
    REFERENCED,
    UNDATED,
    Milestone,
    Policy,
    Rule,
    keep_reasons,
    milestone_reasons,
    parse_rule,
    parse_schedule,
    referenced,
)

log = logging.getLogger("ftfleet.ckpt")


class Tier(Protocol):
    def committed_steps(self) -> list[int]: ...
    def all_steps(self) -> list[int]: ...
    def remove_step(self, step: int) -> None: ...
    def describe(self) -> str: ...


class DatedTier(Tier, Protocol):
    def read_manifest(self, step: int) -> object | None: ...


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


def _remove(tier: Tier, victims: Iterable[int], guard: Callable[[], str | None] | None = None) -> list[int]:
    """Delete ``victims`` from ``tier``, each on its own (a failure is logged, the rest go
    on); returns the steps deleted. ``guard``: asked before each step, why deleting must
    stop now (the run lease was lost), or None."""
    deleted = []
    for step in sorted(set(victims)):
        stop = guard() if guard is not None else None
        if stop is not None:
            log.warning("retention of %s stopped: %s", tier.describe(), stop)
            break
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
        manifests = {step: _manifest(tier, step, quiet=True) for step in committed}
        marked = milestone_reasons({s: getattr(m, "milestone", None) for s, m in manifests.items()}, milestones)
        every = tier.all_steps()
        needed = _referenced(manifests, every)
        victims = steps_to_delete(committed, keep, [*pinned, *marked, *needed], protected)
        victims += debris(every, committed, [*protected, *needed])
    except Exception as exc:  # noqa: BLE001 - retention logs and keeps going
        log.warning("retention: cannot list %s: %s", tier.describe(), exc)
        return []
    return _remove(tier, victims)


def prune_by_schedule(
    tier: DatedTier,
    rules: Sequence[Rule],
    pinned: Iterable[int] = (),
    protected: Iterable[int] = (),
    guard: Callable[[], str | None] | None = None,
    writer: Tier | None = None,
) -> list[int]:
    """Apply ``rules`` (:func:`keep_reasons`) to ``tier``, whose manifests date its
    checkpoints, and remove leftovers of crashed saves (:func:`debris`); returns the steps
    deleted. ``protected`` steps (being uploaded, or just restored) are never deleted;
    ``guard`` is asked before each step is deleted (:func:`_remove`); ``writer``: the view
    of ``tier`` that deletes (the uploader's bounded one), where reading should retry."""
    try:
        committed = tier.committed_steps()
        manifests = {step: _manifest(tier, step) for step in committed}
        created = {step: _created_at(m) for step, m in manifests.items()}
        marked = milestone_reasons({s: getattr(m, "milestone", None) for s, m in manifests.items()})
        kept = keep_reasons(created, rules, pinned, marked)
        every = tier.all_steps()
        needed = _referenced(manifests, every)
        keep = set(kept) | set(protected) | set(needed)
        victims = [s for s in committed if s not in keep]
        victims += debris(every, committed, [*protected, *needed])
    except Exception as exc:  # noqa: BLE001 - retention logs and keeps going
        log.warning("retention: cannot list %s: %s", tier.describe(), exc)
        return []
    return _remove(writer or tier, victims, guard)


def _manifest(tier: DatedTier, step: int, quiet: bool = False) -> object | None:
    """The manifest, or None (logged unless ``quiet``) when it cannot be read: the
    schedule then keeps its checkpoint (undated), never guessing; the fast tier's count
    does not need it (the loaders refuse such a checkpoint anyway)."""
    try:
        return tier.read_manifest(step)
    except Exception as exc:  # noqa: BLE001 - an unreadable manifest keeps its checkpoint
        if not quiet:
            log.warning("retention: step-%d of %s kept: its manifest does not read (%s)", step, tier.describe(), exc)
        return None


def _referenced(manifests: dict[int, object | None], steps: Iterable[int]) -> dict[int, str]:
    """:func:`ftfleet.retention.referenced` of the tier's ``manifests`` (None: does not
    read) over its ``steps``."""
    return referenced({s: None if m is None else getattr(m, "references", {}) for s, m in manifests.items()}, steps)


def _created_at(manifest: object | None) -> float | None:
    created = getattr(manifest, "created_at", None)
    return float(created) if isinstance(created, int | float) else None
