from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import RULES, StackConfig, var


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    bucket: str = var("FTFLEET_CKPT_BUCKET", "the primary checkpoint bucket")
    root: str = var("FTFLEET_CKPT_ROOT", "key prefix of the run's checkpoints (no trailing slash)")
    rules: tuple[str, ...] = var(
        "FTFLEET_RETENTION_RULES", "the schedule where no manifest records one (checkpointRetention)", RULES
    )
