from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import RULES, SECONDS, StackConfig, var
from ftfleet.lambdas.common.gcp import Metric

LABELS = ("stack",)
DELETED = Metric(
    "retention_deleted_checkpoints",
    "1",
    LABELS,
    "Step directories the retention sweep deleted in its run: checkpoints the schedule no longer keeps, and debris",
)
#: Written at every run of the sweep (the stack's silence alert waits for it).
KEPT = Metric(
    "retention_kept_checkpoints",
    "1",
    LABELS,
    "Committed checkpoints the retention schedule keeps in the bucket, at the sweep's run",
)
#: Above 0: a step directory the sweep could not delete (the stack alerts on it).
FAILURES = Metric(
    "retention_delete_failures",
    "1",
    LABELS,
    "Step directories the retention sweep failed to delete in its run",
)
#: Every metric the sweep writes, each at every run.
METRICS = (DELETED, KEPT, FAILURES)
HEARTBEAT = KEPT


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    project: str = var("FTFLEET_GCP_PROJECT", "the project the sweep's metrics are written to")
    bucket: str = var("FTFLEET_CKPT_BUCKET", "the checkpoint bucket")
    root: str = var("FTFLEET_CKPT_ROOT", "object prefix of the run's checkpoints (no trailing slash)")
    rules: tuple[str, ...] = var(
        "FTFLEET_RETENTION_RULES",
        "JSON list of the retention rules applied where no manifest records a policy (checkpointRetention)",
        RULES,
    )
    timeout_s: float = var(
        "FTFLEET_TIMEOUT_SECONDS", "the function's timeout: the sweep starts no deletion close to it", SECONDS
    )
