from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import NAMES, StackConfig, var

#: The events it accepts, ``(source, detail-type)``; the stack's rules match exactly these.
INTERRUPTION = ("aws.ec2", "EC2 Spot Instance Interruption Warning")
REBALANCE = ("aws.ec2", "EC2 Instance Rebalance Recommendation")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    groups: tuple[str, ...] = var("FTFLEET_GROUPS", "JSON list of the stack's Auto Scaling group names", NAMES)
    bucket: str = var("FTFLEET_CKPT_BUCKET", "the primary checkpoint bucket, which holds the interruption prior")
    root: str = var("FTFLEET_CKPT_ROOT", "key prefix of the run's checkpoints in that bucket (no trailing slash)")
