from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import COUNT, NAMES, SECONDS, StackConfig, var

#: The hourly replacement budget of each group, next to the checkpoints (relative to the
#: run's root); every replacement is reserved here with a conditional write first.
REPLACEMENTS_KEY = "fleet/replacements.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    groups: tuple[str, ...] = var("FTFLEET_GROUPS", "JSON list of the stack's Auto Scaling group names", NAMES)
    bucket: str = var("FTFLEET_CKPT_BUCKET", "the primary checkpoint bucket, which holds the replacement log")
    root: str = var("FTFLEET_CKPT_ROOT", "key prefix of the run's checkpoints in that bucket (no trailing slash)")
    grace_s: float = var(
        "FTFLEET_GRACE_S", "seconds without progress (and since launch) before a node counts as unhealthy", SECONDS
    )
    max_per_hour: int = var("FTFLEET_MAX_REPLACEMENTS_PER_HOUR", "replacements allowed per group in any hour", COUNT)
