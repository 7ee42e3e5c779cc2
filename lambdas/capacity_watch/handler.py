"""Scheduled: whether the stack's Auto Scaling groups get the nodes they ask for, and
since when they do not, from Auto Scaling's own record.

For each group: the nodes it is short (desired capacity less its ``InService``
instances), and, when short, since when launches have failed for want of capacity: the
start of the earliest failed launch whose status message names a capacity shortage
(:data:`CAPACITY_ERRORS`) after the group's latest successful activity
("Verifying your Auto Scaling scaling activities"; DescribeScalingActivities).
A group short without such a failure is booting, not out of capacity.

Published per stack (metric dimension ``Stack``): ``CapacityShortNodes`` (every group's
shortfall) and ``CapacityShortSeconds`` (the longest time a group has been short for
want of capacity, 0 when none is). The stack's alarm on the latter past
``capacityLossMinutes`` tells a person.

A standby with ``standbyAutoFailover`` (config :attr:`Config.failover`) also moves the
run: the standby's function watches both regions, and when the region the run trains
in (the one whose worker group asks for nodes) has been short for want of capacity for
``capacityLossMinutes``, it begins a move to the other (:class:`~ftfleet.lambdas.common.move.Move`,
the steps of `ftfleet failover`), and takes the move's next step on every later
invocation until it is done (one invocation at a time: reserved concurrency 1). One
function moves the run either way; a failback when the standby in turn runs out is the
same move. Every other
stack's function is read-only: it never changes a group.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from ftfleet.lambdas.capacity_watch.config import Config
from ftfleet.lambdas.common import aws, capacity, eventbridge, move, runtime
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.common.move import Pair, Side

NAME = "capacity_watch"
#: A failed launch's status message that means the cloud had no capacity
#: (case-insensitive): EC2's error codes, the plain group's "We currently do not have
#: sufficient <type> capacity" ("Troubleshoot Amazon EC2 Auto Scaling: EC2 instance
#: launch failures"), and Spot's "There is no Spot capacity available".
CAPACITY_ERRORS = re.compile(
    r"insufficientinstancecapacity|insufficientcapacity|insufficienthostcapacity|unfulfillablecapacity"
    r"|do not have sufficient \S+ capacity|insufficient capacity|no spot capacity",
    re.IGNORECASE,
)
#: Recent activities read per group: a shortage older than this many failed launches
#: counts from the oldest one read.
ACTIVITIES = 100

clock = runtime.Clock()


def handler(event: Any, context: Any) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, event, context)


def is_capacity_failure(activity: dict[str, Any]) -> bool:
    if activity.get("StatusCode") not in ("Failed", "Cancelled"):
        return False
    text = f"{activity.get('StatusMessage', '')} {activity.get('Description', '')}"
    return CAPACITY_ERRORS.search(text) is not None


def short_since(activities: list[dict[str, Any]]) -> float | None:
    """The start (epoch seconds) of the earliest capacity failure after the group's
    latest successful activity of any kind (a launch, or a termination that shrank it:
    a failure before a resize belongs to an earlier shortage); None when there is none.
    ``activities``: newest first, as DescribeScalingActivities returns them (activities
    are kept six weeks). A node at a time arriving restarts the count: it errs late."""
    since = None
    for activity in activities:
        if activity.get("StatusCode") == "Successful":
            break
        if is_capacity_failure(activity):
            start = activity.get("StartTime")
            if isinstance(start, datetime.datetime):
                since = start.timestamp()
    return since


def activities_of(asg: Any, group: str) -> list[dict[str, Any]]:
    got = asg.describe_scaling_activities(AutoScalingGroupName=group, MaxRecords=ACTIVITIES)
    return list(got.get("Activities", []))


def measure(asg: Any, names: list[str] | tuple[str, ...], now: float) -> tuple[int, float, dict[str, Any]]:
    """(nodes short, the longest a group has been short for want of capacity in
    seconds, per group found: its shortfall and that time)."""
    found = asg.describe_auto_scaling_groups(AutoScalingGroupNames=list(names))["AutoScalingGroups"]
    short_nodes, longest, groups = 0, 0.0, {}
    for group in found:
        name = group["AutoScalingGroupName"]
        in_service = sum(1 for i in group.get("Instances", []) if i.get("LifecycleState") == "InService")
        short = max(0, int(group["DesiredCapacity"]) - in_service)
        seconds = 0.0
        if short:
            since = short_since(activities_of(asg, name))
            seconds = max(0.0, now - since) if since is not None else 0.0
        short_nodes += short
        longest = max(longest, seconds)
        groups[name] = {"short": short, "short_for_capacity_s": round(seconds, 1)}
    return short_nodes, longest, groups


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    eventbridge.parse(event, (eventbridge.SCHEDULED,))
    now = clock.now()
    short_nodes, longest, groups = measure(aws.client("autoscaling"), cfg.groups, now)
    missing = sorted(set(cfg.groups) - set(groups))
    aws.put_metrics(
        {"MetricName": name, "Dimensions": aws.dims(Stack=cfg.stack), "Value": value, "Unit": unit}
        for name, value, unit in (
            ("CapacityShortNodes", float(short_nodes), "Count"),
            ("CapacityShortSeconds", longest, "Seconds"),
        )
    )
    fields: dict[str, Any] = {"groups": groups, "missing_groups": missing, "loss_s": cfg.loss_s}
    decision, level = capacity.decision(longest, cfg.loss_s, short_nodes)
    if cfg.failover is not None:
        fields["failover"] = failover(cfg.failover, cfg.loss_s, now)
        decision, level = move.outcome(fields["failover"], decision, level)
    return log.decision(decision, level=level, **fields)


def failover(pair: Pair, loss_s: float, now: float) -> dict[str, Any]:
    """The move's next step, if one is under way or due (module doc); what was done."""

    def short_for(side: Side) -> float:
        groups = (side.coordinator_group, side.worker_group)
        return measure(aws.client("autoscaling", side.region), groups, now)[1]

    return move.drive(pair, loss_s, now, short_for)


runtime.prime(Config)
