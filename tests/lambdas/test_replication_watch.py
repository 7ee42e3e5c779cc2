"""replication_watch: lag from the newest complete checkpoint in each bucket, completeness
from the manifest's file list, and nothing else looked at or changed."""

from __future__ import annotations

import time

import boto3
import botocore.exceptions
import pytest

from ftfleet import contract
from ftfleet.lambdas.common import aws
from ftfleet.lambdas.replication_watch import handler as watch
from ftfleet.lambdas.replication_watch.config import Config
from ftfleet.trainer.checkpoint.manifest import FileEntry, Manifest
from tests.lambdas.conftest import (
    PRIMARY,
    REGION,
    REPLICA,
    REPLICA_REGION,
    ROOT,
    RUN,
    STACK,
    FakeClock,
    configure,
    decisions,
    list_only_under,
    make_bucket,
    malformed_variants,
    metric_sum,
    s3_put,
    scheduled,
    throttle,
)

SHARDS = {"__0_0.distcp": b"a" * 10, "__1_0.distcp": b"b" * 12, ".metadata": b"m" * 3}
LATER = 900.0
DEFAULT = object()


@pytest.fixture
def watcher(moto, monkeypatch):
    make_bucket(PRIMARY)
    make_bucket(REPLICA, REPLICA_REGION)
    configure(
        monkeypatch,
        Config(
            stack=STACK, run_id=RUN, bucket=PRIMARY, replica_bucket=REPLICA, replica_region=REPLICA_REGION, root=ROOT
        ),
    )
    clock = FakeClock(time.time() + LATER)
    monkeypatch.setattr(watch, "clock", clock)
    return lambda event=DEFAULT: watch.handler(scheduled() if event is DEFAULT else event, None)


def checkpoint(bucket, step, region=REGION, skip=(), manifest=True, truncate=()):
    """A checkpoint as the trainer writes it: the shards, then the manifest listing them."""
    prefix = f"{ROOT}/{contract.step_dir_name(step)}"
    for name, data in SHARDS.items():
        if name not in skip:
            s3_put(bucket, f"{prefix}/{name}", data[:-1] if name in truncate else data, region)
    if manifest:
        files = {name: FileEntry(len(data), "00000000") for name, data in SHARDS.items()}
        text = Manifest(
            step=step, run_id=RUN, config_hash="h", world_size=2, files=files, torch_version="2.13.0"
        ).to_json()
        s3_put(bucket, f"{prefix}/{contract.MANIFEST_NAME}", text, region)


def lag():
    return metric_sum("ReplicationLagSeconds", {"Stack": STACK})


def test_a_replica_holding_the_newest_checkpoint_has_no_lag(watcher):
    for step in (100, 200):
        checkpoint(PRIMARY, step)
        checkpoint(REPLICA, step, REPLICA_REGION)
    result = watcher()
    assert (result["primary_newest"], result["replica_newest"], result["lag_s"]) == (200, 200, 0)
    assert lag() == 0 and metric_sum("ReplicaHasCompleteCheckpoint", {"Stack": STACK}) == 1
    assert metric_sum("NewestDurableStep", {"Stack": STACK}) == 200


def test_lag_is_the_age_of_the_oldest_checkpoint_the_replica_lacks(watcher):
    for step in (100, 200, 300):
        checkpoint(PRIMARY, step)
    checkpoint(REPLICA, 100, REPLICA_REGION)
    result = watcher()
    assert result["replica_newest"] == 100 and result["primary_newest"] == 300
    assert result["lag_s"] == pytest.approx(LATER, abs=30)  # step 200 has waited since it was written
    assert metric_sum("NewestDurableCheckpointAgeSeconds", {"Stack": STACK}) == pytest.approx(LATER, abs=30)


def test_a_replica_with_a_manifest_but_a_missing_or_short_shard_is_not_complete(watcher):
    checkpoint(PRIMARY, 100)
    checkpoint(PRIMARY, 200)
    checkpoint(REPLICA, 100, REPLICA_REGION, truncate=("__1_0.distcp",))
    checkpoint(REPLICA, 200, REPLICA_REGION, skip=("__0_0.distcp",))
    result = watcher()
    assert result["replica_newest"] is None
    assert metric_sum("ReplicaHasCompleteCheckpoint", {"Stack": STACK}) == 0
    assert result["lag_s"] > 0


def test_directories_without_a_manifest_and_other_prefixes_do_not_count(watcher):
    checkpoint(PRIMARY, 100)
    checkpoint(REPLICA, 100, REPLICA_REGION)
    checkpoint(PRIMARY, 200, manifest=False)  # being written
    s3_put(PRIMARY, f"{ROOT}/markers/i-0abc1234def567890.json", "{}")
    s3_put(PRIMARY, f"{ROOT}/{contract.INTERRUPTION_PRIOR_KEY}", "{}")
    result = watcher()
    assert (result["primary_newest"], result["lag_s"]) == (100, 0)


def test_a_run_without_checkpoints_reports_no_lag(watcher):
    result = watcher()
    assert result["decision"] == "no-checkpoint" and lag() == 0


def test_it_only_reads(watcher):
    checkpoint(PRIMARY, 100)
    seen = []
    for client in (aws.client("s3"), aws.client("s3", REPLICA_REGION)):
        client.meta.events.register("before-call.s3.*", lambda model, **kw: seen.append(model.name))
    watcher()
    assert seen and all(name.startswith(("List", "Get", "Head")) for name in seen)


def test_throttled_calls_are_retried(watcher):
    checkpoint(PRIMARY, 100)
    checkpoint(REPLICA, 100, REPLICA_REGION)
    hits = throttle(aws.client("s3", REPLICA_REGION), "ListObjectsV2", times=2)
    assert watcher()["replica_newest"] == 100 and len(hits) == 2


def test_duplicate_runs_are_harmless(watcher):
    checkpoint(PRIMARY, 100)
    checkpoint(REPLICA, 100, REPLICA_REGION)
    first, second = watcher(), watcher()
    assert {k: v for k, v in first.items() if k != "time"} == {k: v for k, v in second.items() if k != "time"}
    assert boto3.client("s3", region_name=REGION).list_objects_v2(Bucket=PRIMARY)["KeyCount"] == len(SHARDS) + 1


@pytest.mark.parametrize("event", malformed_variants(scheduled(), []))
def test_a_malformed_event_is_logged_and_dropped(no_aws, monkeypatch, capsys, event):
    # No AWS at all: a handler that went past validation would fail.
    configure(
        monkeypatch,
        Config(
            stack=STACK, run_id=RUN, bucket=PRIMARY, replica_bucket=REPLICA, replica_region=REPLICA_REGION, root=ROOT
        ),
    )
    assert watch.handler(event, None)["decision"] == "dropped"
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]


def test_a_step_being_written_does_not_fail_a_role_that_lists_only_its_prefix(watcher):
    # As AWS answers the function's role: a HEAD of the missing manifest is 403, not 404.
    checkpoint(PRIMARY, 100)
    checkpoint(REPLICA, 100, REPLICA_REGION)
    checkpoint(PRIMARY, 200, manifest=False)  # an export in progress, or an interrupted save
    checkpoint(REPLICA, 200, REPLICA_REGION, manifest=False)
    refused = list_only_under(aws.client("s3"), f"{ROOT}/")
    list_only_under(aws.client("s3", REPLICA_REGION), f"{ROOT}/", refused)
    result = watcher()
    assert (result["primary_newest"], result["replica_newest"], result["lag_s"]) == (100, 100, 0)
    assert refused == []  # it never asked what this role is refused


def test_the_stand_in_refuses_a_head_of_a_missing_key_as_s3_does(moto):
    make_bucket(PRIMARY)
    s3 = boto3.client("s3", region_name=REGION)
    refused = list_only_under(s3, f"{ROOT}/")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.head_object(Bucket=PRIMARY, Key=f"{ROOT}/step-1/{contract.MANIFEST_NAME}")
    assert info.value.response["Error"]["Code"] == "403" and refused == ["HeadObject"]
