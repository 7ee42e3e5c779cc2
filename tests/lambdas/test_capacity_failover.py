"""A standby's capacity_watch moves the run when the region it trains in lacks capacity.

Moto launches every instance a group asks for and answers DescribeScalingActivities
with an empty list: the tests stand in for a region out of capacity (its groups list no
instance, and their record holds launches failed for want of capacity, shaped as AWS
documents them). The buckets, the lease and the groups' sizes are moto's; S3
replication between the two buckets is a copy the tests make (moto does not replicate).
"""

from __future__ import annotations

import datetime
import json
import time

import boto3
import pytest
from botocore.exceptions import ClientError

from ftfleet.lambdas.capacity_watch import handler as watch
from ftfleet.lambdas.capacity_watch.config import Config
from ftfleet.lambdas.common import aws
from ftfleet.lambdas.common.config import FunctionConfigError
from ftfleet.lambdas.common.move import MOVE_TO_TAG, TAGS, LeaseRef, Pair, Side
from tests.infra.test_failover import (
    HOME_REGION,
    LEASE_KEY,
    PRIMARY,
    REPLICA,
    RUN,
    STANDBY_REGION,
    put_lease,
    replicate,
    sizes,
    two_regions,
)
from tests.lambdas.conftest import FakeClock, configure, scheduled

LOSS_S = 1200.0
ROOT = f"checkpoints/{RUN}"
HOME = Side("home", HOME_REGION, "home-coordinator", "home-workers", PRIMARY, ROOT)
STANDBY = Side("standby", STANDBY_REGION, "standby-coordinator", "standby-workers", REPLICA, ROOT)
NO_SPOT = "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot capacity available"


class Market:
    """Which groups the cloud has no capacity for, and since when (epoch seconds); the
    tags the function deleted, as it asked; resizes to refuse once (group names)."""

    def __init__(self) -> None:
        self.lost: dict[str, float] = {}
        self.deleted: list[dict] = []
        self.refuse_resize: set[str] = set()

    def activities(self, _asg, name: str) -> list[dict]:
        if name not in self.lost:
            return []
        start = datetime.datetime.fromtimestamp(self.lost[name], datetime.UTC)
        return [{"StatusCode": "Failed", "StatusMessage": NO_SPOT, "Description": "Launching", "StartTime": start}]

    def client(self, real):
        market = self

        class Autoscaling:
            def __init__(self, inner):
                self.inner = inner

            def __getattr__(self, name):
                return getattr(self.inner, name)

            def delete_tags(self, **kw):
                market.deleted += kw["Tags"]
                return self.inner.delete_tags(**kw)

            def update_auto_scaling_group(self, **kw):
                if kw["AutoScalingGroupName"] in market.refuse_resize:
                    market.refuse_resize.discard(kw["AutoScalingGroupName"])
                    error = {"Code": "ScalingActivityInProgress", "Message": "Scaling activity is in progress"}
                    raise ClientError({"Error": error}, "UpdateAutoScalingGroup")
                return self.inner.update_auto_scaling_group(**kw)

            def describe_auto_scaling_groups(self, **kw):
                got = self.inner.describe_auto_scaling_groups(**kw)
                for g in got["AutoScalingGroups"]:
                    if g["AutoScalingGroupName"] in market.lost:
                        g["Instances"] = []
                return got

        def client(service, region=None):
            c = real(service, region)
            return Autoscaling(c) if service == "autoscaling" else c

        return client


@pytest.fixture
def world(moto, monkeypatch, tmp_path):
    """The home trains on 3 workers (step-12 committed, step-10 replicated, the lease
    current); the standby's groups are at 0. The function runs in the standby's region."""
    for name in ("AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.setenv(name, STANDBY_REGION)
    two_regions(tmp_path)
    pair = Pair(HOME, STANDBY, LeaseRef.parse(f"s3://{PRIMARY}/{LEASE_KEY}", HOME_REGION, RUN))
    configure(
        monkeypatch,
        Config(
            stack="standby", run_id=RUN, groups=("standby-coordinator", "standby-workers"), loss_s=LOSS_S, failover=pair
        ),
    )
    clock = FakeClock(time.time())
    monkeypatch.setattr(watch, "clock", clock)
    market = Market()
    monkeypatch.setattr(watch, "activities_of", market.activities)
    monkeypatch.setattr(aws, "client", market.client(aws.client))
    return market, clock


def tags_of(name: str) -> list[dict]:
    asg = boto3.client("autoscaling", region_name=HOME_REGION)
    return asg.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"][0]["Tags"]


def invoke() -> dict:
    return watch.handler(scheduled(), None)


def lease() -> dict:
    body = boto3.client("s3", region_name=HOME_REGION).get_object(Bucket=PRIMARY, Key=LEASE_KEY)["Body"].read()
    return json.loads(body)


def test_the_standby_moves_the_run_once_the_home_has_lacked_capacity_long_enough(world):
    market, clock = world
    market.lost["home-workers"] = clock.now() - 600  # 10 minutes: not yet
    got = invoke()
    assert got["decision"] == "ok" and got["failover"] == {
        "move": None,
        "trains_in": "home",
        "short_for_capacity_s": 600.0,
    }
    assert sizes(HOME_REGION, "home-workers")[:2] == (1, 3)

    clock.t += LOSS_S  # 30 minutes without capacity: the move begins
    got = invoke()
    assert got["decision"] == "failover" and got["level"] == "WARNING"
    assert got["failover"]["move"] == "home -> standby" and not got["failover"]["done"]
    assert "stopping home" in got["failover"]["steps"][-1]
    assert sizes(HOME_REGION, "home-workers")[:2] == (0, 0) and sizes(HOME_REGION, "home-coordinator")[:2] == (0, 0)
    assert sizes(STANDBY_REGION, "standby-workers")[:2] == (0, 0)

    # Replication has not carried step-12 yet: the next invocation waits.
    clock.t += 120
    got = invoke()
    assert "holds step-10, home's newest is step-12" in got["failover"]["steps"][-1]
    assert sizes(STANDBY_REGION, "standby-workers")[:2] == (0, 0)

    replicate()
    clock.t += 120
    got = invoke()
    assert (
        got["failover"]["done"]
        and "resumes from step-12 once home's run lease has run out" in got["failover"]["steps"][-1]
    )
    assert sizes(STANDBY_REGION, "standby-workers")[:2] == (3, 3)
    assert sizes(STANDBY_REGION, "standby-coordinator")[:2] == (1, 1)
    # The lease is left to run out: only that proves no instance of the home commits.
    assert lease()["expires_at"] > 0 and lease()["holder"] == "home/us-east-1"
    # The move's tags are gone, deleted by key alone (a DeleteTags with a value deletes
    # only a tag of that value; moto ignores the value, AWS does not).
    assert market.deleted and all("Value" not in tag for tag in market.deleted)
    assert not {t["Key"] for t in tags_of("home-workers")} & set(TAGS)

    # The run trains in the standby now; the home's shortage no longer moves anything.
    clock.t += 120
    got = invoke()
    assert got["failover"] == {"move": None, "trains_in": "standby", "short_for_capacity_s": 0.0}


def test_replication_that_does_not_catch_up_in_time_costs_steps_not_the_job(world, monkeypatch):
    market, clock = world
    market.lost["home-workers"] = clock.now() - LOSS_S - 1
    invoke()
    clock.t += 900  # RTC's 15 minutes, and step-12 never came
    got = invoke()
    assert "going on from step-10" in " ".join(got["failover"]["steps"])
    assert got["failover"]["done"] and sizes(STANDBY_REGION, "standby-workers")[:2] == (3, 3)


def test_a_resize_refused_after_the_tags_were_written_is_taken_again(world):
    market, clock = world
    market.lost["home-workers"] = clock.now() - LOSS_S - 1
    market.refuse_resize.add("home-workers")
    with pytest.raises(ClientError, match="ScalingActivityInProgress"):
        watch.failover(watch.Config.from_env().failover, LOSS_S, clock.now())
    assert sizes(HOME_REGION, "home-workers")[:2] == (1, 3)  # tagged, not yet stopped
    clock.t += 120
    got = invoke()
    assert "  us-east-1 home-workers: min 0, desired 0" in got["failover"]["steps"]
    assert sizes(HOME_REGION, "home-workers")[:2] == (0, 0)


def test_a_standby_without_a_verified_checkpoint_is_refused_and_nothing_changes(world):
    market, clock = world
    s3 = boto3.client("s3", region_name=STANDBY_REGION)
    for o in s3.list_objects_v2(Bucket=REPLICA)["Contents"]:
        s3.delete_object(Bucket=REPLICA, Key=o["Key"])
    market.lost["home-workers"] = clock.now() - LOSS_S - 1
    got = invoke()
    assert got["decision"] == "failover-refused" and got["level"] == "ERROR"
    assert "holds no checkpoint that verifies" in got["failover"]["refused"]
    assert sizes(HOME_REGION, "home-workers")[:2] == (1, 3)
    assert MOVE_TO_TAG not in {t["Key"] for t in tags_of("home-workers")}


def test_the_standby_lacking_capacity_in_turn_moves_the_run_back(world):
    market, clock = world
    market.lost["home-workers"] = clock.now() - LOSS_S - 1
    replicate()
    while not invoke()["failover"].get("done"):
        clock.t += 120
    put_lease("standby/us-west-2", 60)  # the standby's nodes took it, then capacity went
    market.lost = {"standby-workers": clock.now()}
    clock.t += LOSS_S + 1
    got = invoke()
    assert got["failover"]["move"] == "standby -> home"
    clock.t += 120
    assert invoke()["failover"]["done"]
    assert sizes(HOME_REGION, "home-workers")[:2] == (3, 3) and sizes(STANDBY_REGION, "standby-workers")[:2] == (0, 0)


def test_the_failover_setting_reads_back_and_a_bad_one_is_named(monkeypatch):
    pair = Pair(HOME, STANDBY, LeaseRef.parse(f"s3://{PRIMARY}/{LEASE_KEY}", HOME_REGION, RUN), 300.0)
    cfg = Config(stack="standby", run_id=RUN, groups=("g",), loss_s=60.0, failover=pair)
    assert Config.from_env(cfg.to_env()).failover == pair
    plain = Config(stack="home", run_id=RUN, groups=("g",), loss_s=60.0)
    assert plain.to_env()["FTFLEET_FAILOVER"] == "" and Config.from_env(plain.to_env()).failover is None
    bad = {**cfg.to_env(), "FTFLEET_FAILOVER": json.dumps({**pair.to_json(), "home": {"stack": "home"}})}
    with pytest.raises(FunctionConfigError, match="FTFLEET_FAILOVER=.* is not a JSON object naming .*lacks region"):
        Config.from_env(bad)
