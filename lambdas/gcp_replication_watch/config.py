from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import SECONDS, TEXT, StackConfig, var
from ftfleet.lambdas.common.gcp import Metric

LABELS = ("stack", "run")
#: Measured: the age of the oldest committed checkpoint the second bucket still lacks.
#: Written only with FTFLEET_REPLICA_BUCKET, the one case where the function can see
#: replication; the stack alerts on it above replicationLagAlarmSeconds.
LAG = Metric(
    "replication_lag_seconds",
    "s",
    LABELS,
    "Age of the oldest committed checkpoint missing from the second bucket (measured)",
)
#: A bound, never an alarm: the newest checkpoint's age while it is younger than the
#: bucket's RPO target (it may not be in the second region yet), then 0. By
#: construction it never exceeds the RPO, so it cannot tell late replication from
#: normal replication; Cloud Storage's own replication metrics do (the alert policy).
UNCONFIRMED = Metric(
    "replication_unconfirmed_seconds",
    "s",
    LABELS,
    "Age of the newest committed checkpoint while younger than the bucket's RPO target, else 0 (a bound)",
)
IN_REPLICA = Metric(
    "replica_has_complete_checkpoint",
    "1",
    LABELS,
    "1 when a complete checkpoint is known to be in both regions; written at every run of the watch",
)
NEWEST_AGE = Metric(
    "newest_durable_checkpoint_age_seconds",
    "s",
    LABELS,
    "Age of the newest complete checkpoint in the bucket",
)
#: Every metric the watch writes; IN_REPLICA at every run (the stack's heartbeat alert).
METRICS = (LAG, UNCONFIRMED, IN_REPLICA, NEWEST_AGE)
HEARTBEAT = IN_REPLICA


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    project: str = var("FTFLEET_GCP_PROJECT", "the project the lag metrics are written to")
    bucket: str = var("FTFLEET_CKPT_BUCKET", "the checkpoint bucket (dual-region or multi-region)")
    root: str = var("FTFLEET_CKPT_ROOT", "object prefix of the run's checkpoints (no trailing slash)")
    rpo: str = var("FTFLEET_BUCKET_RPO", "the bucket's recovery point objective: ASYNC_TURBO or DEFAULT", TEXT)
    replica_bucket: str = var(
        "FTFLEET_REPLICA_BUCKET", "a second bucket the checkpoints are copied to, or empty for none", TEXT, default=""
    )
    lag_alarm_s: float = var(
        "FTFLEET_LAG_ALARM_SECONDS", "the stack's replicationLagAlarmSeconds (reported with each measurement)", SECONDS
    )
