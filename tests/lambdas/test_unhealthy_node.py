"""unhealthy_node: a stalled node is marked Unhealthy, at a bounded rate, never while the
whole fleet is stalled, never before its grace period, never in another stack's group."""

from __future__ import annotations

import datetime
import json
import time

import boto3
import pytest

from ftfleet import contract
from ftfleet.lambdas.common import aws
from ftfleet.lambdas.unhealthy_node import handler as unhealthy
from ftfleet.lambdas.unhealthy_node.config import Config
from tests.lambdas.conftest import (
    PRIMARY,
    REGION,
    ROOT,
    RUN,
    STACK,
    FakeClock,
    configure,
    decisions,
    make_bucket,
    make_group,
    malformed_variants,
    metric_sum,
    scheduled,
    throttle,
)

GROUP = "ftfleet-aws-test-workers"
GRACE = 600.0
DEFAULT = object()


@pytest.fixture
def sweep(moto, monkeypatch):
    make_bucket(PRIMARY)
    clock = FakeClock(time.time() + 2 * GRACE)  # every node launched long enough ago
    monkeypatch.setattr(unhealthy, "clock", clock)

    def run(max_per_hour=2, groups=(GROUP,), event=DEFAULT):
        configure(
            monkeypatch,
            Config(
                stack=STACK,
                run_id=RUN,
                groups=groups,
                bucket=PRIMARY,
                root=ROOT,
                grace_s=GRACE,
                max_per_hour=max_per_hour,
            ),
        )
        return unhealthy.handler(scheduled() if event is DEFAULT else event, None)

    run.clock = clock
    return run


def publish(node_id, steps, clock, metric=contract.PROGRESS_METRIC, minutes=(1, 2, 3)):
    """The trainer's per-node data points, ``minutes`` before the sweep."""
    boto3.client("cloudwatch", region_name=REGION).put_metric_data(
        Namespace=contract.METRICS_NAMESPACE,
        MetricData=[
            {
                "MetricName": metric.name,
                "Dimensions": metric.dimensions(RUN, node_id),
                "Value": float(steps),
                "Unit": metric.unit,
                "Timestamp": datetime.datetime.fromtimestamp(clock.now() - 60 * m, datetime.UTC),
            }
            for m in minutes
        ],
    )


def health():
    asg = boto3.client("autoscaling", region_name=REGION)
    out = {}
    for group in asg.describe_auto_scaling_groups()["AutoScalingGroups"]:
        for i in group["Instances"]:
            out[i["InstanceId"]] = i["HealthStatus"]
    return out


def unhealthy_nodes():
    return sorted(i for i, h in health().items() if h == "Unhealthy")


def test_a_node_without_progress_is_marked_unhealthy_and_the_others_are_not(sweep):
    a, b, c = make_group(GROUP, size=3)
    publish(a, 40, sweep.clock)
    publish(b, 40, sweep.clock)
    publish(c, 0, sweep.clock)
    result = sweep()
    assert result["replaced"] == [c] and result["stalled"] == [c]
    assert unhealthy_nodes() == [c]
    assert metric_sum("NodesReplaced", {"Stack": STACK, "Reason": "no-progress"}) == 1
    assert metric_sum("NodesWithoutProgress", {"Stack": STACK}) == 1


def test_a_node_that_published_and_then_went_silent_counts_as_stalled(sweep):
    a, b, c = make_group(GROUP, size=3)
    publish(a, 40, sweep.clock)
    publish(b, 40, sweep.clock)
    publish(c, 40, sweep.clock, minutes=(30, 31))  # long before the grace window
    assert sweep()["replaced"] == [c]


def test_a_node_that_never_published_is_withheld_and_never_replaced(sweep, capsys):
    a, b, c = make_group(GROUP, size=3)
    publish(a, 40, sweep.clock)
    publish(b, 40, sweep.clock)
    result = sweep()
    assert result["replaced"] == [] and result["withheld"] == [c]
    assert unhealthy_nodes() == []
    (withheld,) = [d for d in decisions(capsys) if d["decision"] == "withheld"]
    assert (withheld["reason"], withheld["instance_id"]) == ("never-published", c)
    assert metric_sum("ReplacementsWithheld", {"Stack": STACK, "Reason": "never-published"}) == 1


def test_a_node_inside_its_grace_period_is_not_judged(sweep):
    make_group(GROUP, size=2)
    sweep.clock.t = time.time()  # just launched
    result = sweep()
    assert result["judged"] == 0 and unhealthy_nodes() == []


def test_a_run_that_never_published_progress_is_not_judged(sweep):
    make_group(GROUP, size=1)
    result = sweep()
    assert result["decision"] == "not-judged" and unhealthy_nodes() == []


def test_a_fleet_wide_stall_replaces_nobody(sweep, capsys):
    a, b, c = make_group(GROUP, size=3)
    publish(a, 40, sweep.clock)
    publish(b, 0, sweep.clock)
    result = sweep()
    assert result["fleet_stalled"] and result["replaced"] == [] and sorted(result["withheld"]) == sorted([b, c])
    assert unhealthy_nodes() == []
    assert metric_sum("ReplacementsWithheld", {"Stack": STACK}) == 2
    withheld = [d for d in decisions(capsys) if d["decision"] == "withheld"]
    assert {d["reason"] for d in withheld} == {"fleet-stalled"}


def test_gpu_errors_replace_a_node_even_when_the_fleet_is_stalled(sweep):
    a, b, c = make_group(GROUP, size=3)
    publish(a, 0, sweep.clock)
    publish(b, 0, sweep.clock)
    publish(c, 0, sweep.clock)
    publish(b, 2, sweep.clock, metric=contract.GPU_ERRORS_METRIC, minutes=(1,))
    result = sweep()
    assert result["replaced"] == [b] and result["fleet_stalled"]
    assert unhealthy_nodes() == [b]


def test_replacements_per_group_and_hour_never_exceed_the_limit(sweep):
    ids = make_group(GROUP, size=5)
    for node in ids[:3]:
        publish(node, 40, sweep.clock)
    for node in ids[3:]:
        publish(node, 0, sweep.clock)
    result = sweep(max_per_hour=1)
    assert len(result["replaced"]) == 1 and len(result["withheld"]) == 1
    assert len(unhealthy_nodes()) == 1
    assert sweep(max_per_hour=1)["replaced"] == []  # same hour: still withheld
    assert len(unhealthy_nodes()) == 1
    sweep.clock.t += 3601
    for node in ids[:3]:
        publish(node, 40, sweep.clock)
    for node in ids[3:]:
        publish(node, 0, sweep.clock)
    assert len(sweep(max_per_hour=1)["replaced"]) == 1
    assert len(unhealthy_nodes()) == 2
    log = json.loads(
        boto3.client("s3", region_name=REGION)
        .get_object(Bucket=PRIMARY, Key=f"{ROOT}/{unhealthy.REPLACEMENTS_KEY}")["Body"]
        .read()
    )
    assert len(log["groups"][GROUP]) == 1  # the entry of the previous hour has aged out


def test_nodes_of_other_groups_and_nodes_in_standby_are_ignored(sweep):
    ours = make_group(GROUP, size=3)
    (theirs,) = make_group("someone-elses-group", size=1)
    for node in ours:
        publish(node, 40, sweep.clock)
    asg = boto3.client("autoscaling", region_name=REGION)
    asg.update_auto_scaling_group(AutoScalingGroupName=GROUP, MinSize=0)
    asg.enter_standby(InstanceIds=[ours[0]], AutoScalingGroupName=GROUP, ShouldDecrementDesiredCapacity=True)
    publish(ours[0], 0, sweep.clock)
    result = sweep()
    assert result["judged"] == 2 and result["replaced"] == []
    assert unhealthy_nodes() == []
    assert theirs not in json.dumps(result)


def test_a_duplicate_sweep_replaces_nobody_twice(sweep):
    a, b, c = make_group(GROUP, size=3)
    publish(a, 40, sweep.clock)
    publish(b, 40, sweep.clock)
    publish(c, 0, sweep.clock)
    sweep()
    again = sweep()
    assert again["replaced"] == [] and unhealthy_nodes() == [c]
    assert metric_sum("NodesReplaced", {"Stack": STACK}) == 1


def test_throttled_calls_are_retried(sweep):
    a, b, c = make_group(GROUP, size=3)
    publish(a, 40, sweep.clock)
    publish(b, 40, sweep.clock)
    publish(c, 0, sweep.clock)
    hits = throttle(aws.client("autoscaling"), "SetInstanceHealth", times=2)
    assert sweep()["replaced"] == [c] and len(hits) == 2
    assert unhealthy_nodes() == [c]


@pytest.mark.parametrize("event", malformed_variants(scheduled(), []))
def test_a_malformed_event_is_logged_and_dropped(no_aws, monkeypatch, capsys, event):
    # No AWS at all: a handler that went past validation would fail.
    configure(
        monkeypatch,
        Config(stack=STACK, run_id=RUN, groups=(GROUP,), bucket=PRIMARY, root=ROOT, grace_s=GRACE, max_per_hour=2),
    )
    result = unhealthy.handler(event, None)
    assert result["decision"] == "dropped"
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]
