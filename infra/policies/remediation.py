"""What AWS documents about the remediation functions' resources (Lambda, EventBridge,
SQS dead-letter queues, CloudWatch Logs, CloudTrail), read off the declared resources.
Each docstring names the AWS document the constraint comes from."""

from __future__ import annotations

import re
from typing import Any

from ftfleet.infra.policies.model import Res, as_list, statements

# --- remediation functions: Lambda, EventBridge, CloudWatch Logs, CloudTrail ------

FUNCTION = "aws:lambda/function:Function"
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
METRIC_ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
BUCKET = "aws:s3/bucket:Bucket"
REPLICATION = "aws:s3/bucketReplicationConfig:BucketReplicationConfig"
SNS_TOPIC = "aws:sns/topic:Topic"
#: The bucket whose region S3 publishes each replication metric in (Amazon S3 User
#: Guide, "Using S3 Replication metrics", column "Which Region is this metric published
#: in?").
S3_REPLICATION_METRIC_SIDE = {
    "ReplicationLatency": "destination",
    "BytesPendingReplication": "destination",
    "OperationsPendingReplication": "destination",
    "OperationsFailedReplication": "source",
}
LAMBDA_ENV_LIMIT = 4096
LOG_RETENTION_DAYS = (
    1,
    3,
    5,
    7,
    14,
    30,
    60,
    90,
    120,
    150,
    180,
    365,
    400,
    545,
    731,
    1096,
    1827,
    2192,
    2557,
    2922,
    3288,
    3653,
)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def lambda_within_quotas(r: Res) -> list[str]:
    """A function's timeout is 1-900 s, its memory 128-10,240 MB and its environment
    variables 4 KB in all.

    AWS Lambda Developer Guide, "Lambda quotas":
    https://docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html
    """
    if r.type != FUNCTION:
        return []
    out = []
    timeout = r.props.get("timeout")
    if timeout is None:
        out.append("no timeout set: Lambda's default of 3 s cuts a remediation short")
    elif _number(timeout) and not 1 <= timeout <= 900:
        out.append(f"timeout {timeout} s is outside Lambda's 1-900 s")
    memory = r.props.get("memorySize")
    if _number(memory) and not 128 <= memory <= 10240:
        out.append(f"memory {memory} MB is outside Lambda's 128-10240 MB")
    env = ((r.props.get("environment") or {}).get("variables")) or {}
    if isinstance(env, dict) and all(isinstance(v, str) for v in env.values()):
        size = sum(len(k.encode()) + len(v.encode()) for k, v in env.items())
        if size > LAMBDA_ENV_LIMIT:
            out.append(f"environment variables take {size} bytes; Lambda allows {LAMBDA_ENV_LIMIT} in all")
    return out


def async_retries_bounded(r: Res) -> list[str]:
    """Lambda retries a failed asynchronous invocation 0-2 times and keeps an event 60 s to
    6 hours.

    AWS Lambda API Reference, "PutFunctionEventInvokeConfig":
    https://docs.aws.amazon.com/lambda/latest/api/API_PutFunctionEventInvokeConfig.html
    """
    if r.type != "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig":
        return []
    out = []
    retries, age = r.props.get("maximumRetryAttempts"), r.props.get("maximumEventAgeInSeconds")
    if _number(retries) and not 0 <= retries <= 2:
        out.append(f"maximumRetryAttempts {retries} is outside 0-2")
    if _number(age) and not 60 <= age <= 21600:
        out.append(f"maximumEventAgeInSeconds {age} is outside 60-21600")
    return out


def event_target_bounded(r: Res) -> list[str]:
    """A rule's target to a function retries within EventBridge's bounds (0-185 attempts,
    60 s to 24 h) and has a dead-letter queue for the events it could not deliver.

    Amazon EventBridge User Guide, "Event retry policy and using dead-letter queues":
    https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-dlq.html
    """
    if r.type != EVENT_TARGET:
        return []
    out = []
    retry = r.props.get("retryPolicy") or {}
    attempts, age = retry.get("maximumRetryAttempts"), retry.get("maximumEventAgeInSeconds")
    if _number(attempts) and not 0 <= attempts <= 185:
        out.append(f"retry attempts {attempts} outside EventBridge's 0-185")
    if _number(age) and not 60 <= age <= 86400:
        out.append(f"maximum event age {age} s outside EventBridge's 60-86400")
    arn = r.props.get("arn")
    if isinstance(arn, str) and ":lambda:" in arn and not (r.props.get("deadLetterConfig") or {}).get("arn"):
        out.append("a target that invokes a function has no dead-letter queue")
    return out


def schedule_expression_valid(r: Res) -> list[str]:
    """A rate expression has a positive whole value and a unit that is singular for 1
    (``rate(1 minute)``) and plural otherwise (``rate(5 minutes)``).

    Amazon EventBridge User Guide, "Creating an Amazon EventBridge rule that runs on a
    schedule" (rate expressions):
    https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-scheduled-rule-pattern.html
    """
    if r.type != "aws:cloudwatch/eventRule:EventRule":
        return []
    expr = r.props.get("scheduleExpression")
    if not isinstance(expr, str) or not expr.startswith("rate("):
        return []
    m = re.fullmatch(r"rate\((\d+) (minute|minutes|hour|hours|day|days)\)", expr)
    if not m or int(m.group(1)) < 1:
        return [f"schedule {expr!r} is not rate(<n> <unit>)"]
    value, unit = int(m.group(1)), m.group(2)
    if (value == 1) != (not unit.endswith("s")):
        return [f"schedule {expr!r}: use the singular unit for 1 and the plural otherwise"]
    return []


def trail_logs_global_events(r: Res) -> list[str]:
    """A multi-Region trail includes global service events; CloudTrail turns them off only
    on a single-Region trail.

    AWS CloudTrail User Guide, "Using the update-trail command to update a trail"
    (Enabling and disabling global service event logging):
    https://docs.aws.amazon.com/awscloudtrail/latest/userguide/cloudtrail-create-and-update-a-trail-by-using-the-aws-cli-update-trail.html
    """
    if r.type != "aws:cloudtrail/trail:Trail":
        return []
    if r.props.get("isMultiRegionTrail") is True and r.props.get("includeGlobalServiceEvents") is False:
        return ["a multi-Region trail must include global service events"]
    return []


def lambda_rule_permissions(resources: list[Res]) -> list[tuple[str, str]]:
    """Every rule that targets a function comes with a resource-based permission on that
    function for ``events.amazonaws.com`` whose source ARN is that rule.

    Amazon EventBridge User Guide, "Using resource-based policies for Amazon EventBridge"
    (AWS Lambda permissions):
    https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-use-resource-based.html
    """
    functions = {r.urn for r in resources if r.type == FUNCTION}
    permissions = [r for r in resources if r.type == "aws:lambda/permission:Permission"]
    out = []
    for target in (r for r in resources if r.type == EVENT_TARGET):
        for fn in (u for u in target.deps("arn") if u in functions):
            rules = target.deps("rule")
            if not any(
                fn in p.deps("function")
                and any(rule in p.deps("sourceArn") for rule in rules)
                and p.props.get("principal") == "events.amazonaws.com"
                for p in permissions
            ):
                out.append((target.name, "no lambda permission lets this target's rule invoke the function"))
    return out


def lambda_dead_letters_and_logs(resources: list[Res]) -> list[tuple[str, str]]:
    """Every function parks failed asynchronous invocations in a dead-letter queue that its
    role may send to, and logs to its own log group, which has a retention (Lambda's
    default group ``/aws/lambda/<name>`` otherwise keeps logs forever).

    AWS Lambda Developer Guide, "Adding a dead-letter queue" and "Sending Lambda function
    logs to CloudWatch Logs":
    https://docs.aws.amazon.com/lambda/latest/dg/invocation-async-retain-records.html
    https://docs.aws.amazon.com/lambda/latest/dg/monitoring-cloudwatchlogs.html ; retention
    values: Amazon CloudWatch Logs API Reference, "PutRetentionPolicy":
    https://docs.aws.amazon.com/AmazonCloudWatchLogs/latest/APIReference/API_PutRetentionPolicy.html
    """
    out = []
    groups = {r.props.get("name"): r for r in resources if r.type == "aws:cloudwatch/logGroup:LogGroup"}
    role_policies = [r for r in resources if r.type == "aws:iam/rolePolicy:RolePolicy"]
    for fn in (r for r in resources if r.type == FUNCTION):
        dlq = (fn.props.get("deadLetterConfig") or {}).get("targetArn")
        if not dlq:
            out.append((fn.name, "function has no dead-letter queue"))
        elif isinstance(dlq, str):
            roles = fn.deps("role")
            allowed = any(
                any(role in rp.deps("role") for role in roles)
                and any(
                    s.get("Effect") == "Allow"
                    and "sqs:SendMessage" in as_list(s.get("Action"))
                    and dlq in as_list(s.get("Resource"))
                    for s in statements(rp.props.get("policy"))
                )
                for rp in role_policies
            )
            if not allowed and all(isinstance(rp.props.get("policy"), str) for rp in role_policies):
                out.append((fn.name, "the function's role may not send to its dead-letter queue"))
        name = fn.props.get("name")
        group_name = ((fn.props.get("loggingConfig") or {}).get("logGroup")) or (
            f"/aws/lambda/{name}" if isinstance(name, str) else None
        )
        if not isinstance(group_name, str):
            continue
        group = groups.get(group_name)
        if group is None:
            out.append((fn.name, f"no log group {group_name}: Lambda would create one that never expires"))
            continue
        days = group.props.get("retentionInDays")
        if days is None:
            out.append((group.name, "log group keeps logs forever; set retention_in_days"))
        elif _number(days) and days not in LOG_RETENTION_DAYS:
            out.append((group.name, f"retention {days} days is not a value CloudWatch Logs accepts"))
    return out


def dead_letter_queues_admit_their_rules(resources: list[Res]) -> list[tuple[str, str]]:
    """A rule's dead-letter queue has a queue policy that lets EventBridge send to it for
    that rule (``aws:SourceArn``); without it, undeliverable events are lost.

    Amazon EventBridge User Guide, "Event retry policy and using dead-letter queues"
    (Granting permissions to the dead-letter queue):
    https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-rule-dlq.html
    """
    queue_policies = [r for r in resources if r.type == "aws:sqs/queuePolicy:QueuePolicy"]
    queues = {r.urn: r for r in resources if r.type == "aws:sqs/queue:Queue"}
    out = []
    for target in (r for r in resources if r.type == EVENT_TARGET):
        for queue in (u for u in target.deps("deadLetterConfig") if u in queues):
            ok = False
            for qp in queue_policies:
                if queue not in qp.deps("queueUrl"):
                    continue
                if not isinstance(qp.props.get("policy"), str):
                    ok = True  # unknown at preview
                    break
                for st in statements(qp.props["policy"]):
                    principal = (
                        (st.get("Principal") or {}).get("Service") if isinstance(st.get("Principal"), dict) else None
                    )
                    if (
                        st.get("Effect") == "Allow"
                        and principal == "events.amazonaws.com"
                        and any(rule in qp.deps("policy") for rule in target.deps("rule"))
                    ):
                        ok = True
            if not ok:
                out.append((target.name, "the dead-letter queue's policy does not admit EventBridge for this rule"))
    return out


def s3_replication_alarm_region(resources: list[Res]) -> list[tuple[str, str]]:
    """An alarm on an S3 replication metric lives in the region S3 publishes that metric
    in: ReplicationLatency, BytesPendingReplication and OperationsPendingReplication in
    the destination bucket's region, OperationsFailedReplication in the source
    bucket's. An alarm elsewhere watches a metric that never has data.

    Amazon S3 User Guide, "Using S3 Replication metrics":
    https://docs.aws.amazon.com/AmazonS3/latest/userguide/repl-metrics.html

    The buckets are found through the replication configuration the alarm's dimensions
    came from: its ``bucket`` is the source, the buckets its ``rules`` name are the
    destinations.
    """
    by_urn = {r.urn: r for r in resources}
    out = []
    for alarm in resources:
        if alarm.type != METRIC_ALARM or alarm.props.get("namespace") != "AWS/S3":
            continue
        side = S3_REPLICATION_METRIC_SIDE.get(alarm.props.get("metricName"))
        if side is None:
            continue
        configs = [by_urn[u] for u in alarm.deps("dimensions") if u in by_urn and by_urn[u].type == REPLICATION]
        for config in configs:
            prop = "bucket" if side == "source" else "rules"
            regions = {by_urn[u].region for u in config.deps(prop) if u in by_urn and by_urn[u].type == BUCKET}
            if not regions or None in regions or alarm.region is None:
                continue  # unknown (a preview without providers' regions): nothing to judge
            if alarm.region not in regions:
                out.append(
                    (
                        alarm.name,
                        f"S3 publishes {alarm.props['metricName']} in the {side} bucket's region "
                        f"({', '.join(sorted(regions))}), not in {alarm.region}",
                    )
                )
    return out


def alarms_notify(resources: list[Res]) -> list[tuple[str, str]]:
    """No alarm is silent: each has its actions enabled and notifies an SNS topic of its
    own region when it goes into ALARM (the stack's alarm topic, whose subscribers come
    from ``alarmSubscriptions``). An alarm without an action only changes color in the
    console.

    Amazon CloudWatch User Guide, "Using Amazon CloudWatch alarms" (alarm actions) and
    "Notifying users on alarm changes":
    https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/AlarmThatSendsEmail.html
    https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/Notify_Users_Alarm_Changes.html
    """
    by_urn = {r.urn: r for r in resources}
    out = []
    for alarm in (r for r in resources if r.type == METRIC_ALARM):
        if alarm.props.get("actionsEnabled") is False:
            out.append((alarm.name, "actions are disabled: the alarm notifies no one"))
            continue
        actions = alarm.props.get("alarmActions")
        if actions is not None and not isinstance(actions, list):
            continue  # unknown at preview
        actions = actions or []
        if any(not isinstance(a, str) for a in actions):
            continue  # unknown at preview
        topics = [a for a in actions if a.startswith("arn:aws:sns:")]
        if not topics:
            out.append((alarm.name, "no SNS topic among its alarm actions: the alarm notifies no one"))
            continue
        linked = [by_urn[u] for u in alarm.deps("alarmActions") if u in by_urn and by_urn[u].type == SNS_TOPIC]
        regions = {t.region for t in linked} or {a.split(":")[3] for a in topics}
        if alarm.region is not None and None not in regions and alarm.region not in regions:
            out.append(
                (alarm.name, f"its topic is in {', '.join(sorted(regions))}, not in its own region {alarm.region}")
            )
    return out
