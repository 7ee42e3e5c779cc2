"""spot_interruption: interruption warnings counted once per node into the prior, the
metrics and a tag; rebalance recommendations only recorded; everything else dropped."""

from __future__ import annotations

import json
import time

import boto3
import pytest

from ftfleet import contract
from ftfleet.lambdas.common import aws
from ftfleet.lambdas.common.events import iso
from ftfleet.lambdas.spot_interruption import handler as spot
from ftfleet.lambdas.spot_interruption.config import Config
from tests.lambdas.conftest import (
    PRIMARY,
    REGION,
    ROOT,
    RUN,
    STACK,
    configure,
    decisions,
    instance_tags,
    make_bucket,
    make_group,
    malformed_variants,
    metric_sum,
    rebalance,
    spot_warning,
    throttle,
)

GROUP = "ftfleet-aws-test-workers"
PRIOR_KEY = f"{ROOT}/{contract.INTERRUPTION_PRIOR_KEY}"


@pytest.fixture
def configured(monkeypatch):
    configure(
        monkeypatch,
        Config(stack=STACK, run_id=RUN, groups=(GROUP, "ftfleet-aws-test-coordinator"), bucket=PRIMARY, root=ROOT),
    )


@pytest.fixture
def fleet(moto, configured):
    make_bucket(PRIMARY)
    return make_group(GROUP, size=2, instance_type="g5.2xlarge")


def prior() -> contract.InterruptionPrior | None:
    s3 = boto3.client("s3", region_name=REGION)
    try:
        body = s3.get_object(Bucket=PRIMARY, Key=PRIOR_KEY)["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    return contract.parse_interruption_prior(body)


def interruptions_counted() -> float:
    return metric_sum(
        "SpotInterruptions", {"Stack": STACK, "AvailabilityZone": "us-east-1a", "InstanceType": "g5.2xlarge"}
    )


def test_an_interruption_warning_is_added_to_the_prior_counted_per_zone_and_type_and_tagged(fleet):
    result = spot.handler(spot_warning(fleet[0]), None)
    assert result["decision"] == "recorded" and result["kind"] == "interruption"
    recorded = prior()
    assert [i.node_id for i in recorded.interruptions] == [fleet[0]]
    assert recorded.interruptions[0].zone == "us-east-1a"
    assert recorded.interruptions[0].instance_type == "g5.2xlarge"
    assert recorded.run_id == RUN and recorded.cloud == "aws"
    assert interruptions_counted() == 1
    assert metric_sum("SpotInterruptions", {"Stack": STACK}) == 1
    assert instance_tags(fleet[0])[contract.SPOT_INTERRUPTION_TAG] == result["notice_at"]


def test_a_duplicate_delivery_counts_once(fleet):
    spot.handler(spot_warning(fleet[0]), None)
    again = spot.handler(spot_warning(fleet[0]), None)
    assert again["decision"] == "duplicate"
    assert len(prior().interruptions) == 1
    assert interruptions_counted() == 1


def test_two_interruptions_an_hour_apart_give_the_trainer_an_mtbf(fleet):
    now = time.time()
    first = spot.handler(spot_warning(fleet[0], time=iso(now - 3600)), None)
    second = spot.handler(spot_warning(fleet[1], time=iso(now)), None)
    assert first["job_mtbf_s"] is None  # one interruption says nothing yet
    assert second["job_mtbf_s"] == pytest.approx(3600.0, abs=5.0)
    recorded = prior()
    assert recorded.mtbf_s(recorded.interruptions[1].at) == pytest.approx(3600.0)


def test_an_instance_of_another_group_is_dropped_without_a_trace(fleet, capsys):
    (stranger,) = make_group("someone-elses-group", size=1)
    result = spot.handler(spot_warning(stranger), None)
    assert result["decision"] == "dropped" and result["reason"] == "instance of no group of this stack"
    assert result["group"] == "someone-elses-group"
    assert prior() is None
    assert interruptions_counted() == 0
    assert contract.SPOT_INTERRUPTION_TAG not in instance_tags(stranger)
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]


def test_an_instance_unknown_to_ec2_is_dropped(fleet):
    result = spot.handler(spot_warning("i-0123456789abcdef0"), None)
    assert result["decision"] == "dropped" and result["reason"] == "instance unknown to EC2"


@pytest.mark.parametrize(
    "event", malformed_variants(spot_warning("i-0123456789abcdef0"), ["instance-id", "instance-action"])
)
def test_a_malformed_event_is_logged_and_dropped(no_aws, configured, capsys, event):
    # No AWS at all: a handler that went past validation would fail.
    result = spot.handler(event, None)
    assert result["decision"] == "dropped"
    (line,) = decisions(capsys)
    assert line["decision"] == "dropped" and line["function"] == "spot_interruption" and line["reason"]


def test_an_unknown_instance_action_is_dropped(fleet):
    assert spot.handler(spot_warning(fleet[0], action="explode"), None)["decision"] == "dropped"


def test_a_rebalance_recommendation_is_only_recorded(fleet):
    asg = boto3.client("autoscaling", region_name=REGION)
    before = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]
    result = spot.handler(rebalance(fleet[0]), None)
    assert result["decision"] == "recorded" and result["kind"] == "rebalance"
    assert metric_sum("RebalanceRecommendations", {"Stack": STACK}) == 1
    assert instance_tags(fleet[0])[contract.REBALANCE_TAG] == result["notice_at"]
    after = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]
    assert after["DesiredCapacity"] == before["DesiredCapacity"]
    assert [(i["InstanceId"], i["HealthStatus"], i["LifecycleState"]) for i in after["Instances"]] == [
        (i["InstanceId"], i["HealthStatus"], i["LifecycleState"]) for i in before["Instances"]
    ]
    assert prior() is None  # advisory: not an interruption
    assert spot.handler(rebalance(fleet[0]), None)["decision"] == "duplicate"
    assert metric_sum("RebalanceRecommendations", {"Stack": STACK}) == 1


def test_throttled_calls_are_retried(fleet):
    tagging = throttle(aws.client("ec2"), "CreateTags", times=2)
    reading = throttle(aws.client("s3"), "GetObject", times=1)
    spot.handler(spot_warning(fleet[0]), None)
    spot.handler(spot_warning(fleet[1]), None)
    assert len(tagging) == 2 and len(reading) == 1
    assert len(prior().interruptions) == 2


def test_a_malformed_prior_is_replaced_not_fatal(fleet, capsys):
    boto3.client("s3", region_name=REGION).put_object(Bucket=PRIMARY, Key=PRIOR_KEY, Body=b"{not json")
    spot.handler(spot_warning(fleet[0]), None)
    assert [i.node_id for i in prior().interruptions] == [fleet[0]]
    lines = decisions(capsys)
    assert [d["decision"] for d in lines] == ["prior-replaced", "recorded"]


def test_the_prior_is_the_contract_s_format(fleet):
    spot.handler(spot_warning(fleet[0]), None)
    body = boto3.client("s3", region_name=REGION).get_object(Bucket=PRIMARY, Key=PRIOR_KEY)["Body"].read()
    assert json.loads(body)["format"] == contract.PRIOR_FORMAT
