"""gcp_capacity_watch against a stand-in for Compute Engine's REST API, the Cloud Storage
emulator (its state object; fake-gcs-server, tests/gcs_emulator.py) and the recording
Cloud Monitoring of test_gcp_functions.py, which knows the watch's descriptors here.

No Compute Engine emulator exists, so :class:`Compute` is a small HTTP server shaped as
the API reference documents the three calls the watch makes on a regional managed
instance group: ``regionInstanceGroupManagers.get`` (``targetSize``),
``.listManagedInstances`` (POST; ``managedInstances[]`` with ``instanceStatus`` and
``currentAction``) and ``.listErrors`` (GET; ``items[]`` with ``error.code``,
``error.message`` and an RFC 3339 ``timestamp``), both lists paginated with
``maxResults``/``pageToken``/``nextPageToken``, and 404 for a group that does not exist.
It answers pages of two items, fewer than asked for, as the API may."""

from __future__ import annotations

import base64
import datetime
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

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


def rfc3339(epoch: float) -> str:
    """As Compute Engine writes a timestamp: milliseconds and a local offset."""
    tz = datetime.timezone(datetime.timedelta(hours=-8))
    return datetime.datetime.fromtimestamp(epoch, tz).isoformat(timespec="milliseconds")


class Compute:
    """regionInstanceGroupManagers get, listManagedInstances and listErrors on
    127.0.0.1 (module doc). ``groups[name]`` holds ``target``, ``instances``
    ([(instanceStatus, currentAction)]) and ``errors`` ([(epoch, error)]); ``calls``
    records (method, path after the group's collection) of every request; ``status``
    other than 200 answers every request with it."""

    PAGE = 2

    def __init__(self):
        self.groups: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.status = 200
        self.prefix = f"/compute/v1/projects/{PROJECT}/regions/{REGION}/instanceGroupManagers/"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self.answer(*outer.answer("GET", self.path))

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.answer(*outer.answer("POST", self.path))

            def answer(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def group(self, name, target, ready=0, booting=(), errors=()):
        self.groups[name] = {
            "target": target,
            "instances": [("RUNNING", "NONE")] * ready + list(booting),
            "errors": list(errors),
        }

    def answer(self, method, raw_path):
        url = urllib.parse.urlsplit(raw_path)
        query = urllib.parse.parse_qs(url.query)
        rest = url.path.removeprefix(self.prefix) if url.path.startswith(self.prefix) else None
        self.calls.append((method, rest or url.path))
        if self.status != 200:
            return self.status, {"error": {"code": self.status, "message": "backendError"}}
        name, _, verb = (rest or "").partition("/")
        group = self.groups.get(urllib.parse.unquote(name))
        if group is None or (method, verb) not in (
            ("GET", ""),
            ("POST", "listManagedInstances"),
            ("GET", "listErrors"),
        ):
            message = f"The resource 'projects/{PROJECT}/regions/{REGION}/instanceGroupManagers/{name}' was not found"
            return 404, {"error": {"code": 404, "message": message, "errors": [{"reason": "notFound"}]}}
        if verb == "":
            return 200, {"kind": "compute#instanceGroupManager", "name": name, "targetSize": group["target"]}
        if verb == "listManagedInstances":
            items = [
                {"instance": f"{self.url}/instances/{name}-{i}", "instanceStatus": s, "currentAction": a}
                for i, (s, a) in enumerate(group["instances"])
            ]
            return 200, self.page(items, "managedInstances", query)
        items = [
            {
                "error": error,
                "timestamp": rfc3339(when),
                "instanceActionDetails": {"action": "CREATING", "instance": f"{self.url}/instances/{name}-new"},
            }
            for when, error in group["errors"]
        ]
        return 200, self.page(items, "items", query)

    def page(self, items, key, query):
        start = int(query.get("pageToken", ["0"])[0])
        size = min(self.PAGE, int(query.get("maxResults", ["500"])[0]))
        body = {key: items[start : start + size]}
        if start + size < len(items):
            body["nextPageToken"] = str(start + size)
        return body


@pytest.fixture
def compute(monkeypatch):
    c = Compute()
    monkeypatch.setenv("FTFLEET_COMPUTE_ENDPOINT", c.url)
    yield c
    c.server.shutdown()


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
    compute.group(WORKERS, target=2, ready=1, errors=[])  # aged out of listErrors
    assert watched(T0 + 1200)["groups"][WORKERS]["short_for_capacity_s"] == 1200.0


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
    monkeypatch.setattr(watch, "_sessions", {})
    asked: list[str] = []

    def default(scopes=None):
        asked.extend(scopes)
        return "credentials", PROJECT

    monkeypatch.setattr("google.auth.default", default)
    monkeypatch.setattr("google.auth.transport.requests.AuthorizedSession", lambda c: ("authorized", c))
    assert watch.compute() == (watch.COMPUTE, ("authorized", "credentials"))
    assert asked == ["https://www.googleapis.com/auth/compute.readonly"]
