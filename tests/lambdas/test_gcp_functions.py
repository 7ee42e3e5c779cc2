"""The GCP remediation functions: Cloud Storage through the real emulator
(fake-gcs-server, tests/gcs_emulator.py), Cloud Monitoring through a local HTTP server
that records what the functions write."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import requests

from ftfleet import contract
from ftfleet.errors import ConfigError
from ftfleet.infra.gcp import functions
from ftfleet.lambdas.common import gcp
from ftfleet.lambdas.gcp_preemption import config as preemption_config
from ftfleet.lambdas.gcp_preemption import handler as preemption
from ftfleet.lambdas.gcp_preemption.config import Config as PreemptionConfig
from ftfleet.lambdas.gcp_replication_watch import config as watch_config
from ftfleet.lambdas.gcp_replication_watch import handler as watch
from ftfleet.lambdas.gcp_replication_watch.config import Config as WatchConfig
from ftfleet.lambdas.gcp_storage_drift import handler as drift
from ftfleet.lambdas.gcp_storage_drift.config import Config as DriftConfig
from ftfleet.trainer.checkpoint.manifest import FileEntry, Manifest
from tests.gcs_emulator import gcs_client
from tests.lambdas.conftest import FakeClock, configure, decisions

STACK, RUN, PROJECT = "gcp-test", "llm-test", "proj-test"
ROOT = f"checkpoints/{RUN}"
PREFIX = "ftfleet-gcp-test-workers"
WHEN = "2026-11-24T10:00:00.123456Z"


#: The descriptors the stack declares (infra/gcp/alerts.py declares one per Metric).
DESCRIPTORS = {m.type: m for m in (*preemption_config.METRICS, *watch_config.METRICS)}


class Monitoring:
    """Cloud Monitoring's timeSeries.create on 127.0.0.1: records the series, or fails.
    As "Create custom metrics with the API" documents, a point of a metric whose
    descriptor exists must match it (kind, value type, the descriptor's labels and no
    others) or the whole request is refused with 400 INVALID_ARGUMENT; the descriptors
    here are the ones the stack declares."""

    def __init__(self):
        self.series: list[dict] = []
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.paths.append(self.path)
                status = outer.status if all(map(outer.matches, body["timeSeries"])) else 400
                if status == 200:
                    outer.series += body["timeSeries"]
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

        self.paths: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    @staticmethod
    def matches(series: dict) -> bool:
        d = DESCRIPTORS.get(series["metric"]["type"])
        return d is not None and (
            series["metricKind"] == d.KIND
            and series["valueType"] == d.VALUE_TYPE
            and set(series["metric"]["labels"]) == set(d.labels)
            and series["resource"]["type"] == d.resource_type
        )

    def named(self, name: str) -> list[dict]:
        return [s for s in self.series if s["metric"]["type"] == gcp.METRIC_PREFIX + name]


@pytest.fixture
def monitoring(monkeypatch):
    m = Monitoring()
    monkeypatch.setenv("FTFLEET_MONITORING_ENDPOINT", m.url)
    gcp.reset()
    yield m
    gcp.reset()
    m.server.shutdown()


def pubsub(payload) -> dict:
    """What a push request's body (or a Pub/Sub CloudEvent's data) carries."""
    data = base64.b64encode(json.dumps(payload).encode()).decode()
    return {"data": {"message": {"data": data, "messageId": "1", "attributes": {}}, "subscription": "s"}}


def preempted(name=f"{PREFIX}-x7k2", zone="us-central1-a", instance_id="4711", method="compute.instances.preempted"):
    """A LogEntry of the system event, as the sink routes it (fields the function reads)."""
    return {
        "protoPayload": {
            "@type": "type.googleapis.com/google.cloud.audit.AuditLog",
            "methodName": method,
            "resourceName": f"projects/{PROJECT}/zones/{zone}/instances/{name}",
        },
        "resource": {"type": "gce_instance", "labels": {"instance_id": instance_id, "zone": zone}},
        "timestamp": WHEN,
    }


# --- preemption accounting ---------------------------------------------------------------


@pytest.fixture
def preempt(gcs_bucket, monitoring, monkeypatch):
    cfg = PreemptionConfig(
        stack=STACK,
        run_id=RUN,
        project=PROJECT,
        prefixes=(PREFIX, f"{PREFIX}-ondemand"),
        machine_types={PREFIX: "a3-highgpu-8g", f"{PREFIX}-ondemand": "a3-megagpu-8g"},
        bucket=gcs_bucket,
        root=ROOT,
    )
    configure(monkeypatch, cfg)
    return cfg


def prior(bucket) -> contract.InterruptionPrior:
    blob = gcs_client().bucket(bucket).blob(f"{ROOT}/{contract.INTERRUPTION_PRIOR_KEY}")
    return contract.InterruptionPrior.from_json(blob.download_as_bytes().decode())


class LogCounter:
    """A log-based counter metric over the function's stdout, as Cloud Logging documents
    it: Cloud Run makes each one-line JSON object on stdout an entry whose jsonPayload it
    is, on the cloud_run_revision resource of the function's service; the counter counts
    the entries its filter matches (here: clauses `field="value"` joined by AND), per the
    labels its extractors (`EXTRACT(jsonPayload.field)`) read. Filter and extractors are
    the ones the stack declares (infra/gcp/functions.py)."""

    def __init__(self, service: str):
        self.service = service
        self.filter = functions.preemption_count_filter(STACK, service)
        self.extractors = functions.preemption_count_extractors()

    def count(self, stdout: str) -> dict[tuple[str, ...], int]:
        counts: dict[tuple[str, ...], int] = {}
        for line in stdout.splitlines():
            if not line.startswith("{"):
                continue
            entry = {
                "resource": {"type": "cloud_run_revision", "labels": {"service_name": self.service}},
                "jsonPayload": json.loads(line),
            }
            if all(self._field(entry, path) == json.loads(value) for path, value in self._clauses()):
                key = tuple(str(self._field(entry, e[len("EXTRACT(") : -1])) for e in self.extractors.values())
                counts[key] = counts.get(key, 0) + 1
        return counts

    def _clauses(self) -> list[tuple[str, str]]:
        return [tuple(clause.split("=", 1)) for clause in self.filter.split(" AND ")]

    @staticmethod
    def _field(entry: dict, path: str):
        value = entry
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value


@pytest.fixture
def counter() -> LogCounter:
    return LogCounter(f"ftfleet-{STACK}-preemption")


def test_a_preemption_joins_the_prior_the_trainer_reads_and_is_counted_per_zone_and_type(
    preempt, monitoring, capsys, counter
):
    out = preemption.handler(pubsub(preempted()))
    assert out["decision"] == "recorded"
    p = prior(preempt.bucket)
    assert p.cloud == "gcp" and [(i.node_id, i.zone, i.instance_type) for i in p.interruptions] == [
        ("4711", "us-central1-a", "a3-highgpu-8g")
    ]
    assert counter.count(capsys.readouterr().out) == {("us-central1-a", "a3-highgpu-8g"): 1}
    assert monitoring.paths == []  # no time series point per preemption


def test_a_redelivered_preemption_changes_nothing_and_is_not_counted_twice(preempt, monitoring, capsys, counter):
    preemption.handler(pubsub(preempted()))
    assert preemption.handler(pubsub(preempted()))["decision"] == "duplicate"
    assert len(prior(preempt.bucket).interruptions) == 1
    assert counter.count(capsys.readouterr().out) == {("us-central1-a", "a3-highgpu-8g"): 1}


def test_the_machine_type_comes_from_the_longest_matching_group(preempt, monitoring):
    preemption.handler(pubsub(preempted(name=f"{PREFIX}-ondemand-ab12", instance_id="9")))
    assert prior(preempt.bucket).interruptions[0].instance_type == "a3-megagpu-8g"


@pytest.mark.parametrize(
    "name",
    ["ftfleet-other-workers-x7k2", f"{PREFIX}x-x7k2", "ftfleet-gcp-test-coordinator-ab12"],
)
def test_instances_of_other_groups_or_stacks_are_dropped(preempt, monitoring, name):
    out = preemption.handler(pubsub(preempted(name=name)))
    assert out["decision"] == "dropped" and "another stack" in out["reason"]
    assert not gcs_client().bucket(preempt.bucket).blob(f"{ROOT}/{contract.INTERRUPTION_PRIOR_KEY}").exists()


BAD_MESSAGES = {
    "no data": {"data": None},
    "no message": {"data": {"subscription": "s"}},
    "not base64": {"data": {"message": {"data": "%%%"}}},
    "base64 of not JSON": {"data": {"message": {"data": base64.b64encode(b"{oops").decode()}}},
    "a list": pubsub([1, 2]),
    "no protoPayload": pubsub({"timestamp": WHEN}),
    "another method": pubsub(preempted(method="compute.instances.delete")),
    "no instance": pubsub({**preempted(), "protoPayload": {"methodName": "compute.instances.preempted"}}),
    "bad resource": pubsub(
        {**preempted(), "protoPayload": {"methodName": "compute.instances.preempted", "resourceName": "x/y"}}
    ),
    "bad time": pubsub({**preempted(), "timestamp": "yesterday"}),
}


@pytest.mark.parametrize("case", sorted(BAD_MESSAGES))
def test_malformed_messages_are_dropped_with_a_line_not_retried(preempt, monitoring, case, capsys):
    out = preemption.handler(BAD_MESSAGES[case])
    assert out["decision"] == "dropped" and out["reason"]
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]


def test_a_cloud_event_object_is_read_like_a_push_body(preempt, monitoring):
    event = SimpleNamespace(data=pubsub(preempted())["data"])
    assert preemption.handler(event)["decision"] == "recorded"


def test_a_wave_of_concurrent_preemptions_all_land_in_the_prior_and_are_all_counted(
    preempt, monitoring, capsys, counter
):
    """Six preemptions of one zone and machine type at once: one time series, where
    Cloud Monitoring would refuse all but one point; every decision line is counted."""
    names = [f"{PREFIX}-a{i:03d}"[-len(PREFIX) - 5 :] for i in range(6)]
    threads = [
        threading.Thread(target=preemption.handler, args=(pubsub(preempted(name=n, instance_id=str(i))),))
        for i, n in enumerate(names)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(i.node_id for i in prior(preempt.bucket).interruptions) == [str(i) for i in range(6)]
    assert counter.count(capsys.readouterr().out) == {("us-central1-a", "a3-highgpu-8g"): 6}


def test_a_malformed_prior_is_replaced_with_a_warning(preempt, monitoring, capsys):
    blob = gcs_client().bucket(preempt.bucket).blob(f"{ROOT}/{contract.INTERRUPTION_PRIOR_KEY}")
    blob.upload_from_string(b"[not, a prior")
    assert preemption.handler(pubsub(preempted()))["decision"] == "recorded"
    assert len(prior(preempt.bucket).interruptions) == 1
    assert [d["decision"] for d in decisions(capsys)] == ["prior-replaced", "recorded"]


def test_a_missing_variable_fails_with_one_line_naming_it(preempt, monitoring, monkeypatch):
    monkeypatch.delenv("FTFLEET_INSTANCE_PREFIXES")
    from ftfleet.lambdas.common import runtime

    runtime.reset()
    with pytest.raises(ConfigError, match=r"^FTFLEET_INSTANCE_PREFIXES is not set"):
        preemption.handler(pubsub(preempted()))


# --- storage drift --------------------------------------------------------------------------


class StandInBucket:
    """fake-gcs-server answers a bucket PATCH of versioning with "not implemented: fs
    storage type does not support versioning yet" and has no IAM API (404), so the
    drift function's bucket is this stand-in, with the attributes and calls of
    google-cloud-storage's Bucket that the function uses."""

    def __init__(self, state: dict, *, sticky: bool = False):
        self.state, self.sticky = state, sticky
        self.patches, self.iam_writes = 0, 0
        self.reload()

    def reload(self):
        s = self.state
        self.versioning_enabled = s["versioning"]
        self.iam_configuration = SimpleNamespace(
            uniform_bucket_level_access_enabled=s["uniform_bucket_level_access"],
            public_access_prevention=s["public_access_prevention"],
        )
        self.soft_delete_policy = SimpleNamespace(retention_duration_seconds=s["soft_delete_seconds"])

    def patch(self):
        self.patches += 1
        if not self.sticky:
            self.state.update(
                versioning=self.versioning_enabled,
                uniform_bucket_level_access=self.iam_configuration.uniform_bucket_level_access_enabled,
                public_access_prevention=self.iam_configuration.public_access_prevention,
                soft_delete_seconds=self.soft_delete_policy.retention_duration_seconds,
            )

    def get_iam_policy(self, requested_policy_version=3):
        return SimpleNamespace(bindings=[dict(b, members=set(b["members"])) for b in self.state["bindings"]])

    def set_iam_policy(self, policy):
        self.iam_writes += 1
        self.state["bindings"] = [dict(b, members=set(b["members"])) for b in policy.bindings]


DESIRED = {
    "versioning": True,
    "uniform_bucket_level_access": True,
    "public_access_prevention": "enforced",
    "soft_delete_seconds": 604800,
}
NODES = {"role": "roles/storage.objectAdmin", "members": {"serviceAccount:nodes@p.iam.gserviceaccount.com"}}


DESIRED_KEY = f"desired/{STACK}.json"


def declare(bucket: str, settings: dict) -> None:
    """What the stack's `pulumi up` writes before it changes the checkpoint bucket."""
    gcs_client().bucket(bucket).blob(DESIRED_KEY).upload_from_string(json.dumps(settings))


@pytest.fixture
def drifted(monkeypatch, gcs_bucket):
    """The checkpoint bucket is the stand-in; the desired-state document is a real
    object in the (emulated) functions' source bucket."""
    state = {**DESIRED, "bindings": [NODES]}
    buckets: dict[str, StandInBucket] = {}
    emulated = gcs_client()

    def bucket(name, sticky=False):
        if name == gcs_bucket:
            return emulated.bucket(name)
        buckets.setdefault(name, StandInBucket(state, sticky=sticky))
        return buckets[name]

    declare(gcs_bucket, DESIRED)
    monkeypatch.setattr(gcp, "storage", lambda: SimpleNamespace(bucket=bucket))
    configure(
        monkeypatch,
        DriftConfig(
            stack=STACK, run_id=RUN, project=PROJECT, buckets=("ckpt",), desired_uri=f"gs://{gcs_bucket}/{DESIRED_KEY}"
        ),
    )
    return state, buckets


def audit(method="storage.buckets.update", bucket="ckpt"):
    return pubsub(
        {
            "protoPayload": {
                "methodName": method,
                "resourceName": f"projects/_/buckets/{bucket}",
                "authenticationInfo": {"principalEmail": "someone@example.com"},
            },
            "resource": {"type": "gcs_bucket", "labels": {"bucket_name": bucket}},
            "timestamp": WHEN,
        }
    )


def test_weakened_settings_and_public_members_are_restored_and_read_back(drifted):
    state, _ = drifted
    state.update(versioning=False, public_access_prevention="inherited")
    state["bindings"] = [NODES, {"role": "roles/storage.objectViewer", "members": {"allUsers", "user:a@example.com"}}]
    out = drift.handler(audit("storage.setIamPermissions"))
    assert out["decision"] == "restored" and out["caller"] == "someone@example.com"
    assert out["settings"] == {
        "versioning": {"found": False, "restored": True},
        "public_access_prevention": {"found": "inherited", "restored": "enforced"},
    }
    assert out["removed_members"] == ["allUsers"]
    assert state["versioning"] is True and state["public_access_prevention"] == "enforced"
    assert {m for b in state["bindings"] for m in b["members"]} == {
        "serviceAccount:nodes@p.iam.gserviceaccount.com",
        "user:a@example.com",
    }


def test_a_bucket_as_rendered_is_in_sync_and_nothing_is_written(drifted):
    _, buckets = drifted
    assert drift.handler(audit())["decision"] == "in-sync"
    assert buckets["ckpt"].patches == 0 and buckets["ckpt"].iam_writes == 0


def test_a_change_the_stack_makes_is_desired_before_its_audit_entry_arrives_and_kept(drifted, gcs_bucket):
    state, buckets = drifted
    # `pulumi up` with gcsSoftDeleteDays 7 -> 14: the document first, then the bucket.
    declare(gcs_bucket, {**DESIRED, "soft_delete_seconds": 14 * 86400})
    state["soft_delete_seconds"] = 14 * 86400
    out = drift.handler(audit())
    assert out["decision"] == "in-sync" and buckets["ckpt"].patches == 0
    assert state["soft_delete_seconds"] == 14 * 86400


def test_the_desired_state_is_read_at_every_event_not_at_deploy(drifted, gcs_bucket):
    state, _ = drifted
    state["soft_delete_seconds"] = 14 * 86400  # someone else's change
    declare(gcs_bucket, DESIRED)
    assert drift.handler(audit())["settings"] == {
        "soft_delete_seconds": {"found": 14 * 86400, "restored": DESIRED["soft_delete_seconds"]}
    }


@pytest.mark.parametrize("document", [None, b"[1, 2]", b'{"versioning": true, "surprise": 1}', b"{not json"])
def test_without_a_readable_desired_state_nothing_is_repaired_and_pubsub_redelivers(drifted, gcs_bucket, document):
    state, buckets = drifted
    state["versioning"] = False
    blob = gcs_client().bucket(gcs_bucket).blob(DESIRED_KEY)
    if document is None:
        blob.delete()
    else:
        blob.upload_from_string(document)
    with pytest.raises(drift.DesiredStateUnknown):
        drift.handler(audit())
    assert buckets["ckpt"].patches == 0 and state["versioning"] is False


def test_a_repair_that_does_not_take_is_an_error_so_pubsub_redelivers(drifted, monkeypatch):
    state, buckets = drifted
    state["versioning"] = False
    buckets["ckpt"] = StandInBucket(state, sticky=True)
    with pytest.raises(drift.DriftNotRepaired, match="versioning"):
        drift.handler(audit())


@pytest.mark.parametrize(
    "event, reason",
    [
        (audit(bucket="someone-elses"), "another stack"),
        (audit(method="storage.objects.create"), "not a watched call"),
        (pubsub({"protoPayload": {"methodName": "storage.buckets.update", "resourceName": "b/x"}}), "names no bucket"),
    ],
)
def test_other_buckets_and_calls_are_dropped(drifted, event, reason):
    state, buckets = drifted
    out = drift.handler(event)
    assert out["decision"] == "dropped" and reason in out["reason"] and not buckets


# --- replication watch -----------------------------------------------------------------------

SHARDS = {"__0_0.distcp": b"a" * 10, "__1_0.distcp": b"b" * 12, ".metadata": b"m" * 3}


def checkpoint(bucket, step, skip=(), manifest=True):
    b = gcs_client().bucket(bucket)
    prefix = f"{ROOT}/{contract.step_dir_name(step)}"
    for name, data in SHARDS.items():
        if name not in skip:
            b.blob(f"{prefix}/{name}").upload_from_string(data)
    if manifest:
        files = {name: FileEntry(len(data), "00000000") for name, data in SHARDS.items()}
        text = Manifest(step=step, run_id=RUN, config_hash="h", world_size=2, files=files, torch_version="2.13.0")
        b.blob(f"{prefix}/{contract.MANIFEST_NAME}").upload_from_string(text.to_json())


@pytest.fixture
def watcher(gcs_bucket, monitoring, monkeypatch):
    def make(rpo="ASYNC_TURBO", replica="", age_s=0.0):
        configure(
            monkeypatch,
            WatchConfig(
                stack=STACK,
                run_id=RUN,
                project=PROJECT,
                bucket=gcs_bucket,
                root=ROOT,
                rpo=rpo,
                replica_bucket=replica,
                lag_alarm_s=900.0,
            ),
        )
        import time

        monkeypatch.setattr(watch, "clock", FakeClock(time.time() + age_s))
        return lambda: watch.handler(pubsub({"stack": STACK}))

    return make


def value(monitoring, name):
    (series,) = monitoring.named(name)
    assert series["metric"]["labels"] == {"stack": STACK, "run": RUN}
    return series["points"][0]["value"]["doubleValue"]


def test_a_checkpoint_newer_than_turbo_replications_target_may_be_unreplicated(watcher, gcs_bucket, monitoring):
    checkpoint(gcs_bucket, 100)
    out = watcher(age_s=120.0)()
    assert out["decision"] == "measured" and out["newest"] == 100 and out["lag_is_bound"] is True
    assert 119 <= value(monitoring, "replication_unconfirmed_seconds") <= 200
    assert value(monitoring, "replica_has_complete_checkpoint") == 0.0
    # A bound is not a measurement: nothing is written where the alert policy looks.
    assert monitoring.named("replication_lag_seconds") == [] and out["over_alarm"] is False


def test_a_checkpoint_older_than_the_target_is_in_both_regions(watcher, gcs_bucket, monitoring):
    checkpoint(gcs_bucket, 100)
    watcher(age_s=16 * 60.0)()
    assert value(monitoring, "replication_unconfirmed_seconds") == 0.0
    assert value(monitoring, "replica_has_complete_checkpoint") == 1.0
    assert value(monitoring, "newest_durable_checkpoint_age_seconds") >= 16 * 60.0


def test_the_default_rpo_keeps_a_checkpoint_unconfirmed_for_hours_without_raising_the_alarm(
    watcher, gcs_bucket, monitoring
):
    checkpoint(gcs_bucket, 100)
    out = watcher(rpo="DEFAULT", age_s=3600.0)()
    assert value(monitoring, "replication_unconfirmed_seconds") >= 3600.0
    assert monitoring.named("replication_lag_seconds") == [] and out["over_alarm"] is False


def test_every_run_writes_the_heartbeat_the_silence_alert_waits_for(watcher, monitoring):
    watcher()()
    watcher()()
    assert len(monitoring.named(watch_config.HEARTBEAT.name)) == 2


def test_a_point_whose_labels_its_descriptor_does_not_declare_is_refused(monitoring):
    with pytest.raises(ValueError, match="labels"):
        gcp.write_metrics(PROJECT, [(watch_config.LAG, 1.0, {"stack": STACK})])
    stray = gcp.Metric("stray", "1", ("stack",), "no descriptor declares it")
    with pytest.raises(requests.HTTPError, match="400"):
        gcp.write_metrics(PROJECT, [(stray, 1.0, {"stack": STACK})])


def test_a_manifest_without_all_its_shards_does_not_count(watcher, gcs_bucket, monitoring):
    checkpoint(gcs_bucket, 100)
    checkpoint(gcs_bucket, 200, skip=("__1_0.distcp",))
    checkpoint(gcs_bucket, 300, manifest=False)
    assert watcher(age_s=60.0)()["newest"] == 100


def test_with_a_second_bucket_the_lag_is_the_oldest_commit_it_lacks(watcher, gcs_bucket, gcs_emulator, monitoring):
    replica = gcs_emulator.new_bucket()
    for step in (100, 200):
        checkpoint(gcs_bucket, step)
    checkpoint(replica, 100)
    out = watcher(replica=replica, age_s=600.0)()
    assert out["replica_newest"] == 100 and out["lag_is_bound"] is False
    assert value(monitoring, "replication_lag_seconds") >= 600.0 and out["over_alarm"] is False
    assert monitoring.named("replication_unconfirmed_seconds") == []
    assert value(monitoring, "replica_has_complete_checkpoint") == 1.0


def test_an_empty_bucket_has_no_checkpoint_and_no_lag(watcher, monitoring):
    assert watcher()()["decision"] == "no-checkpoint"
    assert value(monitoring, "replication_unconfirmed_seconds") == 0.0
