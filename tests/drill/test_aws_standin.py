"""The AWS stand-in plays a region out of capacity, which moto cannot: a marked group
lists no instance and its record holds one launch failed for want of spot capacity, in
the Auto Scaling API's shape (boto3 parses it, the capacity_watch function reads it);
every other group is answered by moto, unchanged."""

from __future__ import annotations

import datetime
import time

import boto3
import pytest

from drill.aws_standin import NO_SPOT_CAPACITY, AwsStandIn
from ftfleet.lambdas.capacity_watch.handler import is_capacity_failure, measure, short_since


@pytest.fixture(scope="module")
def standin():
    with AwsStandIn() as server:
        yield server


def autoscaling(standin, region="us-east-1"):
    return boto3.client(
        "autoscaling", endpoint_url=standin.url, region_name=region, aws_access_key_id="x", aws_secret_access_key="x"
    )


def group(standin, name: str, size: int, region: str = "us-east-1") -> None:
    ec2 = boto3.client(
        "ec2", endpoint_url=standin.url, region_name=region, aws_access_key_id="x", aws_secret_access_key="x"
    )
    ec2.create_launch_template(LaunchTemplateName=f"{name}-lt", LaunchTemplateData={"ImageId": "ami-12c6146b"})
    autoscaling(standin, region).create_auto_scaling_group(
        AutoScalingGroupName=name,
        LaunchTemplate={"LaunchTemplateName": f"{name}-lt"},
        MinSize=size,
        MaxSize=2,
        DesiredCapacity=size,
        AvailabilityZones=[f"{region}a"],
    )


def instances(standin, *names: str, region: str = "us-east-1") -> dict[str, int]:
    got = autoscaling(standin, region).describe_auto_scaling_groups(AutoScalingGroupNames=list(names))
    return {g["AutoScalingGroupName"]: len(g["Instances"]) for g in got["AutoScalingGroups"]}


def test_a_group_out_of_capacity_lists_no_instance_and_the_others_keep_theirs(standin):
    group(standin, "oc-lost-workers", 1)
    group(standin, "oc-kept-workers", 1)
    assert instances(standin, "oc-lost-workers", "oc-kept-workers") == {"oc-lost-workers": 1, "oc-kept-workers": 1}
    standin.lose_capacity("oc-lost-workers")
    assert instances(standin, "oc-lost-workers", "oc-kept-workers") == {"oc-lost-workers": 0, "oc-kept-workers": 1}
    assert autoscaling(standin).describe_scaling_activities(AutoScalingGroupName="oc-kept-workers")["Activities"] == []


def test_a_group_out_of_capacity_records_one_failed_spot_launch_from_when_it_was_marked(standin):
    group(standin, "oc-failed-workers", 1, region="us-west-2")
    since = standin.lose_capacity("oc-failed-workers", at=time.time() - 30)
    got = autoscaling(standin, "us-west-2").describe_scaling_activities(
        AutoScalingGroupName="oc-failed-workers", MaxRecords=100
    )
    (activity,) = got["Activities"]
    assert activity["StatusCode"] == "Failed" and activity["AutoScalingGroupName"] == "oc-failed-workers"
    assert activity["StatusMessage"].startswith(NO_SPOT_CAPACITY)
    assert "InsufficientInstanceCapacity" in activity["Description"] and "us-west-2a" in activity["Details"]
    assert isinstance(activity["StartTime"], datetime.datetime)
    assert activity["StartTime"].timestamp() == pytest.approx(since, abs=0.001)
    assert is_capacity_failure(activity) and short_since([activity]) == pytest.approx(since, abs=0.001)


def test_the_capacity_watch_reads_a_marked_group_as_short_for_want_of_capacity_since_the_mark(standin):
    group(standin, "oc-watched-workers", 1)
    group(standin, "oc-watched-coordinator", 1)
    since = standin.lose_capacity("oc-watched-workers", at=time.time() - 45)
    short, longest, groups = measure(autoscaling(standin), ["oc-watched-workers", "oc-watched-coordinator"], since + 45)
    assert (short, longest) == (1, pytest.approx(45, abs=0.01))
    assert groups["oc-watched-coordinator"] == {"short": 0, "short_for_capacity_s": 0.0}


def test_capacity_restored_gives_the_group_back_its_instances_and_an_empty_record(standin):
    group(standin, "oc-back-workers", 1)
    standin.lose_capacity("oc-back-workers")
    standin.restore_capacity("oc-back-workers")
    assert instances(standin, "oc-back-workers") == {"oc-back-workers": 1}
    assert autoscaling(standin).describe_scaling_activities(AutoScalingGroupName="oc-back-workers")["Activities"] == []
