"""retention_sweep: the bucket keeps exactly what the run's recorded policy keeps, each
deleted checkpoint loses its manifest first, and nothing unreadable, young or outside the
run's root is touched."""

from __future__ import annotations

import time

import boto3
import botocore.exceptions
import pytest

from ftfleet import contract, retention
from ftfleet.lambdas.common import aws
from ftfleet.lambdas.retention_sweep import handler as sweep
from ftfleet.lambdas.retention_sweep.config import Config
from ftfleet.trainer.checkpoint.manifest import FileEntry, Manifest
from tests.lambdas.conftest import (
    PRIMARY,
    ROOT,
    RUN,
    STACK,
    Context,
    FakeClock,
    configure,
    decisions,
    list_only_under,
    make_bucket,
    metric_sum,
    s3_put,
    scheduled,
)
from tests.trainer.checkpoint.test_retention import HOUR, START, expected_month_end

SHARD = b"s" * 8
DAY = 86400.0


@pytest.fixture
def swept(moto, monkeypatch):
    """Runs the sweep; ``swept(now=..., context=...)``."""
    make_bucket(PRIMARY)
    # The stack's fallback keeps little, so that a test of anything else sees it delete.
    configure(monkeypatch, Config(stack=STACK, run_id=RUN, bucket=PRIMARY, root=ROOT, rules=("all for 1h",)))

    def run(now: float | None = None, context: Context | None = None) -> dict:
        monkeypatch.setattr(sweep, "clock", FakeClock(time.time() if now is None else now))
        return sweep.handler(scheduled(), context or Context())

    return run


def checkpoint(step, created_at, *, manifest=True, milestone=None, policy=None, files=True, text=None, references=()):
    """A checkpoint as the trainer uploads it: its shard, then the manifest listing it
    (and ``references``: the steps whose shard it references)."""
    prefix = f"{ROOT}/{contract.step_dir_name(step)}"
    if files:
        s3_put(PRIMARY, f"{prefix}/__0_0.distcp", SHARD)
    if manifest:
        entry = FileEntry(len(SHARD), "00000000")
        m = Manifest(
            step, RUN, "h", 1, {"__0_0.distcp": entry}, "2.13.0",
            created_at=created_at, milestone=milestone, retention=policy,
            references={r: {"__0_0.distcp": entry} for r in references},
        )  # fmt: skip
        s3_put(PRIMARY, f"{prefix}/{contract.MANIFEST_NAME}", text if text is not None else m.to_json())


def keys() -> list[str]:
    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=PRIMARY)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


def committed() -> list[int]:
    steps = (contract.parse_step_dir(k.split("/")[-2]) for k in keys() if k.endswith(contract.MANIFEST_NAME))
    return sorted(s for s in steps if s is not None)


def step_dirs() -> set[int]:
    return {contract.parse_step_dir(k.split("/")[-2]) for k in keys() if k.startswith(f"{ROOT}/")}


def test_nine_days_of_checkpoints_keep_exactly_the_default_schedules_set(swept):
    times = {}
    for i in range(9 * 8):  # every 3 hours
        times[(i + 1) * 10] = START + i * 3 * HOUR
        checkpoint((i + 1) * 10, times[(i + 1) * 10], policy=retention.Policy())  # the trainer's default
    result = swept()
    assert committed() == sorted(expected_month_end(times))
    assert step_dirs() == set(committed())  # every object of a deleted step is gone
    assert len(result["deleted"]) == len(times) - len(committed()) and result["failed"] == []
    assert metric_sum("RetentionDeleted", {"Stack": STACK}) == len(result["deleted"])
    assert swept()["deleted"] == []  # swept again: nothing more goes


def test_the_newest_manifests_policy_wins_and_pins_and_milestones_are_kept(swept):
    best = retention.Milestone("loss", "min", 1.5, "best")
    surpassed = retention.Milestone("loss", "min", 2.0, "best")
    for i in range(10):
        checkpoint(i, START + i * DAY, milestone={3: surpassed, 5: best}.get(i))
    checkpoint(10, START + 10 * DAY, policy=retention.Policy(("all for 2d",), (2,)))
    swept()
    assert committed() == [2, 5, 9, 10]  # pinned, the best milestone, "all for 2d"


def test_a_referenced_checkpoint_stays_until_no_manifest_names_it(swept):
    checkpoint(1, START)
    checkpoint(2, START + DAY, references=[1])  # incremental: step-1's shard holds some of it
    checkpoint(3, START + 2 * DAY, files=False, references=[1])  # its own shard is missing
    checkpoint(4, START + 3 * DAY)
    swept(now=START + 3 * DAY)
    # 4: newest; 1: referenced by manifests that were there; 2, 3 go (3 was never complete).
    assert committed() == [1, 4]
    swept(now=START + 3 * DAY)
    assert committed() == [4] and step_dirs() == {4}


def test_each_deleted_checkpoint_loses_its_manifest_before_any_other_object(swept):
    for i in range(4):
        checkpoint(i, START + i * DAY)
    order: list[str] = []
    client = aws.client("s3")

    def record(params, **kwargs):
        keys = [params["Key"]] if "Key" in params else [o["Key"] for o in params["Delete"]["Objects"]]
        order.extend(keys)

    client.meta.events.register("provide-client-params.s3.DeleteObject", record)
    client.meta.events.register("provide-client-params.s3.DeleteObjects", record)
    result = swept()
    assert result["deleted"] == [0, 1, 2]
    for step in (0, 1, 2):
        prefix = f"{ROOT}/{contract.step_dir_name(step)}/"
        mine = [k for k in order if k.startswith(prefix)]
        assert mine == [f"{prefix}{contract.MANIFEST_NAME}", f"{prefix}__0_0.distcp"]


def test_unreadable_manifests_and_the_newest_complete_checkpoint_are_kept(swept):
    for i in range(5):
        checkpoint(i, START + i * DAY)
    checkpoint(1, 0, files=False, text="{not json")
    checkpoint(6, START + 6 * DAY, files=False)  # committed, its shard not there yet
    swept()
    # 1: unreadable (it may reference 0, which stays too); 4: newest complete; 6: newest.
    assert committed() == [0, 1, 4, 6]


def test_debris_goes_once_a_day_old_and_never_past_the_newest_checkpoint(swept):
    for i in range(3):
        checkpoint(i * 10, START + i * DAY)
    checkpoint(5, 0, manifest=False)  # a crashed upload
    checkpoint(25, 0, manifest=False)  # an upload still arriving, newer than the newest
    swept()  # its objects were written just now: it may still be arriving
    assert step_dirs() >= {5, 25}
    result = swept(now=time.time() + DAY + 60)
    assert 5 in result["deleted"] and 5 not in step_dirs() and 25 in step_dirs()


def test_a_step_that_does_not_delete_is_counted_and_the_others_go(swept, monkeypatch):
    for i in range(4):
        checkpoint(i, START + i * DAY)
    real = sweep.Bucket.remove

    def remove(self, step, listed):
        if step == 1:
            raise RuntimeError("AccessDenied")
        real(self, step, listed)

    monkeypatch.setattr(sweep.Bucket, "remove", remove)
    result = swept()
    assert result["failed"] == [1] and result["deleted"] == [0, 2] and result["level"] == "WARNING"
    assert committed() == [1, 3]
    assert metric_sum("RetentionFailures", {"Stack": STACK}) == 1


def test_a_sweep_short_of_time_decides_nothing_on_part_of_the_bucket(swept, monkeypatch):
    for i in range(3):
        checkpoint(i, START + i * DAY)
    result = swept(context=Context(remaining_s=sweep.RESERVE_S - 1))
    assert result["decision"] == "survey-incomplete" and committed() == [0, 1, 2]
    assert metric_sum("RetentionFailures", {"Stack": STACK}) == 1
    # Surveyed in time, then short of it: the deletions left for the next hour.
    times = iter([900.0] * 3 + [sweep.RESERVE_S - 1] * 10)  # one look per manifest read
    monkeypatch.setattr(sweep.runtime, "remaining_s", lambda context: next(times))
    result = swept()
    assert result["deleted"] == [] and result["left_for_next"] == [0, 1] and committed() == [0, 1, 2]


def test_it_lists_only_under_its_root_and_touches_nothing_else(swept, capsys):
    s3_put(PRIMARY, "checkpoints/other-run/step-1/manifest.json", "{}")
    s3_put(PRIMARY, f"{ROOT}/not-a-step/x", b"x")
    for i in range(3):
        checkpoint(i, START + i * DAY)
    refused = list_only_under(aws.client("s3"), f"{ROOT}/")
    swept()
    assert refused == []
    assert {"checkpoints/other-run/step-1/manifest.json", f"{ROOT}/not-a-step/x"} <= set(keys())
    assert decisions(capsys)[-1]["decision"] == "swept"


def test_a_manifest_gone_or_unreadable_when_read_does_not_stop_the_sweep(swept, monkeypatch):
    from tests.lambdas.conftest import client_error

    for i in range(5):
        checkpoint(i, START + i * DAY)
    real = sweep.Bucket.read

    def read(self, key):
        if "/step-1/" in key:
            raise client_error("NoSuchKey", "gone", "GetObject")  # pruned since the listing
        if "/step-2/" in key:
            raise client_error("AccessDenied", "denied", "GetObject")
        return real(self, key)

    monkeypatch.setattr(sweep.Bucket, "read", read)
    result = swept()
    # 2 kept: it could not be read, and 0 below it, which it may reference; 1 read as
    # gone is no checkpoint to this sweep (the stand-in leaves its objects).
    assert result["deleted"] == [3] and committed() == [0, 1, 2, 4]


def test_an_object_written_since_the_listing_is_not_deleted(swept, monkeypatch):
    """S3 refuses a delete whose If-Match (DeleteObject) or ETag (DeleteObjects) no longer
    holds. moto enforces the first and ignores the second: the stand-in below refuses a
    DeleteObjects entry whose ETag is not the object's, as S3 documents."""
    for i in range(3):
        checkpoint(i, START + i * DAY)
    real = sweep.Bucket.remove

    def remove(self, step, listed):
        if step == 0:  # the step's upload starts again between the listing and the delete
            checkpoint(0, START + 1)  # a new manifest (another time), the same shard
        real(self, step, listed)

    s3 = aws.client("s3")

    def enforce(params, **kwargs):
        for entry in params["Delete"]["Objects"]:
            current = s3.head_object(Bucket=params["Bucket"], Key=entry["Key"])["ETag"]
            if entry.get("ETag") != current:
                raise botocore.exceptions.ClientError(
                    {"Error": {"Code": "PreconditionFailed", "Message": "ETag"}}, "DeleteObjects"
                )

    s3.meta.events.register("provide-client-params.s3.DeleteObjects", enforce)
    monkeypatch.setattr(sweep.Bucket, "remove", remove)
    result = swept()
    assert 0 in result["failed"] and 0 in committed()
