"""The fleet's observed interruption rate as the checkpoint interval's MTBF prior.

The remediation functions keep ``contract.INTERRUPTION_PRIOR_KEY`` up to date next to
the run's checkpoints on the durable tier. At start the trainer reads it (the durable
tier's store; without one, the same key on the fast tier, where an FSx association
imports it) and, when it knows two job interruptions or more, uses its mean time
between them as ``resilience.interval.mtbf_s``. Anything else (no durable tier, no
file, a malformed one, too few interruptions, an unreachable bucket) is one log line
and the configured prior stays.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftfleet.contract import INTERRUPTION_PRIOR_KEY, ContractError, parse_interruption_prior
from ftfleet.trainer.resilience.interval.adaptive import IntervalConfig

if TYPE_CHECKING:
    from ftfleet.trainer.checkpoint.tiers.base import ObjectStore

log = logging.getLogger("ftfleet.prior")


#: Seconds a prior read by this process is used again instead of read again (0: read at
#: every start). The in-process worker sets it (:func:`reuse_reads`): its restarts are
#: new starts of the same process, seconds apart, and the read is on their critical
#: path.
_reuse_s = 0.0
_reads: dict[str, tuple[float, bytes | None]] = {}


def reuse_reads(seconds: float) -> None:
    """Use a prior read in the last ``seconds`` again (0: never)."""
    global _reuse_s
    _reuse_s = seconds
    _reads.clear()


def _read(store: ObjectStore | None, fast_root: Path | None) -> tuple[bytes | None, str]:
    """:func:`read_prior_bytes`, or this process's read of the same place less than
    ``_reuse_s`` ago. "No prior there" is kept too (a prior published since is seen
    after ``_reuse_s``); a read that failed is not."""
    if _reuse_s <= 0:
        return read_prior_bytes(store, fast_root)
    key = f"{store.uri}/{INTERRUPTION_PRIOR_KEY}" if store is not None else str(fast_root)
    hit = _reads.get(key)
    if hit is not None and time.monotonic() - hit[0] < _reuse_s:
        return hit[1], f"{key} (read {time.monotonic() - hit[0]:.0f}s ago by this process)"
    data, where = read_prior_bytes(store, fast_root)
    _reads[key] = (time.monotonic(), data)
    return data, where


def read_prior_bytes(store: ObjectStore | None, fast_root: Path | None) -> tuple[bytes | None, str]:
    """The prior's bytes and where they were looked for (None: not there)."""
    if store is not None:
        return store.get_bytes(INTERRUPTION_PRIOR_KEY), f"{store.uri}/{INTERRUPTION_PRIOR_KEY}"
    if fast_root is None:
        return None, "(no durable tier, no fast tier)"
    path = Path(fast_root) / INTERRUPTION_PRIOR_KEY
    return (path.read_bytes() if path.is_file() else None), str(path)


def with_fleet_prior(
    cfg: IntervalConfig, store: ObjectStore | None, fast_root: Path | None, *, now: float | None = None
) -> IntervalConfig:
    """``cfg`` with ``mtbf_s`` from the fleet's interruption prior, or ``cfg`` itself."""
    where = INTERRUPTION_PRIOR_KEY
    try:
        data, where = _read(store, fast_root)
        if data is None:
            log.debug("interruption prior: none at %s; MTBF prior stays %.0fs (configured)", where, cfg.mtbf_s)
            return cfg
        prior = parse_interruption_prior(data)
        mtbf = prior.mtbf_s(time.time() if now is None else now)
    except ContractError as exc:
        log.warning("interruption prior at %s ignored: %s; MTBF prior stays %.0fs (configured)", where, exc, cfg.mtbf_s)
        return cfg
    except Exception as exc:  # noqa: BLE001 - a prior is an optimisation; the run goes on without it
        log.warning(
            "interruption prior at %s unreadable (%s: %s); MTBF prior stays %.0fs (configured)",
            where,
            type(exc).__name__,
            exc,
            cfg.mtbf_s,
        )
        return cfg
    if mtbf is None or not mtbf > 0:
        log.info(
            "interruption prior: fewer than two job interruptions at %s; MTBF prior stays %.0fs (configured)",
            where,
            cfg.mtbf_s,
        )
        return cfg
    log.info("interruption prior: MTBF prior %.0fs from the fleet's interruptions (%s)", mtbf, where)
    return dataclasses.replace(cfg, mtbf_s=mtbf)


def prior_for(cfg: IntervalConfig, ckpt: Any) -> IntervalConfig:
    """:func:`with_fleet_prior` for a CheckpointManager (its primary store, its fast tier)."""
    local = getattr(ckpt, "local", None)
    return with_fleet_prior(cfg, ckpt.stores.get("primary"), getattr(local, "root", None))
