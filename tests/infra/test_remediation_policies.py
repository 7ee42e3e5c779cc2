"""Each remediation policy (infra/policies.py) catches a resource that violates it."""

from __future__ import annotations

import json

import pytest

from ftfleet.infra import policies
from tests.infra.conftest import recording, res_view


def res(type_token, props, name="r", deps=None):
    return policies.Res(type=type_token, name=name, urn=f"urn:{name}", props=props, property_dependencies=deps or {})


BAD = {
    "lambda-within-quotas": [
        res("aws:lambda/function:Function", {"timeout": 901, "memorySize": 256}),
        res("aws:lambda/function:Function", {"memorySize": 256}),  # no timeout: 3 s
        res(
            "aws:lambda/function:Function",
            {"timeout": 60, "environment": {"variables": {"FTFLEET_DESIRED": "x" * 4100}}},
        ),
    ],
    "lambda-async-retries-bounded": [
        res(
            "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig",
            {"maximumRetryAttempts": 3, "maximumEventAgeInSeconds": 60},
        ),
        res(
            "aws:lambda/functionEventInvokeConfig:FunctionEventInvokeConfig",
            {"maximumRetryAttempts": 1, "maximumEventAgeInSeconds": 30},
        ),
    ],
    "eventbridge-target-bounded": [
        res(
            "aws:cloudwatch/eventTarget:EventTarget",
            {"arn": "arn:aws:lambda:us-east-1:123456789012:function:f", "retryPolicy": {"maximumRetryAttempts": 3}},
        ),
        res(
            "aws:cloudwatch/eventTarget:EventTarget",
            {"arn": "arn:aws:sqs:us-east-1:123456789012:q", "retryPolicy": {"maximumRetryAttempts": 200}},
        ),
    ],
    "eventbridge-schedule-valid": [
        res("aws:cloudwatch/eventRule:EventRule", {"scheduleExpression": "rate(1 minutes)"}),
        res("aws:cloudwatch/eventRule:EventRule", {"scheduleExpression": "rate(5 minute)"}),
        res("aws:cloudwatch/eventRule:EventRule", {"scheduleExpression": "rate(0 minutes)"}),
        res("aws:cloudwatch/eventRule:EventRule", {"scheduleExpression": "rate(five minutes)"}),
    ],
    "cloudtrail-global-events": [
        res("aws:cloudtrail/trail:Trail", {"isMultiRegionTrail": True, "includeGlobalServiceEvents": False}),
    ],
}


@pytest.mark.parametrize(("name", "bad"), [(n, b) for n, items in BAD.items() for b in items])
def test_each_remediation_resource_policy_reports_its_violation(name, bad):
    found = [p.name for p in policies.POLICIES if not p.stack and p.check(bad)]
    assert found == [name]


def test_the_recorded_stacks_satisfy_the_remediation_policies():
    for stack in ("aws-dev", "aws-prod"):
        names = {
            p.name
            for p in policies.POLICIES
            if p.name.startswith(("lambda-", "eventbridge-", "cloudtrail-", "s3-replication-alarm"))
        }
        assert [v for v in policies.evaluate(res_view(recording(stack))) if v[0] in names] == []


def fn(name="fn", **props):
    base = {
        "name": "f",
        "timeout": 60,
        "deadLetterConfig": {"targetArn": "arn:aws:sqs:us-east-1:1:f-dlq"},
    }
    return res("aws:lambda/function:Function", {**base, **props}, name=name, deps={"role": ["urn:role"]})


def role_policy(actions=("sqs:SendMessage",), resource="arn:aws:sqs:us-east-1:1:f-dlq"):
    doc = {"Statement": [{"Effect": "Allow", "Action": list(actions), "Resource": [resource]}]}
    return res("aws:iam/rolePolicy:RolePolicy", {"policy": json.dumps(doc)}, name="rp", deps={"role": ["urn:role"]})


def log_group(days=30, name="/aws/lambda/f"):
    props = {"name": name} | ({"retentionInDays": days} if days is not None else {})
    return res("aws:cloudwatch/logGroup:LogGroup", props, name="logs")


def violations(resources, policy):
    return [(n, m) for p, n, m in policies.evaluate(resources) if p == policy]


def test_a_function_without_dlq_role_grant_or_log_retention_is_caught():
    policy = "lambda-dlq-and-log-retention"
    assert violations([fn(), role_policy(), log_group()], policy) == []
    assert violations([fn(deadLetterConfig=None), role_policy(), log_group()], policy) == [
        ("fn", "function has no dead-letter queue")
    ]
    assert violations([fn(), role_policy(actions=("sqs:ReceiveMessage",)), log_group()], policy) == [
        ("fn", "the function's role may not send to its dead-letter queue")
    ]
    assert violations([fn(), role_policy()], policy) == [
        ("fn", "no log group /aws/lambda/f: Lambda would create one that never expires")
    ]
    assert violations([fn(), role_policy(), log_group(days=None)], policy) == [
        ("logs", "log group keeps logs forever; set retention_in_days")
    ]
    assert violations([fn(), role_policy(), log_group(days=45)], policy) == [
        ("logs", "retention 45 days is not a value CloudWatch Logs accepts")
    ]


def target(deps=None):
    return res(
        "aws:cloudwatch/eventTarget:EventTarget",
        {"arn": "arn:aws:lambda:us-east-1:1:function:f", "deadLetterConfig": {"arn": "arn:aws:sqs:us-east-1:1:q"}},
        name="target",
        deps=deps or {"arn": ["urn:fn"], "rule": ["urn:rule"], "deadLetterConfig": ["urn:q"]},
    )


def permission(source="urn:rule", principal="events.amazonaws.com"):
    return res(
        "aws:lambda/permission:Permission",
        {"principal": principal, "action": "lambda:InvokeFunction"},
        name="perm",
        deps={"function": ["urn:fn"], "sourceArn": [source]},
    )


def test_a_rule_target_without_a_permission_for_that_rule_is_caught():
    policy = "lambda-rule-permission"
    base = [fn(), res("aws:cloudwatch/eventRule:EventRule", {}, name="rule")]
    assert violations([*base, target(), permission()], policy) == []
    expected = [("target", "no lambda permission lets this target's rule invoke the function")]
    assert violations([*base, target()], policy) == expected
    assert violations([*base, target(), permission(source="urn:another-rule")], policy) == expected
    assert violations([*base, target(), permission(principal="s3.amazonaws.com")], policy) == expected


def test_a_dead_letter_queue_that_does_not_admit_its_rule_is_caught():
    policy = "eventbridge-dlq-admits-rule"
    queue = res("aws:sqs/queue:Queue", {"name": "q"}, name="q")
    doc = {
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "events.amazonaws.com"}, "Action": "sqs:SendMessage"}
        ]
    }

    def queue_policy(rule_deps):
        return res(
            "aws:sqs/queuePolicy:QueuePolicy",
            {"policy": json.dumps(doc)},
            name="qp",
            deps={"queueUrl": ["urn:q"], "policy": ["urn:q", *rule_deps]},
        )

    assert violations([queue, target(), queue_policy(["urn:rule"])], policy) == []
    expected = [("target", "the dead-letter queue's policy does not admit EventBridge for this rule")]
    assert violations([queue, target()], policy) == expected
    assert violations([queue, target(), queue_policy(["urn:another-rule"])], policy) == expected


def replication_alarm(metric, region, name="alarm"):
    r = res(
        "aws:cloudwatch/metricAlarm:MetricAlarm",
        {"namespace": "AWS/S3", "metricName": metric},
        name=name,
        deps={"dimensions": ["urn:src", "urn:dst", "urn:repl"]},
    )
    r.region = region
    return r


def replicated_buckets():
    src = res("aws:s3/bucket:Bucket", {}, name="src")
    dst = res("aws:s3/bucket:Bucket", {}, name="dst")
    src.region, dst.region = "us-east-1", "us-west-2"
    repl = res(
        "aws:s3/bucketReplicationConfig:BucketReplicationConfig",
        {},
        name="repl",
        deps={"bucket": ["urn:src"], "rules": ["urn:dst", "urn:replica-key"]},
    )
    repl.region = "us-east-1"
    return [src, dst, repl]


def test_an_alarm_on_a_replication_metric_outside_the_region_that_publishes_it_is_caught():
    policy = "s3-replication-alarm-region"
    good = [
        replication_alarm("ReplicationLatency", "us-west-2", "latency"),
        replication_alarm("BytesPendingReplication", "us-west-2", "bytes"),
        replication_alarm("OperationsFailedReplication", "us-east-1", "failures"),
    ]
    assert violations([*replicated_buckets(), *good], policy) == []
    assert violations([*replicated_buckets(), replication_alarm("ReplicationLatency", "us-east-1")], policy) == [
        ("alarm", "S3 publishes ReplicationLatency in the destination bucket's region (us-west-2), not in us-east-1")
    ]
    assert violations(
        [*replicated_buckets(), replication_alarm("OperationsFailedReplication", "us-west-2")], policy
    ) == [
        (
            "alarm",
            "S3 publishes OperationsFailedReplication in the source bucket's region (us-east-1), not in us-west-2",
        )
    ]
    other = replication_alarm("NumberOfObjects", "eu-west-1")  # not a replication metric
    assert violations([*replicated_buckets(), other], policy) == []
