"""capacity_watch: a group short of nodes for want of capacity, and since when.

Moto keeps the groups and their instances, but its DescribeScalingActivities always
answers an empty list: the tests stand in for that one call with activities shaped as
AWS documents them (DescribeScalingActivities, "Activity": newest first, StatusCode,
StatusMessage, Description, StartTime)."""

from __future__ import annotations

import datetime
import time

import boto3
import pytest

from ftfleet.lambdas.capacity_watch import handler as watch
from ftfleet.lambdas.capacity_watch.config import Config
from tests.lambdas.conftest import (
    REGION,
    RUN,
    STACK,
    FakeClock,
    configure,
    decisions,
    make_group,
    metric_sum,
    scheduled,
)

GROUP = "ftfleet-aws-test-workers"
NOW = time.time() + 3600
LOSS_S = 1200.0
INSUFFICIENT = (
    "Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have sufficient "
    "p5.48xlarge capacity in the Availability Zone you requested (us-east-1a). Launching EC2 instance failed."
)
#: A plain (not mixed) group's message, as the troubleshooting guide gives it.
PLAIN = (
    "We currently do not have sufficient p5.48xlarge capacity in the Availability Zone you requested "
    "(us-east-1a). Our system will be working on provisioning additional capacity. Launching EC2 instance failed."
)
NO_SPOT = (
    "Could not launch Spot Instances. UnfulfillableCapacity - Unable to fulfill capacity due to your request "
    "configuration."
)


def activity(
    minutes_ago: float, code: str, message: str = "", description: str = "Launching a new EC2 instance"
) -> dict:
    return {
        "ActivityId": f"a-{minutes_ago}",
        "AutoScalingGroupName": GROUP,
        "Description": description,
        "Cause": "an instance was started in response to a difference between desired and actual capacity",
        "StartTime": datetime.datetime.fromtimestamp(NOW - 60 * minutes_ago, datetime.UTC),
        "StatusCode": code,
        "StatusMessage": message,
        "Progress": 100,
    }


@pytest.fixture
def watcher(moto, monkeypatch):
    """A group asking for 4 nodes with 2 in service; ``run(activities)`` invokes the
    function with those as the group's record."""
    make_group(GROUP, size=2)
    boto3.client("autoscaling", region_name=REGION).update_auto_scaling_group(AutoScalingGroupName=GROUP, MaxSize=4)
    configure(monkeypatch, Config(stack=STACK, run_id=RUN, groups=(GROUP,), loss_s=LOSS_S))
    monkeypatch.setattr(watch, "clock", FakeClock(NOW))

    def run(activities: list[dict], desired: int = 4) -> dict:
        # Desired above what moto launched: it launches at once, so 2 stay in service
        # by setting the desired count on the record the function reads.
        real = watch.aws.client

        def client(service, region=None):
            c = real(service, region)
            if service == "autoscaling":
                describe = c.describe_auto_scaling_groups

                def short(**kw):
                    got = describe(**kw)
                    for g in got["AutoScalingGroups"]:
                        g["DesiredCapacity"] = desired
                    return got

                c.describe_auto_scaling_groups = short
            return c

        monkeypatch.setattr(watch.aws, "client", client)
        monkeypatch.setattr(watch, "activities_of", lambda _asg, name: activities if name == GROUP else [])
        return watch.handler(scheduled(), None)

    return run


def test_a_group_short_for_want_of_capacity_counts_from_the_first_failure_after_the_last_launch(watcher, capsys):
    record = [
        activity(5, "Failed", NO_SPOT),
        activity(15, "Failed", PLAIN),
        activity(25, "Failed", INSUFFICIENT),
        activity(40, "Successful", description="Launching a new EC2 instance: i-0123"),
        activity(90, "Failed", INSUFFICIENT),  # before the last launch that worked: over
    ]
    got = watcher(record)
    assert got["decision"] == "capacity-lost" and got["level"] == "WARNING"
    assert got["groups"][GROUP] == {"short": 2, "short_for_capacity_s": pytest.approx(25 * 60, abs=1)}
    assert metric_sum("CapacityShortSeconds", {"Stack": STACK}) == pytest.approx(25 * 60, abs=1)
    assert metric_sum("CapacityShortNodes", {"Stack": STACK}) == 2


@pytest.mark.parametrize("message", [INSUFFICIENT, PLAIN, NO_SPOT, "There is no Spot capacity available that matches"])
def test_each_documented_capacity_message_counts(message):
    assert watch.is_capacity_failure(activity(1, "Failed", message))
    assert watch.is_capacity_failure(activity(1, "Cancelled", message))
    assert not watch.is_capacity_failure(activity(1, "InProgress", message))
    assert not watch.is_capacity_failure(activity(1, "Failed", "VcpuLimitExceeded - You have requested more vCPU"))


def test_a_failure_before_the_group_was_last_resized_belongs_to_an_earlier_shortage(watcher):
    # Out of capacity 3 days ago, then shrunk to 0 (a failover): short again now, booting.
    record = [
        activity(2, "InProgress"),
        activity(60 * 24 * 3 - 10, "Successful", description="Terminating EC2 instance: i-0456"),
        activity(60 * 24 * 3, "Failed", INSUFFICIENT),
    ]
    got = watcher(record)
    assert got["decision"] == "short" and got["groups"][GROUP]["short_for_capacity_s"] == 0


def test_short_but_not_for_capacity_is_a_group_still_booting(watcher):
    got = watcher([activity(3, "InProgress"), activity(4, "Failed", "Instance failed to pass health check")])
    assert got["decision"] == "short" and got["groups"][GROUP]["short_for_capacity_s"] == 0


def test_a_shortage_younger_than_the_threshold_is_only_short(watcher):
    got = watcher([activity(10, "Failed", INSUFFICIENT)])
    assert got["decision"] == "short" and got["groups"][GROUP]["short_for_capacity_s"] == pytest.approx(600, abs=1)


def test_a_full_group_is_ok_whatever_its_record(watcher):
    got = watcher([activity(30, "Failed", INSUFFICIENT)], desired=2)
    assert got["decision"] == "ok" and got["groups"][GROUP] == {"short": 0, "short_for_capacity_s": 0.0}
    assert metric_sum("CapacityShortSeconds", {"Stack": STACK}) == 0


def test_a_group_gone_from_the_account_is_named(watcher, monkeypatch):
    configure(monkeypatch, Config(stack=STACK, run_id=RUN, groups=(GROUP, "ftfleet-aws-test-gone"), loss_s=LOSS_S))
    monkeypatch.setattr(watch, "clock", FakeClock(NOW))
    got = watcher([])
    assert got["missing_groups"] == ["ftfleet-aws-test-gone"]


def test_a_hostile_event_is_dropped_without_reading_a_group(watcher, capsys):
    assert (
        watch.handler({"source": "aws.ec2", "detail-type": "EC2 Instance State-change Notification"}, None)["decision"]
        == "dropped"
    )
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]
