"""Scheduled: how far the replica bucket is behind the primary, in checkpoints that count.

A checkpoint counts in a bucket when its ``step-N/manifest.json`` is there and every
file the manifest lists is there with its size (contract.manifest_file_sizes): S3
replicates objects independently, so a replica can hold a manifest before the shards.
Published per run (metric dimension ``Stack``):

* ``ReplicationLagSeconds``: 0 when the replica holds the primary's newest complete
  checkpoint; else the age of the oldest committed primary checkpoint newer than the
  replica's newest complete one (how long a checkpoint has waited to be replicated);
* ``ReplicaHasCompleteCheckpoint``: 1 or 0;
* ``NewestDurableCheckpointAgeSeconds``: age of the primary's newest complete checkpoint;
* ``NewestDurableStep`` and ``NewestReplicaStep``.

The stack alarms on the lag above ``replicationLagAlarmSeconds`` and on S3 Replication
Time Control's own metrics. Read-only: it never copies, deletes or repairs objects.
"""

from __future__ import annotations

from typing import Any

from ftfleet.lambdas.common import aws, checkpoints, eventbridge, runtime
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.replication_watch.config import Config

NAME = "replication_watch"
SCAN_LIMIT = checkpoints.SCAN_LIMIT

clock = runtime.Clock()


Bucket = aws.Checkpoints


def handler(event: Any, context: Any) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, event, context)


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    eventbridge.parse(event, (eventbridge.SCHEDULED,))
    now = clock.now()
    primary = Bucket(cfg.bucket, None, cfg.root)
    replica = Bucket(cfg.replica_bucket, cfg.replica_region, cfg.root)
    primary_steps = primary.steps()
    newest = primary.newest_complete(primary_steps)
    replica_newest = replica.newest_complete(replica.steps())
    lag, lower_bound = 0.0, False
    if newest is not None and (replica_newest is None or replica_newest < newest):
        waiting = [s for s in primary_steps if (replica_newest is None or s > replica_newest)]
        committed = [primary.committed_at(s) for s in waiting]
        times = [t for t in committed if t is not None]
        lag = max(0.0, now - min(times)) if times else 0.0
        lower_bound = len(primary_steps) == SCAN_LIMIT and (
            replica_newest is None or primary_steps[-1] > replica_newest
        )
    metrics = [
        ("ReplicationLagSeconds", lag, "Seconds"),
        ("ReplicaHasCompleteCheckpoint", 1.0 if replica_newest is not None else 0.0, "Count"),
    ]
    if newest is not None:
        metrics += [
            ("NewestDurableCheckpointAgeSeconds", max(0.0, now - (primary.committed_at(newest) or now)), "Seconds"),
            ("NewestDurableStep", float(newest), "Count"),
        ]
    if replica_newest is not None:
        metrics.append(("NewestReplicaStep", float(replica_newest), "Count"))
    aws.put_metrics(
        {"MetricName": name, "Dimensions": aws.dims(Stack=cfg.stack), "Value": value, "Unit": unit}
        for name, value, unit in metrics
    )
    return log.decision(
        "measured" if newest is not None else "no-checkpoint",
        primary_newest=newest,
        replica_newest=replica_newest,
        lag_s=round(lag, 1),
        lag_is_lower_bound=lower_bound,
    )


runtime.prime(Config)
