from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import SECONDS, TEXT, StackConfig, var


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
