"""The remediation functions' alarms: one per function on its dead-letter queue and its
errors, and one per condition a human must see (replication lag, S3 Replication Time
Control's own metrics, withheld replacements, handoffs that hit the deadline, storage
settings someone weakened, checkpoints the retention sweep could not delete). A
switched-off function takes its alarms with it.

An alarm lives in the region whose CloudWatch holds its metric: S3 publishes
ReplicationLatency (like BytesPendingReplication and OperationsPendingReplication) in
the destination bucket's region and OperationsFailedReplication in the source bucket's
(infra/policies/remediation.py, which checks it); everything else is in the primary
region. Every alarm notifies the stack's alarm topic of its region (:func:`topic`) when
it goes into ALARM and when it is OK again; ``alarmSubscriptions`` says who listens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pulumi
import pulumi_aws as aws

from ftfleet import contract
from ftfleet.infra.aws import remediation_patterns as patterns
from ftfleet.infra.policies.remediation import S3_REPLICATION_METRIC_SIDE
from ftfleet.infra.settings import Settings

if TYPE_CHECKING:
    from ftfleet.infra.aws.remediation_parts import Deployed

PERIOD_S = 300
#: An alarm on a scheduled function's metric, with missing data breaching (a silent
#: function is an alarm too): each period spans this many schedule intervals, so that it
#: holds a data point while the function runs (its points are one interval apart, give
#: or take EventBridge's minute and the run's own time), and it fires on this many
#: periods in a row, so that one failed run (which its errors alarm reports) does not.
SCHEDULED_PERIODS = 2


@dataclass(frozen=True)
class Place:
    """Where an alarm goes: a region's resource options and the stack's alarm topic
    there, which every alarm notifies when it goes into ALARM and back to OK."""

    opts: pulumi.ResourceOptions
    topic_arn: pulumi.Input[str]


def topic(name: str, s: Settings, opts: pulumi.ResourceOptions) -> aws.sns.Topic:
    """The stack's alarm topic in the region of ``opts``, with a subscription for each
    of ``alarmSubscriptions``."""
    t = aws.sns.Topic(name, name=f"{s.name}-alarms", opts=opts)
    for i, (protocol, endpoint) in enumerate(s.remediation.alarm_subscriptions):
        aws.sns.TopicSubscription(f"{name}-{i}", topic=t.arn, protocol=protocol, endpoint=endpoint, opts=opts)
    return t


def _alarm(
    name: str,
    physical: str,
    description: str,
    namespace: str,
    metric: str,
    dimensions: pulumi.Input[dict],
    statistic: str,
    threshold: float,
    place: Place,
    comparison: str = "GreaterThanOrEqualToThreshold",
    missing: str = "notBreaching",
    period: int = PERIOD_S,
    periods: int = 1,
) -> aws.cloudwatch.MetricAlarm:
    """Fires when ``periods`` periods in a row breach."""
    return aws.cloudwatch.MetricAlarm(
        name,
        name=physical,
        alarm_description=description,
        namespace=namespace,
        metric_name=metric,
        dimensions=dimensions,
        statistic=statistic,
        period=period,
        evaluation_periods=periods,
        datapoints_to_alarm=periods,
        threshold=threshold,
        comparison_operator=comparison,
        treat_missing_data=missing,
        actions_enabled=True,
        alarm_actions=[place.topic_arn],
        ok_actions=[place.topic_arn],
        opts=place.opts,
    )


def declare(
    name: str,
    s: Settings,
    deployed: dict[str, Deployed],
    primary_bucket: pulumi.Output[str],
    replica_bucket: pulumi.Output[str],
    rule_id: pulumi.Output[str],
    primary: Place,
    replica: Place,
) -> list[aws.cloudwatch.MetricAlarm]:
    """``primary`` places an alarm in the primary (replication source) region,
    ``replica`` in the replica's (replication destination)."""
    out = []
    side = {"source": primary, "destination": replica}
    ns, stack = contract.METRICS_NAMESPACE, {"Stack": s.stack}
    for folder, d in deployed.items():
        short = folder.replace("_", "-")
        out.append(
            _alarm(
                f"{name}-{short}-dead-letters",
                f"{s.name}-{short}-dead-letters",
                f"{folder} could not handle an event; it waits in its dead-letter queue",
                "AWS/SQS",
                "ApproximateNumberOfMessagesVisible",
                {"QueueName": d.dlq.name},
                "Maximum",
                1,
                primary,
            )
        )
        out.append(
            _alarm(
                f"{name}-{short}-errors",
                f"{s.name}-{short}-errors",
                f"{folder} failed (see its log group); it will be retried",
                "AWS/Lambda",
                "Errors",
                {"FunctionName": d.function.name},
                "Sum",
                1,
                primary,
            )
        )
    r = s.remediation
    if "capacity_watch" in deployed:
        if s.standby and s.standby.auto_failover:
            what = f"this stack's capacity_watch moves the run back to {s.standby.home}; its log has each step"
        elif s.standby:
            what = f"move the run back to {s.standby.home} with `ftfleet failover`"
        else:
            what = "its standby's capacity_watch moves the run (standbyAutoFailover), else `ftfleet failover` does"
        out.append(
            _alarm(
                f"{name}-capacity-lost",
                f"{s.name}-capacity-lost",
                f"a node group has been short of nodes for want of capacity for {r.capacity_loss_minutes} minutes: "
                f"{what} (docs/FAILOVER.md)",
                ns,
                "CapacityShortSeconds",
                stack,
                "Maximum",
                r.capacity_loss_minutes * 60,
                primary,
                period=60 * patterns.CAPACITY_WATCH_MINUTES,
            )
        )
    if "replication_watch" in deployed:
        out.append(
            _alarm(
                f"{name}-replication-lag",
                f"{s.name}-replication-lag",
                f"the replica lacks a committed checkpoint older than {r.replication_lag_alarm_seconds} s "
                "(or replication_watch stopped reporting)",
                ns,
                "ReplicationLagSeconds",
                stack,
                "Maximum",
                r.replication_lag_alarm_seconds,
                primary,
                comparison="GreaterThanThreshold",
                missing="breaching",
                period=SCHEDULED_PERIODS * patterns.REPLICATION_WATCH_MINUTES * 60,
                periods=SCHEDULED_PERIODS,
            )
        )
        rtc = pulumi.Output.all(primary_bucket, replica_bucket, rule_id).apply(
            lambda a: {"SourceBucket": a[0], "DestinationBucket": a[1], "RuleId": a[2]}
        )
        out.append(
            _alarm(
                f"{name}-replication-latency",
                f"{s.name}-replication-latency",
                f"S3 ReplicationLatency above {r.replication_lag_alarm_seconds} s",
                "AWS/S3",
                "ReplicationLatency",
                rtc,
                "Maximum",
                r.replication_lag_alarm_seconds,
                side[S3_REPLICATION_METRIC_SIDE["ReplicationLatency"]],
                comparison="GreaterThanThreshold",
            )
        )
        out.append(
            _alarm(
                f"{name}-replication-failures",
                f"{s.name}-replication-failures",
                "S3 failed to replicate objects (OperationsFailedReplication)",
                "AWS/S3",
                "OperationsFailedReplication",
                rtc,
                "Sum",
                0,
                side[S3_REPLICATION_METRIC_SIDE["OperationsFailedReplication"]],
                comparison="GreaterThanThreshold",
            )
        )
    if "unhealthy_node" in deployed:
        out.append(
            _alarm(
                f"{name}-replacements-withheld",
                f"{s.name}-replacements-withheld",
                "unhealthy_node withheld a replacement (hourly limit reached, or the whole fleet stalled)",
                ns,
                "ReplacementsWithheld",
                stack,
                "Sum",
                1,
                primary,
            )
        )
    if "lifecycle_handoff" in deployed:
        out.append(
            _alarm(
                f"{name}-handoff-deadline",
                f"{s.name}-handoff-deadline",
                "a terminating node wrote no commit marker before the handoff deadline",
                ns,
                "HandoffWaitSeconds",
                {**stack, "Outcome": "deadline"},
                "SampleCount",
                1,
                primary,
            )
        )
    if "retention_sweep" in deployed:
        out.append(
            _alarm(
                f"{name}-retention-failures",
                f"{s.name}-retention-failures",
                "retention_sweep could not delete checkpoints the schedule no longer keeps (see its log group)",
                ns,
                "RetentionFailures",
                stack,
                "Sum",
                1,
                primary,
            )
        )
    if "storage_drift" in deployed:
        out.append(
            _alarm(
                f"{name}-storage-drift",
                f"{s.name}-storage-drift",
                "a call weakened a checkpoint bucket or the FSx association; storage_drift restored it",
                ns,
                "DriftRepairs",
                stack,
                "Sum",
                1,
                primary,
            )
        )
    return out
