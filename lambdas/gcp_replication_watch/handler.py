"""Scheduled: how long the newest committed checkpoint may be missing from a region.

Cloud Scheduler publishes to the function's topic every five minutes. The function
finds the newest complete checkpoint of the run in the bucket (its manifest and every
file it lists, lambdas/common/checkpoints.py). A dual-region bucket exposes no
per-object replication state, so without a second bucket the function knows only a
bound: an object older than the bucket's recovery point objective (turbo replication:
15 minutes; default replication: 12 hours, Google's documented targets) is in both
regions; a newer one may not be yet (``replication_unconfirmed_seconds``, its age, a
bound that never exceeds the RPO and is never alarmed on). Late replication of a
dual-region shows in Cloud Storage's own metrics, which the stack's alert policy
watches. With a second bucket (``FTFLEET_REPLICA_BUCKET``) the comparison is real:
``replication_lag_seconds`` is the age of the oldest committed checkpoint newer than
the second bucket's newest complete one, and the alert policy fires on it too. Every
run writes ``replica_has_complete_checkpoint`` (the stack alerts when it stops
arriving) and, once a checkpoint exists, ``newest_durable_checkpoint_age_seconds``;
labels stack and run (config.METRICS). Read-only: it never copies, deletes or repairs
objects.
"""

from __future__ import annotations

from typing import Any

from ftfleet.lambdas.common import gcp, runtime
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.gcp_replication_watch.config import IN_REPLICA, LAG, NEWEST_AGE, UNCONFIRMED, Config

NAME = "gcp_replication_watch"
#: Google's replication targets ("Data availability and durability", turbo replication).
RPO_S = {"ASYNC_TURBO": 15 * 60.0, "DEFAULT": 12 * 3600.0}

clock = runtime.Clock()


def handler(cloud_event: Any, context: Any = None) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, cloud_event, context)


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    gcp.message(event)  # any tick will do; a malformed message is still dropped
    if cfg.rpo not in RPO_S:
        raise ValueError(f"FTFLEET_BUCKET_RPO is {cfg.rpo!r}; use ASYNC_TURBO or DEFAULT")
    now = clock.now()
    primary = gcp.Checkpoints(cfg.bucket, cfg.root)
    steps = primary.steps()
    newest = primary.newest_complete(steps)
    newest_at = primary.committed_at(newest) if newest is not None else None
    replica_newest = None
    if cfg.replica_bucket:
        replica = gcp.Checkpoints(cfg.replica_bucket, cfg.root)
        replica_newest = replica.newest_complete(replica.steps())
        waiting = [s for s in steps if replica_newest is None or s > replica_newest]
        times = [t for t in (primary.committed_at(s) for s in waiting) if t is not None]
        lag = max(0.0, now - min(times)) if newest is not None and times else 0.0
        bound = False
        in_replica = replica_newest is not None
    else:
        age = max(0.0, now - newest_at) if newest_at is not None else 0.0
        lag = 0.0 if age >= RPO_S[cfg.rpo] else age
        bound = True
        in_replica = newest is not None and age >= RPO_S[cfg.rpo]
    labels = {"stack": cfg.stack, "run": cfg.run_id}
    points = [(LAG if not bound else UNCONFIRMED, lag, labels), (IN_REPLICA, 1.0 if in_replica else 0.0, labels)]
    if newest_at is not None:
        points.append((NEWEST_AGE, max(0.0, now - newest_at), labels))
    gcp.write_metrics(cfg.project, points)
    return log.decision(
        "measured" if newest is not None else "no-checkpoint",
        newest=newest,
        replica_newest=replica_newest,
        lag_s=round(lag, 1),
        lag_is_bound=bound,
        rpo=cfg.rpo,
        over_alarm=not bound and lag > cfg.lag_alarm_s,
    )


runtime.prime(Config)
