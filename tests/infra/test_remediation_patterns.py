"""Every rule's event pattern, as the program renders it, routed by moto's own EventBridge
matching: the documented sample event reaches exactly its rule, near misses reach none."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from ftfleet import contract
from ftfleet.infra.aws import remediation_patterns as patterns
from tests.infra.conftest import recording
from tests.lambdas.conftest import cloudtrail_call, lifecycle_action, rebalance, spot_warning

REGION = "us-east-1"
NODE = "i-0abc1234def567890"


def rendered(stack="aws-prod", region=REGION):
    rec = recording(stack)
    return {
        r.inputs["name"].removeprefix(f"ftfleet-{stack}-"): json.loads(r.inputs["eventPattern"])
        for r in rec.of_type("aws:cloudwatch/eventRule:EventRule")
        if r.inputs.get("eventPattern") and rec.region_of(r) == region
    }


class Bus:
    """moto's default event bus with each rendered rule delivering to its own SQS queue."""

    def __init__(self, rules: dict[str, dict]):
        self.events = boto3.client("events", region_name=REGION)
        self.sqs = boto3.client("sqs", region_name=REGION)
        self.queues = {}
        for name, pattern in rules.items():
            url = self.sqs.create_queue(QueueName=name)["QueueUrl"]
            arn = self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
            self.events.put_rule(Name=name, EventPattern=json.dumps(pattern), State="ENABLED")
            self.events.put_targets(Rule=name, Targets=[{"Id": "q", "Arn": arn}])
            self.queues[name] = url

    def route(self, event: dict) -> set[str]:
        """The rules that received ``event``."""
        entry = {
            "Source": event["source"],
            "DetailType": event["detail-type"],
            "Detail": json.dumps(event["detail"]),
            "Resources": event.get("resources", []),
        }
        failed = self.events.put_events(Entries=[entry])["FailedEntryCount"]
        assert failed == 0
        got = set()
        for name, url in self.queues.items():
            if self.sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages"):
                got.add(name)
        return got


@pytest.fixture(scope="module")
def bus():
    with mock_aws():
        yield Bus(rendered())


@pytest.fixture(scope="module")
def names():
    rec = recording("aws-prod")
    groups = sorted(g.outputs["name"] for g in rec.of_type("aws:autoscaling/group:Group"))
    return {"groups": groups, "primary": rec.outputs["primary_bucket"], "replica": rec.outputs["replica_bucket"]}


def test_the_program_renders_the_builders_patterns(names):
    rules = rendered()
    assert rules["spot-interruption"] == patterns.spot_interruption()
    assert rules["rebalance"] == patterns.rebalance_recommendation()
    assert rules["lifecycle-action"] == patterns.lifecycle_action(names["groups"])
    assert rules["bucket-calls"] == patterns.bucket_calls([names["primary"], names["replica"]])
    assert rules["association-calls"] == patterns.association_calls()
    assert rendered(region="us-west-2") == {"bucket-calls-replica": patterns.bucket_calls([names["replica"]])}


def test_a_spot_interruption_warning_reaches_only_its_rule(bus):
    assert bus.route(spot_warning(NODE)) == {"spot-interruption"}


def test_a_rebalance_recommendation_reaches_only_its_rule(bus):
    assert bus.route(rebalance(NODE)) == {"rebalance"}


@pytest.mark.parametrize(
    "change",
    [
        {"detail-type": "EC2 Spot Instance Request Fulfillment"},
        {"detail-type": "EC2 Instance State-change Notification"},
        {"source": "aws.autoscaling"},
        {"source": "my.app"},
    ],
)
def test_near_misses_of_ec2_notices_reach_nothing(bus, change):
    assert bus.route({**spot_warning(NODE), **change}) == set()


def test_a_terminate_lifecycle_action_of_a_stack_group_reaches_only_its_rule(bus, names):
    for group in names["groups"]:
        assert bus.route(lifecycle_action(NODE, group, contract.TERMINATION_HOOK_NAME)) == {"lifecycle-action"}


@pytest.mark.parametrize("miss", ["other group", "other hook", "launch transition", "launch detail-type"])
def test_near_misses_of_lifecycle_actions_reach_nothing(bus, names, miss):
    event = lifecycle_action(NODE, names["groups"][0], contract.TERMINATION_HOOK_NAME)
    if miss == "other group":
        event["detail"]["AutoScalingGroupName"] = "someone-elses-group"
    elif miss == "other hook":
        event["detail"]["LifecycleHookName"] = "someone-elses-hook"
    elif miss == "launch transition":
        event["detail"]["LifecycleTransition"] = "autoscaling:EC2_INSTANCE_LAUNCHING"
    else:
        event["detail-type"] = "EC2 Instance-launch Lifecycle Action"
    assert bus.route(event) == set()


@pytest.mark.parametrize(
    "call", ["PutBucketVersioning", "DeleteBucketPolicy", "PutBucketLifecycle", "DeleteBucketReplication"]
)
def test_calls_that_weaken_a_stack_bucket_reach_the_drift_rule(bus, names, call):
    for bucket in (names["primary"], names["replica"]):
        assert bus.route(cloudtrail_call("aws.s3", call, {"bucketName": bucket})) == {"bucket-calls"}


@pytest.mark.parametrize(
    ("call", "bucket"),
    [("PutBucketPolicy", "someone-elses-bucket"), ("PutBucketTagging", None), ("PutObject", None)],
)
def test_near_misses_of_bucket_calls_reach_nothing(bus, names, call, bucket):
    assert bus.route(cloudtrail_call("aws.s3", call, {"bucketName": bucket or names["primary"]})) == set()


def test_association_changes_reach_the_drift_rule_and_creations_do_not(bus):
    for call in ("UpdateDataRepositoryAssociation", "DeleteDataRepositoryAssociation"):
        assert bus.route(cloudtrail_call("aws.fsx", call, {"associationId": "dra-0123456789abcdef0"})) == {
            "association-calls"
        }
    assert bus.route(cloudtrail_call("aws.fsx", "CreateDataRepositoryAssociation", {"fileSystemId": "fs-1"})) == set()


def test_the_replica_region_rule_takes_the_replica_s_calls_only(names):
    with mock_aws():
        replica_bus = Bus(rendered(region="us-west-2"))
        assert replica_bus.route(cloudtrail_call("aws.s3", "DeleteBucketPolicy", {"bucketName": names["replica"]})) == {
            "bucket-calls-replica"
        }
        assert (
            replica_bus.route(cloudtrail_call("aws.s3", "DeleteBucketPolicy", {"bucketName": names["primary"]}))
            == set()
        )
