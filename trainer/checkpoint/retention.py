"""Retention: keep the newest K committed checkpoints of a tier plus any pinned step.

Runs on rank 0 after a commit (local tier) or an upload (object tier). Deletion removes
the manifest first, so a checkpoint stops existing before it loses a file. Failures are
logged and the run goes on: retention must never cost training.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

log = logging.getLogger("ftfleet.ckpt")


class Tier(Protocol):
    def committed_steps(self) -> list[int]: ...
    def all_steps(self) -> list[int]: ...
    def remove_step(self, step: int) -> None: ...
    def describe(self) -> str: ...


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


def prune(tier: Tier, keep: int, pinned: Iterable[int] = (), protected: Iterable[int] = ()) -> list[int]:
    """Apply the policy to ``tier``; returns the steps deleted."""
    deleted = []
    try:
        committed = tier.committed_steps()
        victims = steps_to_delete(committed, keep, pinned, protected)
        victims += debris(tier.all_steps(), committed, protected)
    except Exception as exc:  # noqa: BLE001 - retention logs and keeps going
        log.warning("retention: cannot list %s: %s", tier.describe(), exc)
        return deleted
    for step in sorted(set(victims)):
        try:
            tier.remove_step(step)
            deleted.append(step)
        except Exception as exc:  # noqa: BLE001
            log.warning("retention: cannot delete step-%d from %s: %s", step, tier.describe(), exc)
    if deleted:
        log.info("retention: deleted %s from %s", ", ".join(f"step-{s}" for s in deleted), tier.describe())
    return deleted
