"""gcp_retention_sweep against the Cloud Storage emulator (fake-gcs-server,
tests/gcs_emulator.py): the bucket keeps exactly what ftfleet/retention.py's plan keeps,
each deleted checkpoint loses its manifest first, and nothing unreadable, young or
outside the run's root is touched. Cloud Monitoring is the recording server of
test_gcp_functions.py, which knows the sweep's descriptors here."""

from __future__ import annotations

import functools
import json
import os
import time

import pytest
from google.api_core import exceptions
from google.cloud.storage import Blob, Client

from ftfleet import contract, retention
from ftfleet.errors import ConfigError
from ftfleet.lambdas.common import checkpoints
from ftfleet.lambdas.gcp_retention_sweep import config as sweep_config
from ftfleet.lambdas.gcp_retention_sweep import handler as sweep
from ftfleet.lambdas.gcp_retention_sweep.config import Config
from ftfleet.trainer.checkpoint.manifest import FileEntry, Manifest
from tests.gcs_emulator import gcs_client
from tests.lambdas import test_gcp_functions as gcp_functions
from tests.lambdas.conftest import FakeClock, configure, decisions
from tests.lambdas.test_gcp_functions import PROJECT, ROOT, RUN, STACK, monitoring, pubsub  # noqa: F401 - a fixture

HOUR, DAY = 3600.0, 86400.0
#: A Monday 00:00 UTC, as in tests/trainer/checkpoint/test_retention.py.
START = 1_767_571_200.0
SHARD_NAME, SHARD = "__0_0.distcp", b"s" * 8


@pytest.fixture(autouse=True)
def _descriptors(monkeypatch):
    """The stack declares the sweep's descriptors (infra/gcp/alerts.py): the recording
    Cloud Monitoring accepts its points and refuses any other."""
    for metric in sweep_config.METRICS:
        monkeypatch.setitem(gcp_functions.DESCRIPTORS, metric.type, metric)


@pytest.fixture
def swept(gcs_bucket, monitoring, monkeypatch):  # noqa: F811 - the imported fixture
    """Runs the sweep: ``swept(now=..., rules=..., timeout_s=...)``. The stack's fallback
    keeps little, so that a test of anything else sees it delete."""

    def run(now: float | None = None, rules=("all for 1h",), timeout_s: float = 540.0) -> dict:
        configure(
            monkeypatch,
            Config(
                stack=STACK,
                run_id=RUN,
                project=PROJECT,
                bucket=gcs_bucket,
                root=ROOT,
                rules=tuple(rules),
                timeout_s=timeout_s,
            ),
        )
        monkeypatch.setattr(sweep, "clock", FakeClock(time.time() if now is None else now))
        return sweep.handler(pubsub({"stack": STACK}))

    return run


@functools.cache
def _bucket(url: str, name: str):
    return gcs_client(url).bucket(name)


def bucket_of(name: str):
    """One client per emulator and bucket: a month of uploads takes seconds, not tens."""
    return _bucket(os.environ["STORAGE_EMULATOR_HOST"], name)


def manifest(step: int, created_at: float, milestone=None, policy=None, references=()) -> str:
    files = {SHARD_NAME: FileEntry(len(SHARD), "00000000")}
    return Manifest(
        references={r: dict(files) for r in references},
        step=step,
        run_id=RUN,
        config_hash="h",
        world_size=1,
        files=files,
        torch_version="2.13.0",
        created_at=created_at,
        milestone=milestone,
        retention=policy,
    ).to_json()


def checkpoint(bucket, step, created_at=START, *, milestone=None, policy=None, files=True, text=None, committed=True):
    """A checkpoint as the trainer uploads it: its shard, then the manifest listing it
    (``text``: a manifest of other bytes). Returns the manifest's text."""
    b = bucket_of(bucket)
    prefix = f"{ROOT}/{contract.step_dir_name(step)}"
    if files:
        b.blob(f"{prefix}/{SHARD_NAME}").upload_from_string(SHARD)
    text = manifest(step, created_at, milestone, policy) if text is None else text
    if committed:
        b.blob(f"{prefix}/{contract.MANIFEST_NAME}").upload_from_string(text)
    return text


def names(bucket) -> set[str]:
    return {b.name for b in bucket_of(bucket).list_blobs()}


def committed(bucket) -> list[int]:
    found = (contract.parse_step_dir(n.split("/")[-2]) for n in names(bucket) if n.endswith(contract.MANIFEST_NAME))
    return sorted(s for s in found if s is not None)


def step_dirs(bucket) -> set[int]:
    return {contract.parse_step_dir(n.split("/")[2]) for n in names(bucket) if n.startswith(f"{ROOT}/step-")}


def value(monitoring, name):  # noqa: F811 - the imported fixture's value
    (series,) = monitoring.named(name)
    assert series["metric"]["labels"] == {"stack": STACK}
    return series["points"][0]["value"]["doubleValue"]


@pytest.fixture
def deletes(monkeypatch) -> list[str]:
    """Every object the code deletes, in order, as the client sends the calls."""
    order: list[str] = []
    real = Blob.delete

    def delete(self, *args, **kwargs):
        order.append(self.name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Blob, "delete", delete)
    return order


def test_a_month_of_hourly_checkpoints_is_swept_to_exactly_the_set_the_plan_keeps(swept, gcs_bucket, monitoring):  # noqa: F811
    """30 days of hourly checkpoints (more than SCAN_LIMIT step directories, and more
    objects than one listing page): the first week written without a policy, then the
    trainer's default, the last day with a schedule of its own that pins an early step;
    a surpassed and a best loss milestone, and an accuracy milestone marked for good."""
    hours = 30 * 24
    assert hours > checkpoints.SCAN_LIMIT
    pinned = 10 * 24 + 1
    own = retention.Policy(("all for 12h", "1d for 14d"), (pinned,))
    marks = {
        3 * 24 + 5: retention.Milestone("loss", "min", 2.0, "best"),
        12 * 24 + 7: retention.Milestone("loss", "min", 1.5, "best"),
        5 * 24 + 2: retention.Milestone("accuracy", "max", 0.7, "all"),
    }
    recorded = {}
    for hour in range(hours):
        step = hour + 1
        policy = None if hour < 7 * 24 else own if hour >= 29 * 24 else retention.Policy()
        text = checkpoint(gcs_bucket, step, START + hour * HOUR, milestone=marks.get(step), policy=policy)
        recorded[step] = retention.Recorded.parse(text)
    plan = retention.plan_sweep(recorded, set(recorded), {}, time.time(), retention.Policy(("all for 1h",)))
    assert {pinned, 12 * 24 + 7, 5 * 24 + 2} <= set(plan.kept) and 3 * 24 + 5 not in plan.kept
    assert plan.policy == own and len(plan.delete) > hours / 2

    out = swept()

    assert committed(gcs_bucket) == sorted(plan.kept)
    assert step_dirs(gcs_bucket) == set(plan.kept)  # every object of a deleted step is gone
    assert out["decision"] == "swept" and out["deleted"] == plan.delete and out["failed"] == []
    assert out["rules"] == list(own.rules) and out["pinned"] == [pinned]
    assert value(monitoring, "retention_deleted_checkpoints") == len(plan.delete)
    assert value(monitoring, "retention_kept_checkpoints") == len(plan.kept)
    assert value(monitoring, "retention_delete_failures") == 0
    assert swept()["deleted"] == []  # swept again: nothing more goes


def test_without_a_recorded_policy_the_stacks_checkpoint_retention_applies(swept, gcs_bucket):
    for day in range(5):
        checkpoint(gcs_bucket, day, START + day * DAY)
    out = swept(rules=("1d for 2d",))
    assert committed(gcs_bucket) == [3, 4] and out["rules"] == ["1d for 2d"]


def test_a_referenced_checkpoint_stays_until_no_manifest_names_it(swept, gcs_bucket):
    checkpoint(gcs_bucket, 1, START)
    checkpoint(gcs_bucket, 2, START + DAY, text=manifest(2, START + DAY, references=[1]))
    checkpoint(gcs_bucket, 3, START + 2 * DAY)
    swept(now=START + 2 * DAY)
    assert committed(gcs_bucket) == [1, 3]  # step-2 named step-1 when the sweep looked
    swept(now=START + 2 * DAY)
    assert committed(gcs_bucket) == [3] and step_dirs(gcs_bucket) == {3}


def test_each_deleted_checkpoint_loses_its_manifest_before_any_other_object(swept, gcs_bucket, deletes):
    for day in range(4):
        checkpoint(gcs_bucket, day, START + day * DAY)
    assert swept()["deleted"] == [0, 1, 2]
    for step in (0, 1, 2):
        prefix = f"{ROOT}/{contract.step_dir_name(step)}/"
        assert [n for n in deletes if n.startswith(prefix)] == [
            f"{prefix}{contract.MANIFEST_NAME}",
            prefix + SHARD_NAME,
        ]
    # Oldest first: step 0 is gone before step 1 is touched.
    firsts = [deletes.index(f"{ROOT}/{contract.step_dir_name(s)}/{contract.MANIFEST_NAME}") for s in (0, 1, 2)]
    assert firsts == sorted(firsts)


def test_unreadable_manifests_and_the_newest_complete_checkpoint_are_kept(swept, gcs_bucket):
    for day in range(5):
        checkpoint(gcs_bucket, day, START + day * DAY)
    checkpoint(gcs_bucket, 1, text="{not json")
    bad_policy = json.loads(manifest(2, START + 2 * DAY))
    bad_policy["retention"] = {"rules": ["daily"], "pinned": []}
    checkpoint(gcs_bucket, 2, text=json.dumps(bad_policy))
    checkpoint(gcs_bucket, 6, START + 6 * DAY, files=False)  # committed, its shard not there yet
    swept()
    # unreadable twice (0 below them stays: they may reference it); newest complete; newest
    assert committed(gcs_bucket) == [0, 1, 2, 4, 6]


def test_debris_goes_once_a_day_old_and_never_past_the_newest_checkpoint(swept, gcs_bucket):
    for i in range(3):
        checkpoint(gcs_bucket, i * 10, START + i * DAY)
    checkpoint(gcs_bucket, 5, committed=False)  # a crashed upload
    checkpoint(gcs_bucket, 25, committed=False)  # an upload still arriving, newer than the newest
    swept()  # their objects were written just now: they may still be arriving
    assert step_dirs(gcs_bucket) >= {5, 25}
    out = swept(now=time.time() + retention.DEBRIS_AGE_S + 60)
    assert out["debris"] == [5] and 5 in out["deleted"]
    assert 5 not in step_dirs(gcs_bucket) and 25 in step_dirs(gcs_bucket)


def test_a_step_that_does_not_delete_is_counted_and_the_others_go(swept, gcs_bucket, monkeypatch, monitoring, capsys):  # noqa: F811
    for day in range(4):
        checkpoint(gcs_bucket, day, START + day * DAY)
    real = Blob.delete
    refused = f"{ROOT}/{contract.step_dir_name(1)}/"

    def delete(self, *args, **kwargs):
        if self.name.startswith(refused):
            raise exceptions.Forbidden("storage.objects.delete denied")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Blob, "delete", delete)
    out = swept()
    assert out["failed"] == [1] and out["deleted"] == [0, 2] and out["level"] == "WARNING"
    assert committed(gcs_bucket) == [1, 3] and step_dirs(gcs_bucket) == {1, 3}
    assert value(monitoring, "retention_delete_failures") == 1
    (failure,) = [d for d in decisions(capsys) if d["decision"] == "delete-failed"]
    assert failure["step"] == 1 and "Forbidden" in failure["error"]


def test_a_sweep_short_of_time_starts_no_deletion(swept, gcs_bucket):
    for day in range(3):
        checkpoint(gcs_bucket, day, START + day * DAY)
    out = swept(timeout_s=sweep.RESERVE_S - 1)
    assert out["deleted"] == [] and out["left_for_next"] == [0, 1]
    assert committed(gcs_bucket) == [0, 1, 2]


def test_it_lists_and_deletes_only_under_its_root_and_touches_nothing_else(
    swept, gcs_bucket, deletes, monkeypatch, capsys
):
    old = manifest(1, START - 30 * DAY)
    foreign = {
        "checkpoints/other-run/step-1/manifest.json": old,
        f"{ROOT}-old/step-1/manifest.json": old,  # shares the root's characters, not its folder
        f"{ROOT}/not-a-step/x": "x",
        f"{ROOT}/step-007/x": "x",  # looks like a step; parse_step_dir says no
        f"{ROOT}/step-3": "x",  # an object, not a directory
        f"{ROOT}/{contract.INTERRUPTION_PRIOR_KEY}": "{}",
    }
    b = bucket_of(gcs_bucket)
    for name, data in foreign.items():
        b.blob(name).upload_from_string(data)
    for day in range(3):
        checkpoint(gcs_bucket, day, START + day * DAY)
    prefixes: list[str | None] = []
    real = Client.list_blobs

    def list_blobs(self, *args, **kwargs):
        prefixes.append(kwargs.get("prefix"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Client, "list_blobs", list_blobs)
    out = swept()
    assert out["deleted"] == [0, 1] and prefixes and all(p.startswith(f"{ROOT}/step-") for p in prefixes)
    assert all(n.startswith((f"{ROOT}/step-0/", f"{ROOT}/step-1/")) for n in deletes)
    assert set(foreign) <= names(gcs_bucket)
    assert decisions(capsys)[-1]["decision"] == "swept"


def test_an_empty_root_is_no_checkpoint_and_its_metrics_are_still_written(swept, monitoring):  # noqa: F811
    assert swept()["decision"] == "no-checkpoint"
    assert value(monitoring, "retention_kept_checkpoints") == 0  # the silence alert's heartbeat


def test_a_bad_fallback_rule_fails_the_cold_start_with_one_line_naming_it(monkeypatch):
    cfg = Config(stack=STACK, run_id=RUN, project=PROJECT, bucket="b", root=ROOT, rules=(), timeout_s=540.0)
    configure(monkeypatch, cfg)
    monkeypatch.setenv("FTFLEET_RETENTION_RULES", '["daily for 7d"]')
    with pytest.raises(ConfigError, match=r"^FTFLEET_RETENTION_RULES=.*is not a rule") as caught:
        sweep.handler(pubsub({"stack": STACK}))
    assert "\n" not in str(caught.value)


def test_an_empty_fallback_schedule_travels_and_keeps_only_the_newest(swept, gcs_bucket):
    for day in range(3):
        checkpoint(gcs_bucket, day, START + day * DAY)
    assert swept(rules=())["rules"] == []
    assert committed(gcs_bucket) == [2]
