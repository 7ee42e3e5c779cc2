"""A GCP standby's capacity watch moves the run (standbyAutoFailover): against the
stand-in for Compute Engine's REST API (drill/gcp_standin.py), the Cloud Storage
emulator (the shared bucket: checkpoints, lease, the watch's state and the move's
record) and the recording Cloud Monitoring of test_gcp_functions.py."""

from __future__ import annotations

import json

import pytest

from drill.gcp_standin import STOCKOUT, Compute
from ftfleet.lambdas.common import gcp, gcp_groups
from ftfleet.lambdas.common.pair import LeaseRef, Pair, Side
from ftfleet.lambdas.gcp_capacity_watch import config as capacity_config
from ftfleet.lambdas.gcp_capacity_watch import handler as watch
from ftfleet.lambdas.gcp_capacity_watch.config import Config
from tests.gcs_emulator import gcs_client
from tests.infra.test_failover_gcp import LEASE_KEY, ROOT, RUN, put_lease, put_step
from tests.lambdas import test_gcp_functions as gcp_functions
from tests.lambdas.conftest import FakeClock, configure
from tests.lambdas.test_gcp_functions import PROJECT, monitoring, pubsub  # noqa: F401

HOME_REGION, STANDBY_REGION = "us-central1", "us-east1"
LOSS_S = 1200.0
T0 = 1_767_571_200.0


def side(stack: str, region: str, bucket: str) -> Side:
    return Side(
        stack,
        region,
        f"{stack}-coordinator",
        f"{stack}-workers",
        bucket,
        ROOT,
        cloud="gcp",
        project=PROJECT,
        more_worker_groups=(f"{stack}-workers-ondemand",),
    )


@pytest.fixture(autouse=True)
def _descriptors(monkeypatch):
    for metric in capacity_config.METRICS:
        monkeypatch.setitem(gcp_functions.DESCRIPTORS, metric.type, metric)


@pytest.fixture
def world(gcs_bucket, monitoring, tmp_path, monkeypatch):  # noqa: F811 - the imported fixture
    """The home trains (1 coordinator, 3 Spot + 1 on-demand workers) and holds the lease;
    its Spot zone then runs out of resources. ``run(now)`` invokes the standby's watch."""
    clock = {"now": T0}
    compute = Compute(PROJECT, clock=lambda: clock["now"])
    monkeypatch.setenv("FTFLEET_COMPUTE_ENDPOINT", compute.url)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    gcp_groups.reset()
    gcp.reset()
    for name, size, region in (
        ("home-coordinator", 1, HOME_REGION),
        ("home-workers", 3, HOME_REGION),
        ("home-workers-ondemand", 1, HOME_REGION),
        ("standby-coordinator", 1, STANDBY_REGION),  # active: its VM runs
        ("standby-workers", 0, STANDBY_REGION),
        ("standby-workers-ondemand", 0, STANDBY_REGION),
    ):
        compute.group(name, size, ready=size, region=region)
    put_step(tmp_path, gcs_bucket, 12)
    put_lease(gcs_bucket, f"home/{HOME_REGION}", 60)
    standby = side("standby", STANDBY_REGION, gcs_bucket)
    pair = Pair(side("home", HOME_REGION, gcs_bucket), standby, LeaseRef(gcs_bucket, LEASE_KEY, HOME_REGION, RUN))
    cfg = Config(
        stack="standby",
        run_id=RUN,
        project=PROJECT,
        region=STANDBY_REGION,
        groups=(standby.coordinator_group, *standby.worker_groups),
        loss_s=LOSS_S,
        bucket=gcs_bucket,
        state_key=f"{ROOT}/fleet/capacity-watch-standby.json",
        failover=pair,
    )
    configure(monkeypatch, cfg)

    def run(now: float) -> dict:
        clock["now"] = now
        monkeypatch.setattr(watch, "clock", FakeClock(now))
        return watch.handler(pubsub({}))

    yield compute, run
    compute.close()
    gcp_groups.reset()
    gcp.reset()


def targets(compute: Compute) -> dict[str, int]:
    return {name: g["target"] for name, g in compute.groups.items()}


def test_the_config_carries_the_pair_and_reads_back(world):
    cfg = Config.from_env()
    assert cfg.failover.home.cloud == "gcp" and cfg.failover.home.more_worker_groups == ("home-workers-ondemand",)


def test_the_standby_moves_the_run_once_the_home_has_lacked_capacity_long_enough(world):
    compute, run = world
    out = run(T0)
    assert out["failover"] == {"move": None, "trains_in": "home", "short_for_capacity_s": 0.0}
    # A preemption; the zone has no Spot capacity left for its replacement.
    compute.groups["home-workers"]["instances"].pop()
    compute.groups["home-workers"]["errors"] = [(T0 + 60, STOCKOUT)]
    assert run(T0 + 120)["failover"]["short_for_capacity_s"] == 60.0
    compute.groups["home-workers"]["errors"].insert(0, (T0 + 1200, STOCKOUT))
    out = run(T0 + 1300)
    assert out["decision"] == "failover" and out["level"] == "WARNING"
    assert out["failover"]["move"] == "home -> standby" and out["failover"]["done"] is False
    assert targets(compute)["home-workers"] == 0 and targets(compute)["home-coordinator"] == 0
    out = run(T0 + 1420)  # the home's VMs run their shutdown scripts
    assert out["failover"]["steps"] == ["waiting: 4 instance(s) of home still leaving"]
    compute.settle()
    out = run(T0 + 1540)
    assert out["failover"]["done"] is True
    assert {k: v for k, v in targets(compute).items() if k.startswith("standby")} == {
        "standby-coordinator": 1,
        "standby-workers": 3,
        "standby-workers-ondemand": 1,
    }
    compute.settle()
    # The run trains in the standby now: the watch measures there and moves no more; it
    # says at every run that the home, its coordinator VM deleted, could not take it back.
    out = run(T0 + 1660)
    assert (out["decision"], out["level"]) == ("failover-unready", "WARNING")
    assert out["failover"]["trains_in"] == "standby" and out["failover"]["short_for_capacity_s"] == 0.0
    assert out["failover"]["cannot_move"].endswith("then `pulumi up --refresh -s home`")
    state = json.loads(
        gcs_client().bucket(Config.from_env().bucket).blob(Config.from_env().state_key).download_as_bytes()
    )
    assert set(state["groups"]) >= {"home-workers", "standby-workers"}


def test_a_move_with_no_verified_checkpoint_is_refused_as_an_error_and_nothing_changes(world):
    compute, run = world
    bucket = gcs_client().bucket(Config.from_env().bucket)
    for blob in bucket.list_blobs(prefix=f"{ROOT}/step-"):
        blob.delete()
    compute.groups["home-workers"]["instances"].pop()
    compute.groups["home-workers"]["errors"] = [(T0, STOCKOUT)]
    run(T0 + 60)
    out = run(T0 + LOSS_S + 60)
    assert out["decision"] == "failover-refused" and out["level"] == "ERROR"
    assert "holds no checkpoint that verifies" in out["failover"]["refused"]
    assert targets(compute)["home-workers"] == 3 and targets(compute)["standby-workers"] == 0


def test_no_move_into_a_region_itself_short_for_capacity(world):
    compute, run = world
    compute.groups["home-workers"]["instances"].pop()
    compute.groups["home-workers"]["errors"] = [(T0, STOCKOUT)]
    compute.groups["standby-workers-ondemand"].update(target=1, errors=[(T0 + 60, STOCKOUT)])
    run(T0 + 60)
    out = run(T0 + LOSS_S + 60)
    assert out["failover"]["target_short_for_capacity_s"] > 0 and not out["failover"].get("steps")
    assert targets(compute)["home-workers"] == 3 and targets(compute)["standby-workers"] == 0
