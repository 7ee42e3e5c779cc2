"""The malformed-input corpus, driven through the GCP handlers: Cloud Storage through
the emulator (fake-gcs-server), Cloud Monitoring through the local recorder of
test_gcp_functions. A bad message, name or state file is dropped, passed over or
replaced with one logged line; nothing is raised out of a handler (Pub/Sub would
redeliver what no retry can fix)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from ftfleet import contract
from ftfleet.lambdas.gcp_preemption import handler as preemption
from ftfleet.lambdas.gcp_storage_drift import handler as drift
from tests.gcs_emulator import gcs_client
from tests.lambdas.conftest import decisions
from tests.lambdas.test_gcp_functions import (  # noqa: F401 - fixtures
    PROJECT,
    ROOT,
    checkpoint,
    drifted,
    monitoring,
    preempt,
    preempted,
    pubsub,
    watcher,
)

DEEP = "[" * 100_000 + "]" * 100_000


def raw_message(data: bytes) -> dict:
    """A push body whose message data is these bytes, base64-encoded."""
    return {"data": {"message": {"data": base64.b64encode(data).decode(), "messageId": "1"}, "subscription": "s"}}


def foreign_project() -> dict:
    entry = preempted()
    entry["protoPayload"]["resourceName"] = entry["protoPayload"]["resourceName"].replace(PROJECT, "someone-else")
    return pubsub(entry)


def with_entry(**changes: Any) -> dict:
    entry = preempted()
    entry.update(changes)
    return pubsub(entry)


PREEMPTION_MESSAGES = {
    "an instance of another project with the stack's name": foreign_project(),
    "resource a list": with_entry(resource=["gce_instance"]),
    "resource labels a string": with_entry(resource={"type": "gce_instance", "labels": "instance_id=1"}),
    "message nested past the parser": raw_message(DEEP.encode()),
    "message not UTF-8": raw_message(b"\xff\xfe{"),
    "timestamp in year 99999": with_entry(timestamp="99999-01-01T00:00:00Z"),
    "proto payload a list": with_entry(protoPayload=["compute.instances.preempted"]),
    "resource name of 100 kB": with_entry(
        protoPayload={"methodName": "compute.instances.preempted", "resourceName": "projects/" + "p" * 100_000}
    ),
}


@pytest.mark.parametrize("case", sorted(PREEMPTION_MESSAGES))
def test_preemption_drops_a_hostile_message(preempt, monitoring, capsys, case):  # noqa: F811
    result = preemption.handler(PREEMPTION_MESSAGES[case])
    assert result["decision"] == "dropped" and monitoring.series == []
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]
    assert gcs_client().bucket(preempt.bucket).get_blob(f"{ROOT}/{contract.INTERRUPTION_PRIOR_KEY}") is None


PRIORS = {
    "prior nested past the parser": DEEP.encode(),
    "prior not UTF-8": b"\xff\xfe",
    "prior at a number past a float": (
        b'{"format": "ftfleet-interruptions/1", "cloud": "gcp", "run_id": "llm-test", "updated_at": 1, '
        b'"interruptions": [{"node_id": "1", "at": 1e999, "zone": "z", "instance_type": "t"}]}'
    ),
}


@pytest.mark.parametrize("case", sorted(PRIORS))
def test_preemption_replaces_a_damaged_prior_in_one_line(preempt, monitoring, capsys, case):  # noqa: F811
    key = f"{ROOT}/{contract.INTERRUPTION_PRIOR_KEY}"
    gcs_client().bucket(preempt.bucket).blob(key).upload_from_string(PRIORS[case])
    assert preemption.handler(pubsub(preempted()))["decision"] == "recorded"
    assert [d["decision"] for d in decisions(capsys)] == ["prior-replaced", "recorded"]


STEPS = {
    "step of a superscript digit": f"{ROOT}/step-\u00b2/manifest.json",
    "step of Arabic-Indic digits": f"{ROOT}/step-\u0661\u0662/manifest.json",
    "step zero-padded": f"{ROOT}/step-0200/manifest.json",
    "step of 200 digits": f"{ROOT}/step-{'9' * 200}/manifest.json",
}
MANIFESTS = {
    "manifest size past a float": b'{"files": {"a": {"size": 1e999}}}',
    "manifest nested past the parser": DEEP.encode(),
    "manifest not UTF-8": b"\xff\xfe",
}


@pytest.mark.parametrize("case", sorted(STEPS) + sorted(MANIFESTS))
def test_replication_watch_passes_over_bad_names_and_manifests(watcher, gcs_bucket, capsys, case):  # noqa: F811
    checkpoint(gcs_bucket, 100)
    bucket = gcs_client().bucket(gcs_bucket)
    if case in STEPS:
        bucket.blob(STEPS[case]).upload_from_string(b"{}")
    else:
        bucket.blob(f"{ROOT}/{contract.step_dir_name(200)}/{contract.MANIFEST_NAME}").upload_from_string(
            MANIFESTS[case]
        )
    result = watcher(age_s=16 * 60.0)()
    assert (result["decision"], result["newest"]) == ("measured", 100)
    assert [d["decision"] for d in decisions(capsys)] == ["measured"]


DRIFT_MESSAGES = {
    "message nested past the parser": raw_message(DEEP.encode()),
    "bucket a look-alike of the stack's": pubsub(
        {"protoPayload": {"methodName": "storage.buckets.update", "resourceName": "projects/_/buckets/ckp\u0442"}}
    ),
    "authentication info a list": pubsub(
        {
            "protoPayload": {
                "methodName": "storage.buckets.update",
                "resourceName": "projects/_/buckets/other",
                "authenticationInfo": ["someone"],
            }
        }
    ),
}


@pytest.mark.parametrize("case", sorted(DRIFT_MESSAGES))
def test_storage_drift_drops_a_hostile_message(drifted, capsys, case):  # noqa: F811
    assert drift.handler(DRIFT_MESSAGES[case])["decision"] == "dropped"
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]


def test_the_gcp_corpus_is_large_enough():
    assert len(PREEMPTION_MESSAGES) + len(PRIORS) + len(STEPS) + len(MANIFESTS) + len(DRIFT_MESSAGES) >= 20
