"""gcp_capacity_watch against the stand-in for Compute Engine's REST API
(drill/gcp_standin.py), the Cloud Storage emulator (its state object; fake-gcs-server,
tests/gcs_emulator.py) and the recording Cloud Monitoring of test_gcp_functions.py,
which knows the watch's descriptors here."""

from __future__ import annotations

import base64
import json

import pytest
import requests

from drill.gcp_standin import Compute
from ftfleet.lambdas.common import gcp_groups
from ftfleet.lambdas.gcp_capacity_watch import config as capacity_config
from ftfleet.lambdas.gcp_capacity_watch import handler as watch
from ftfleet.lambdas.gcp_capacity_watch.config import Config
from tests.gcs_emulator import gcs_client
from tests.lambdas import test_gcp_functions as gcp_functions
from tests.lambdas.conftest import FakeClock, configure, decisions
from tests.lambdas.test_gcp_functions import BAD_MESSAGES, PROJECT, RUN, STACK, monitoring, pubsub  # noqa: F401

REGION = "us-central1"
WORKERS, COORDINATOR = "ftfleet-gcp-test-workers", "ftfleet-gcp-test-coordinator"
STATE_KEY = f"checkpoints/{RUN}/fleet/capacity-watch.json"
LOSS_S = 900.0
#: A Monday 00:00 UTC.
T0 = 1_767_571_200.0
STOCKOUT = {
    "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
    "message": "The zone 'projects/proj-test/zones/us-central1-a' does not have enough resources available to "
    "fulfill the request.  Try a different zone, or try again later.",
}
STOCKOUT_DETAILS = {
    "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "message": "A a3-highgpu-8g VM instance is currently unavailable in the us-central1-b zone. Capacity changes "
    "frequently, so try your request in a different zone, with a different VM hardware configuration, or at a later "
    "time.",
}
QUOTA = {"code": "QUOTA_EXCEEDED", "message": "Quota 'NVIDIA_H100_GPUS' exceeded.  Limit: 8.0 in region us-central1."}


@pytest.fixture
def compute(monkeypatch):
    c = Compute(PROJECT)
    monkeypatch.setenv("FTFLEET_COMPUTE_ENDPOINT", c.url)
    gcp_groups.reset()
    yield c
    c.close()


@pytest.fixture(autouse=True)
def _descriptors(monkeypatch):
    """The stack declares the watch's descriptors (infra/gcp/alerts.py): the recording
    Cloud Monitoring accepts its points and refuses any other."""
    for metric in capacity_config.METRICS:
        monkeypatch.setitem(gcp_functions.DESCRIPTORS, metric.type, metric)


def config(bucket: str, groups=(WORKERS,)) -> Config:
    return Config(
        stack=STACK,
        run_id=RUN,
        project=PROJECT,
        region=REGION,
        groups=tuple(groups),
        loss_s=LOSS_S,
        bucket=bucket,
        state_key=STATE_KEY,
    )


@pytest.fixture
def watched(gcs_bucket, compute, monitoring, monkeypatch):  # noqa: F811 - the imported fixture
    """Runs the watch at a time: ``watched(now, groups=...)``."""

    def run(now: float, groups=(WORKERS,)) -> dict:
        configure(monkeypatch, config(gcs_bucket, groups))
        monkeypatch.setattr(watch, "clock", FakeClock(now))
        return watch.handler(pubsub({}))

    return run


def state(bucket: str) -> dict:
    return json.loads(gcs_client().bucket(bucket).blob(STATE_KEY).download_as_bytes())


def written(monitoring, metric) -> float:  # noqa: F811 - the imported fixture
    """The value of the latest point of ``metric``; every point carries the stack's labels."""
    series = monitoring.named(metric.name)
    assert all(s["metric"]["labels"] == {"stack": STACK, "run": RUN} for s in series)
    return series[-1]["points"][0]["value"]["doubleValue"]


def test_a_full_group_is_ok_and_its_errors_are_not_read(watched, compute, monitoring, gcs_bucket):  # noqa: F811
    compute.group(WORKERS, target=3, ready=3, errors=[(T0 - 60, STOCKOUT)])
    out = watched(T0)
    assert out["decision"] == "ok" and out["level"] == "INFO"
    assert out["groups"] == {WORKERS: {"short": 0, "short_for_capacity_s": 0.0}} and out["missing_groups"] == []
    assert written(monitoring, capacity_config.CAPACITY_SHORT_NODES) == 0.0
    assert written(monitoring, capacity_config.CAPACITY_SHORT_SECONDS) == 0.0
    assert state(gcs_bucket) == {"groups": {WORKERS: {"last_full": T0, "since": None}}}
    assert not [path for _, path in compute.calls if path.endswith("/listErrors")]


def test_a_group_that_stays_full_is_not_written_again(watched, compute, gcs_bucket):
    compute.group(WORKERS, target=3, ready=3)
    watched(T0)
    watched(T0 + 120)
    assert state(gcs_bucket) == {"groups": {WORKERS: {"last_full": T0, "since": None}}}


def test_instances_not_running_or_with_an_action_pending_are_not_nodes_yet(watched, compute):
    booting = [("STAGING", "CREATING"), ("RUNNING", "VERIFYING"), ("PROVISIONING", "CREATING")]
    compute.group(WORKERS, target=5, ready=2, booting=booting)
    assert watched(T0)["groups"][WORKERS]["short"] == 3


def test_a_group_short_without_capacity_errors_is_booting_not_out_of_capacity(watched, compute, monitoring):  # noqa: F811
    compute.group(WORKERS, target=4, ready=1, booting=[("STAGING", "CREATING")], errors=[(T0 - 600, QUOTA)])
    out = watched(T0)
    assert out["decision"] == "short" and out["groups"][WORKERS] == {"short": 3, "short_for_capacity_s": 0.0}
    assert written(monitoring, capacity_config.CAPACITY_SHORT_NODES) == 3.0
    assert written(monitoring, capacity_config.CAPACITY_SHORT_SECONDS) == 0.0


def test_a_shortage_for_capacity_counts_from_the_oldest_error_after_the_group_was_last_full(
    watched,
    compute,
    monitoring,  # noqa: F811
    gcs_bucket,
):
    compute.group(WORKERS, target=2, ready=2, errors=[(T0 - 3600, STOCKOUT)])  # an earlier shortage's
    watched(T0)
    compute.group(
        WORKERS, target=2, ready=1, errors=[(T0 - 3600, STOCKOUT), (T0 + 60, STOCKOUT_DETAILS), (T0 + 120, STOCKOUT)]
    )
    out = watched(T0 + 300)
    assert out["decision"] == "short" and out["groups"][WORKERS]["short_for_capacity_s"] == 240.0
    assert state(gcs_bucket)["groups"][WORKERS] == {"last_full": T0, "since": T0 + 60}
    out = watched(T0 + 60 + LOSS_S)
    assert out["decision"] == "capacity-lost" and out["level"] == "WARNING" and out["loss_s"] == LOSS_S
    assert written(monitoring, capacity_config.CAPACITY_SHORT_SECONDS) == LOSS_S
    assert written(monitoring, capacity_config.CAPACITY_SHORT_NODES) == 1.0


def test_the_longest_shortage_of_any_group_is_the_stacks(watched, compute, monitoring):  # noqa: F811
    compute.group(WORKERS, target=4, ready=2, errors=[(T0 - 100, STOCKOUT)])
    compute.group(COORDINATOR, target=1, errors=[(T0 - 1000, STOCKOUT_DETAILS)])
    out = watched(T0, groups=(WORKERS, COORDINATOR))
    assert out["decision"] == "capacity-lost"
    assert written(monitoring, capacity_config.CAPACITY_SHORT_NODES) == 3.0
    assert written(monitoring, capacity_config.CAPACITY_SHORT_SECONDS) == 1000.0


def test_a_group_full_again_clears_its_shortage_and_a_later_one_counts_from_its_own_errors(
    watched, compute, gcs_bucket
):
    old = [(T0 + 10, STOCKOUT)]
    compute.group(WORKERS, target=2, ready=1, errors=old)
    assert watched(T0 + 100)["groups"][WORKERS]["short_for_capacity_s"] == 90.0
    compute.group(WORKERS, target=2, ready=2, errors=old)
    assert watched(T0 + 200)["decision"] == "ok"
    assert state(gcs_bucket)["groups"][WORKERS] == {"last_full": T0 + 200, "since": None}
    compute.group(WORKERS, target=2, ready=1, errors=old)  # an instance lost: booting its replacement
    assert watched(T0 + 300)["groups"][WORKERS] == {"short": 1, "short_for_capacity_s": 0.0}
    compute.group(WORKERS, target=2, ready=1, errors=[*old, (T0 + 350, STOCKOUT)])
    assert watched(T0 + 400)["groups"][WORKERS]["short_for_capacity_s"] == 50.0


def test_a_shortage_outlives_the_errors_it_started_from(watched, compute):
    compute.group(WORKERS, target=2, ready=1, errors=[(T0, STOCKOUT)])
    watched(T0 + 60)
    compute.group(WORKERS, target=2, ready=1, errors=[(T0 + 1100, STOCKOUT)])  # the first aged out
    assert watched(T0 + 1200)["groups"][WORKERS]["short_for_capacity_s"] == 1200.0


def test_a_stockout_that_passed_while_the_group_stayed_short_stops_counting(watched, compute, gcs_bucket):
    """A busy Spot group: short at every run (a preemption's replacement booting), once
    for want of capacity. Without a capacity error for RECENT_S, the shortage is no
    longer counted as one; a later stockout counts from its own errors only."""
    compute.group(WORKERS, target=4, ready=3, errors=[(T0, STOCKOUT)])
    assert watched(T0 + 60)["groups"][WORKERS]["short_for_capacity_s"] == 60.0
    later = T0 + watch.RECENT_S + 120
    assert watched(later)["groups"][WORKERS]["short_for_capacity_s"] == 0.0
    assert state(gcs_bucket)["groups"][WORKERS] == {"last_full": None, "since": None, "calm": later}
    compute.group(WORKERS, target=4, ready=3, errors=[(later + 300, STOCKOUT), (T0, STOCKOUT)])
    assert watched(later + 400)["groups"][WORKERS]["short_for_capacity_s"] == 100.0


def test_many_instances_and_errors_are_read_across_pages(watched, compute):
    errors = [(T0 - 60 * i, QUOTA) for i in range(5)] + [(T0 - 999, STOCKOUT)]
    compute.group(WORKERS, target=8, ready=5, booting=[("STAGING", "CREATING")] * 2, errors=errors)
    assert watched(T0)["groups"][WORKERS] == {"short": 3, "short_for_capacity_s": 999.0}
    assert sum(path.endswith("/listErrors") for _, path in compute.calls) == 3


def test_a_missing_group_is_named_and_the_others_are_measured(watched, compute, monitoring):  # noqa: F811
    compute.group(WORKERS, target=2, ready=1)
    out = watched(T0, groups=(WORKERS, "ftfleet-gcp-test-gone"))
    assert out["missing_groups"] == ["ftfleet-gcp-test-gone"] and list(out["groups"]) == [WORKERS]
    assert written(monitoring, capacity_config.CAPACITY_SHORT_NODES) == 1.0
    assert out["decision"] == "short"  # the measured group's decision stands


def test_groups_that_are_all_gone_are_not_ok(watched, compute):
    out = watched(T0, groups=("ftfleet-gcp-test-gone",))
    assert (out["decision"], out["level"], out["missing_groups"]) == (
        "groups-missing",
        "WARNING",
        ["ftfleet-gcp-test-gone"],
    )


def test_the_watch_only_reads_the_groups(watched, compute):
    compute.group(WORKERS, target=3, ready=1, errors=[(T0 - 60, STOCKOUT)])
    watched(T0)
    watched(T0 + 120)
    assert {(m, p.rpartition("/")[2] if "/" in p else "") for m, p in compute.calls} == {
        ("GET", ""),
        ("POST", "listManagedInstances"),
        ("GET", "listErrors"),
    }


@pytest.mark.parametrize(
    "document",
    [b"{not json", b"[1, 2]", json.dumps({"groups": {WORKERS: {"last_full": "yesterday", "since": True}}}).encode()],
)
def test_a_state_object_of_another_shape_is_started_afresh(watched, compute, gcs_bucket, document):
    gcs_client().bucket(gcs_bucket).blob(STATE_KEY).upload_from_string(document)
    compute.group(WORKERS, target=1, ready=1)
    assert watched(T0)["decision"] == "ok"
    assert state(gcs_bucket) == {"groups": {WORKERS: {"last_full": T0, "since": None}}}


def test_a_compute_error_is_raised_so_that_pubsub_redelivers(watched, compute, capsys, gcs_bucket):
    compute.status = 503
    with pytest.raises(requests.HTTPError, match="503"):
        watched(T0)
    assert [d["decision"] for d in decisions(capsys)] == ["error"]
    assert not gcs_client().bucket(gcs_bucket).blob(STATE_KEY).exists()


def _push(raw: str) -> dict:
    return {"data": {"message": {"data": raw, "messageId": "1"}, "subscription": "s"}}


#: What a broken or hostile push may carry; the watch reads no payload, but it must be one.
HOSTILE = {
    **{k: BAD_MESSAGES[k] for k in ("no data", "no message", "not base64", "base64 of not JSON")},
    "no event": None,
    "a string": "tick",
    "a list": [{"data": {}}],
    "empty data": _push(""),
    "nested past the parser's depth": _push(base64.b64encode(b"[" * 100_000 + b"]" * 100_000).decode()),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_malformed_or_hostile_event_is_dropped_before_any_group_is_read(case, compute, monkeypatch, capsys):
    configure(monkeypatch, config("ftfleet-unread"))
    out = watch.handler(HOSTILE[case])
    assert out["decision"] == "dropped" and out["level"] == "WARNING" and out["reason"]
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"] and compute.calls == []


@pytest.mark.parametrize(
    ("error", "capacity"),
    [
        (STOCKOUT, True),
        (STOCKOUT_DETAILS, True),
        ({"code": "SOMETHING_NEW", "message": STOCKOUT["message"]}, True),
        (QUOTA, False),
        ({"code": "CONDITION_NOT_MET", "message": "Instance template not found"}, False),
        (None, False),
        ("ZONE_RESOURCE_POOL_EXHAUSTED", False),
    ],
)
def test_only_the_documented_resource_availability_errors_count_as_capacity(error, capacity):
    assert watch.is_capacity_error(error) is capacity


def test_without_an_endpoint_the_session_is_googles_with_read_only_credentials(monkeypatch):
    monkeypatch.delenv("FTFLEET_COMPUTE_ENDPOINT", raising=False)
    gcp_groups.reset()
    asked: list[str] = []

    def default(scopes=None):
        asked.extend(scopes)
        return "credentials", PROJECT

    monkeypatch.setattr("google.auth.default", default)
    monkeypatch.setattr("google.auth.transport.requests.AuthorizedSession", lambda c: ("authorized", c))
    assert gcp_groups.session() == (gcp_groups.COMPUTE, ("authorized", "credentials"))
    assert asked == ["https://www.googleapis.com/auth/compute.readonly"]


def test_a_delayed_run_does_not_move_a_later_runs_times_back(watched, compute, gcs_bucket):
    """Pub/Sub redelivers a run late: its older view of the groups (full, before the
    shortage began) must not erase the shortage a later run recorded."""
    compute.group(WORKERS, target=2, ready=2)
    watched(T0)
    compute.group(WORKERS, target=2, ready=1, errors=[(T0 + 500, STOCKOUT)])
    watched(T0 + 600)
    later = state(gcs_bucket)
    assert later == {"groups": {WORKERS: {"last_full": T0, "since": T0 + 500}}}
    compute.group(WORKERS, target=2, ready=2)
    assert watched(T0 + 300)["decision"] == "ok"  # the delayed run, from before the shortage
    assert state(gcs_bucket) == later


def test_a_stockout_that_cleared_between_two_runs_never_dates_a_later_shortage(watched, compute, gcs_bucket):
    """A stockout days ago, gone before any run saw the group short, stays in listErrors:
    a preemption's replacement booting now is not a shortage for capacity days long."""
    compute.group(WORKERS, target=2, ready=2)
    watched(T0)
    days = 3 * 86400
    compute.group(WORKERS, target=2, ready=1, booting=[("STAGING", "CREATING")], errors=[(T0 + 600, STOCKOUT)])
    assert watched(T0 + days)["groups"][WORKERS]["short_for_capacity_s"] == 0.0
    # A fresh stockout counts from itself and the errors leading up to it.
    compute.group(WORKERS, target=2, ready=1, errors=[(T0 + days + 60, STOCKOUT), (T0 + 600, STOCKOUT)])
    assert watched(T0 + days + 120)["groups"][WORKERS]["short_for_capacity_s"] == 60.0


def test_errors_a_calm_set_aside_stay_aside_after_the_group_is_full_again(watched, compute):
    compute.group(WORKERS, target=2, ready=2)
    watched(T0)
    compute.group(WORKERS, target=2, ready=1, errors=[(T0 + 100, STOCKOUT)])
    watched(T0 + 200)
    calm_at = T0 + 200 + watch.RECENT_S + 60
    assert watched(calm_at)["groups"][WORKERS]["short_for_capacity_s"] == 0.0  # calm
    compute.group(WORKERS, target=2, ready=2)
    watched(calm_at + 120)  # full again
    compute.group(WORKERS, target=2, ready=1, errors=[(T0 + 100, STOCKOUT)])
    assert watched(calm_at + 240)["groups"][WORKERS]["short_for_capacity_s"] == 0.0
