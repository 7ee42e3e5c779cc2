from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import NAMES, SECONDS, StackConfig, var

#: The event it accepts, ``(source, detail-type)``, and the transition it handles.
LIFECYCLE = ("aws.autoscaling", "EC2 Instance-terminate Lifecycle Action")
TERMINATING = "autoscaling:EC2_INSTANCE_TERMINATING"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    groups: tuple[str, ...] = var("FTFLEET_GROUPS", "JSON list of the stack's Auto Scaling group names", NAMES)
    bucket: str = var("FTFLEET_CKPT_BUCKET", "the primary checkpoint bucket, where nodes upload their commit markers")
    root: str = var("FTFLEET_CKPT_ROOT", "key prefix of the run's checkpoints in that bucket (no trailing slash)")
    max_wait_s: float = var(
        "FTFLEET_HANDOFF_MAX_WAIT_S", "seconds after the lifecycle event at which the action completes anyway", SECONDS
    )
    heartbeat_s: float = var(
        "FTFLEET_HEARTBEAT_S", "seconds between lifecycle heartbeats while waiting (below the hook's timeout)", SECONDS
    )
    poll_s: float = var("FTFLEET_POLL_S", "seconds between two looks for the marker", SECONDS, default=5.0)
