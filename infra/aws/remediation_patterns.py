"""EventBridge event patterns and schedules of the remediation functions.

Pure functions of the stack's names: the program renders the rules from them and the
tests feed the same patterns to moto's EventBridge with documented sample events. The
``(source, detail-type)`` pairs come from each function's own config module, so a rule
matches exactly what its function accepts.
"""

from __future__ import annotations

import math
from typing import Any

from ftfleet import contract
from ftfleet.lambdas.lifecycle_handoff.config import LIFECYCLE, TERMINATING
from ftfleet.lambdas.spot_interruption.config import INTERRUPTION, REBALANCE
from ftfleet.lambdas.storage_drift.desired import ASSOCIATION_CALLS, BUCKET_CALLS, FSX_CALL, S3_CALL

#: How often replication_watch measures (S3 RTC's own target is 15 minutes).
REPLICATION_WATCH_MINUTES = 5
#: How often capacity_watch measures.
CAPACITY_WATCH_MINUTES = 2
#: How often retention_sweep applies the schedule (its finest default rule is 6 hours).
RETENTION_SWEEP_MINUTES = 60


def _kind(pair: tuple[str, str]) -> dict[str, Any]:
    return {"source": [pair[0]], "detail-type": [pair[1]]}


def spot_interruption() -> dict[str, Any]:
    """Every spot interruption warning of the region: the detail holds only the instance
    id, so no pattern can name the stack's groups; the function drops other instances."""
    return _kind(INTERRUPTION)


def rebalance_recommendation() -> dict[str, Any]:
    return _kind(REBALANCE)


def lifecycle_action(groups: list[str]) -> dict[str, Any]:
    """Terminate lifecycle actions of the stack's groups, for its hook only."""
    return {
        **_kind(LIFECYCLE),
        "detail": {
            "AutoScalingGroupName": sorted(groups),
            "LifecycleHookName": [contract.TERMINATION_HOOK_NAME],
            "LifecycleTransition": [TERMINATING],
        },
    }


def bucket_calls(buckets: list[str]) -> dict[str, Any]:
    """Successful and failed CloudTrail records of calls that change a managed setting of
    the stack's buckets (the function drops failed ones with a log line)."""
    return {
        **_kind(S3_CALL),
        "detail": {
            "eventSource": ["s3.amazonaws.com"],
            "eventName": sorted(BUCKET_CALLS),
            "requestParameters": {"bucketName": sorted(buckets)},
        },
    }


def association_calls() -> dict[str, Any]:
    """Updates and deletions of data repository associations. Not narrowed to the stack's
    association id: a recreated association has a new id, and the function checks
    ownership by file system."""
    return {
        **_kind(FSX_CALL),
        "detail": {"eventSource": ["fsx.amazonaws.com"], "eventName": sorted(ASSOCIATION_CALLS)},
    }


def rate(minutes: int) -> str:
    """An EventBridge rate expression (the unit is singular for a value of 1)."""
    return f"rate({minutes} minute{'' if minutes == 1 else 's'})"


def sweep_minutes(grace_s: int) -> int:
    """unhealthy_node sweeps four times per grace period (between 1 and 15 minutes apart),
    so a stalled node is found at most a quarter of the grace period late."""
    return max(1, min(15, math.floor(grace_s / 4 / 60)))
