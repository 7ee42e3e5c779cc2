"""The remediation functions' alarms: one per function on its dead-letter queue and its
errors, and one per condition a human must see (replication lag, S3 Replication Time
Control's own metrics, withheld replacements, handoffs that hit the deadline, storage
settings someone weakened). A switched-off function takes its alarms with it.

An alarm lives in the region whose CloudWatch holds its metric: S3 publishes
ReplicationLatency (like BytesPendingReplication and OperationsPendingReplication) in
the destination bucket's region and OperationsFailedReplication in the source bucket's
(infra/policies/remediation.py, which checks it); everything else is in the primary
region."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pulumi
import pulumi_aws as aws

from ftfleet import contract
from ftfleet.infra.policies.remediation import S3_REPLICATION_METRIC_SIDE
from ftfleet.infra.settings import Settings

if TYPE_CHECKING:
    from ftfleet.infra.aws.remediation_parts import Deployed

PERIOD_S = 300


def _alarm(
    name: str,
    physical: str,
    description: str,
    namespace: str,
    metric: str,
    dimensions: pulumi.Input[dict],
    statistic: str,
    threshold: float,
    opts: pulumi.ResourceOptions,
    comparison: str = "GreaterThanOrEqualToThreshold",
    missing: str = "notBreaching",
) -> aws.cloudwatch.MetricAlarm:
    return aws.cloudwatch.MetricAlarm(
        name,
        name=physical,
        alarm_description=description,
        namespace=namespace,
        metric_name=metric,
        dimensions=dimensions,
        statistic=statistic,
        period=PERIOD_S,
        evaluation_periods=1,
        threshold=threshold,
        comparison_operator=comparison,
        treat_missing_data=missing,
        opts=opts,
    )


def declare(
    name: str,
    s: Settings,
    deployed: dict[str, Deployed],
    primary_bucket: pulumi.Output[str],
    replica_bucket: pulumi.Output[str],
    rule_id: pulumi.Output[str],
    opts: pulumi.ResourceOptions,
    replica_opts: pulumi.ResourceOptions,
) -> list[aws.cloudwatch.MetricAlarm]:
    """``opts`` place an alarm in the primary region, ``replica_opts`` in the replica's."""
    out = []
    side_opts = {"source": opts, "destination": replica_opts}
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
                opts,
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
                opts,
            )
        )
    r = s.remediation
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
                opts,
                comparison="GreaterThanThreshold",
                missing="breaching",
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
                side_opts[S3_REPLICATION_METRIC_SIDE["ReplicationLatency"]],
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
                side_opts[S3_REPLICATION_METRIC_SIDE["OperationsFailedReplication"]],
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
                opts,
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
                opts,
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
                opts,
            )
        )
    return out
