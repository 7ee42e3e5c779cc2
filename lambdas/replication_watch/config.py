from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import StackConfig, var


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    bucket: str = var("FTFLEET_CKPT_BUCKET", "the primary checkpoint bucket")
    replica_bucket: str = var("FTFLEET_REPLICA_BUCKET", "the replica checkpoint bucket")
    replica_region: str = var("FTFLEET_REPLICA_REGION", "region of the replica bucket")
    root: str = var("FTFLEET_CKPT_ROOT", "key prefix of the run's checkpoints in both buckets (no trailing slash)")
