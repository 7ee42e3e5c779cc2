"""A corpus of malformed events, hostile names and damaged state files, driven through
the real AWS handlers under moto as Lambda invokes them.

Every name and file a handler reads is untrusted: the events, the step directories and
manifests in the buckets, the commit markers and interruption prior next to the
checkpoints, and the replacement log that nodes can write too. A bad one is passed
over (or dropped, or replaced) with one logged line; nothing is raised out of a
handler, so no retry and no dead-letter queue for what a retry cannot fix.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from ftfleet import contract
from ftfleet.lambdas.spot_interruption import handler as spot
from ftfleet.lambdas.storage_drift import handler as drift
from ftfleet.lambdas.storage_drift.config import Config as DriftConfig
from ftfleet.lambdas.storage_drift.config import render
from tests.lambdas.conftest import (
    PRIMARY,
    REGION,
    REPLICA,
    REPLICA_REGION,
    ROOT,
    RUN,
    STACK,
    cloudtrail_call,
    configure,
    decisions,
    make_group,
    s3_put,
    spot_warning,
)
from tests.lambdas.test_lifecycle_handoff import GROUP as HANDOFF_GROUP
from tests.lambdas.test_lifecycle_handoff import NODE, asg, setup, write_marker  # noqa: F401 - fixtures
from tests.lambdas.test_replication_watch import checkpoint, watcher  # noqa: F401 - fixtures
from tests.lambdas.test_spot_interruption import GROUP as SPOT_GROUP
from tests.lambdas.test_spot_interruption import PRIOR_KEY, configured, fleet  # noqa: F401 - fixtures
from tests.lambdas.test_unhealthy_node import GROUP as SWEEP_GROUP
from tests.lambdas.test_unhealthy_node import publish, sweep, unhealthy_nodes  # noqa: F401 - fixtures

#: Nested past Python's JSON parser (it raises RecursionError, not ValueError).
DEEP = "[" * 100_000 + "]" * 100_000


def one_line(capsys, decision: str) -> dict[str, Any]:
    """The handler logged exactly one line of ``decision`` (plus its final one)."""
    lines = decisions(capsys)
    found = [d for d in lines if d["decision"] == decision]
    assert len(found) == 1, lines
    assert not [d for d in lines if d["decision"] == "error"], lines
    return found[0]


# --- replication_watch: step directories and manifests in both buckets ---------------

STEP = f"{ROOT}/{contract.step_dir_name(200)}"
WATCH_STATE: dict[str, Callable[[], object]] = {
    "step of a superscript digit": lambda: s3_put(PRIMARY, f"{ROOT}/step-\u00b2/manifest.json", "{}"),
    "step of Arabic-Indic digits": lambda: s3_put(PRIMARY, f"{ROOT}/step-\u0661\u0662/manifest.json", "{}"),
    "step zero-padded": lambda: s3_put(PRIMARY, f"{ROOT}/step-0200/manifest.json", "{}"),
    "step of 200 digits": lambda: s3_put(PRIMARY, f"{ROOT}/step-{'9' * 200}/manifest.json", "{}"),
    "step of a space": lambda: s3_put(PRIMARY, f"{ROOT}/step- 200/manifest.json", "{}"),
    "manifest size past a float": lambda: s3_put(PRIMARY, f"{STEP}/manifest.json", '{"files": {"a": {"size": 1e999}}}'),
    "manifest size an integer past a float": lambda: s3_put(
        PRIMARY, f"{STEP}/manifest.json", '{"files": {"a": {"size": ' + "9" * 400 + "}}}"
    ),
    "manifest nested past the parser": lambda: s3_put(PRIMARY, f"{STEP}/manifest.json", DEEP),
    "manifest not UTF-8": lambda: s3_put(PRIMARY, f"{STEP}/manifest.json", b"\xff\xfe\x00"),
    "manifest empty": lambda: s3_put(PRIMARY, f"{STEP}/manifest.json", b""),
    "manifest negative size": lambda: s3_put(PRIMARY, f"{STEP}/manifest.json", '{"files": {"a": {"size": -4}}}'),
    "manifest files a list": lambda: s3_put(PRIMARY, f"{STEP}/manifest.json", '{"files": ["a"]}'),
    "replica step of a superscript digit": lambda: s3_put(
        REPLICA, f"{ROOT}/step-\u00b3/manifest.json", "{}", REPLICA_REGION
    ),
}


@pytest.mark.parametrize("case", sorted(WATCH_STATE))
def test_replication_watch_passes_over_bad_names_and_manifests(watcher, capsys, case):  # noqa: F811
    checkpoint(PRIMARY, 100)
    checkpoint(REPLICA, 100, REPLICA_REGION)
    WATCH_STATE[case]()
    result = watcher()
    assert (result["decision"], result["primary_newest"], result["replica_newest"]) == ("measured", 100, 100)
    assert [d["decision"] for d in decisions(capsys)] == ["measured"]


# --- lifecycle_handoff: the commit marker and the event ------------------------------

MARKER_KEY = f"{ROOT}/{contract.marker_key(NODE)}"
MARKERS: dict[str, bytes | str] = {
    "marker step past a float": '{"run_id": "llm-test", "node_id": "' + NODE + '", "step": 1e999, '
    '"reason": "termination", "durable": true, "written_at": 1}',
    "marker written_at infinite": '{"run_id": "llm-test", "node_id": "' + NODE + '", "step": 1, '
    '"reason": "termination", "durable": true, "written_at": 1e999}',
    "marker nested past the parser": DEEP,
    "marker not JSON": "{",
    "marker a JSON list": "[1, 2]",
    "marker not UTF-8": b"\xff\xfe",
}


@pytest.mark.parametrize("case", sorted(MARKERS))
def test_lifecycle_handoff_waits_out_a_bad_marker_to_the_deadline(setup, asg, capsys, case):  # noqa: F811
    s3_put(PRIMARY, MARKER_KEY, MARKERS[case])
    result, _ = setup()
    assert (result["decision"], result["outcome"]) == ("completed", "deadline")
    assert [d["decision"] for d in decisions(capsys)] == ["completed"]


def handoff_event(**detail: Any) -> dict:
    from tests.lambdas.conftest import lifecycle_action

    event = lifecycle_action(NODE, HANDOFF_GROUP, contract.TERMINATION_HOOK_NAME)
    event["detail"].update(detail)
    return event


HANDOFF_EVENTS = {
    "instance id of Arabic-Indic digits": handoff_event(
        EC2InstanceId="i-\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667"
    ),
    "group name of 100 kB": handoff_event(AutoScalingGroupName="g" * 100_000),
    "group a look-alike of the stack's": handoff_event(AutoScalingGroupName=HANDOFF_GROUP.replace("a", "\u0430")),
    "token an object": handoff_event(LifecycleActionToken={"$gt": ""}),
    "time in year 99999": {**handoff_event(), "time": "99999-01-01T00:00:00Z"},
}


@pytest.mark.parametrize("case", sorted(HANDOFF_EVENTS))
def test_lifecycle_handoff_drops_a_hostile_event(setup, asg, capsys, case):  # noqa: F811
    result, _ = setup(event=HANDOFF_EVENTS[case])
    assert result["decision"] == "dropped" and not asg.calls
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]


# --- spot_interruption: the interruption prior and the event --------------------------

PRIORS: dict[str, bytes | str] = {
    "prior nested past the parser": DEEP,
    "prior interruption at a number past a float": json.dumps(
        {"format": contract.PRIOR_FORMAT, "cloud": "aws", "run_id": RUN, "updated_at": 1, "interruptions": []}
    ).replace(
        '"interruptions": []', '"interruptions": [{"node_id": "i-1", "at": 1e999, "zone": "z", "instance_type": "t"}]'
    ),
    "prior updated_at an integer past a float": json.dumps(
        {"format": contract.PRIOR_FORMAT, "cloud": "aws", "run_id": RUN, "interruptions": []}
    ).replace("{", '{"updated_at": ' + "9" * 400 + ", ", 1),
    "prior not UTF-8": b"\xff\xfe",
    "prior interruptions a string": json.dumps(
        {"format": contract.PRIOR_FORMAT, "cloud": "aws", "run_id": RUN, "updated_at": 1, "interruptions": "x"}
    ),
}


@pytest.mark.parametrize("case", sorted(PRIORS))
def test_spot_interruption_replaces_a_damaged_prior_in_one_line(fleet, capsys, case):  # noqa: F811
    s3_put(PRIMARY, PRIOR_KEY, PRIORS[case])
    result = spot.handler(spot_warning(fleet[0]), None)
    assert result["decision"] == "recorded"
    one_line(capsys, "prior-replaced")
    import boto3

    body = boto3.client("s3", region_name=REGION).get_object(Bucket=PRIMARY, Key=PRIOR_KEY)["Body"].read()
    assert [i.node_id for i in contract.parse_interruption_prior(body).interruptions] == [fleet[0]]


SPOT_EVENTS = {
    "instance id of fullwidth digits": spot_warning("i-\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17"),
    "instance id with a newline": spot_warning("i-0abc1234def567890\n"),
    "action an array": {
        **spot_warning("i-0abc1234def567890"),
        "detail": {"instance-id": "i-0abc1234def567890", "instance-action": ["terminate"]},
    },
    "detail nested deep": {**spot_warning("i-0abc1234def567890"), "detail": json.loads("[" * 500 + "]" * 500)},
}


@pytest.mark.parametrize("case", sorted(SPOT_EVENTS))
def test_spot_interruption_drops_a_hostile_event(fleet, capsys, case):  # noqa: F811
    assert spot.handler(SPOT_EVENTS[case], None)["decision"] == "dropped"
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]


# --- unhealthy_node: the replacement log nodes can write ------------------------------

REPLACEMENTS_KEY = f"{ROOT}/fleet/replacements.json"


def replacement_log(entry: Any) -> str:
    return json.dumps({"groups": {SWEEP_GROUP: [entry]}})


LOGS: dict[str, str] = {
    "entry time not a number": replacement_log({"instance_id": "i-1", "at": "yesterday"}),
    "entry time null": replacement_log({"instance_id": "i-1", "at": None}),
    "entry time an integer past a float": replacement_log({"instance_id": "i-1"})[:-3]
    + ', "at": '
    + "9" * 400
    + "}]}}",
    "entry time infinite": replacement_log({"instance_id": "i-1"})[:-4] + ', "at": 1e999}]}}',
    "entry time in the far future": replacement_log({"instance_id": "i-1", "at": 4e12}),
    "entry not an object": replacement_log(["i-1", 1]),
    "entry without an instance": replacement_log({"at": 1}),
    "group entries not a list": json.dumps({"groups": {SWEEP_GROUP: "i-1"}}),
}


@pytest.mark.parametrize("case", sorted(LOGS))
def test_unhealthy_node_repairs_a_damaged_replacement_log_and_replaces(sweep, capsys, case):  # noqa: F811
    a, b, c = make_group(SWEEP_GROUP, size=3)
    for node, steps in ((a, 40), (b, 40), (c, 0)):
        publish(node, steps, sweep.clock)
    s3_put(PRIMARY, REPLACEMENTS_KEY, LOGS[case])
    result = sweep(max_per_hour=1)  # a bad entry must not use up the budget of one
    assert result["replaced"] == [c] and unhealthy_nodes() == [c]
    one_line(capsys, "replacement-log-repaired")


def test_unhealthy_node_replaces_a_log_nested_past_the_parser(sweep, capsys):  # noqa: F811
    a, b, c = make_group(SWEEP_GROUP, size=3)
    for node, steps in ((a, 40), (b, 40), (c, 0)):
        publish(node, steps, sweep.clock)
    s3_put(PRIMARY, REPLACEMENTS_KEY, DEEP)
    assert sweep(max_per_hour=1)["replaced"] == [c]
    one_line(capsys, "replacement-log-repaired")


# --- storage_drift: CloudTrail records of hostile shape -------------------------------


def trail(event_name: str = "PutBucketPolicy", **changes: Any) -> dict:
    event = cloudtrail_call("aws.s3", event_name, {"bucketName": PRIMARY})
    for key, value in changes.items():
        event["detail"][key] = value
    return event


DRIFT_EVENTS = {
    "bucket a look-alike of the stack's": trail(requestParameters={"bucketName": PRIMARY.replace("i", "\u0131")}),
    "bucket name of 100 kB": trail(requestParameters={"bucketName": "b" * 100_000}),
    "request parameters a string": trail(requestParameters="bucketName=" + PRIMARY),
    "event name of 100 kB": trail(eventName="Put" * 30_000),
    "user identity a list": trail(userIdentity=["root"], requestParameters={"bucketName": "someone-elses"}),
}


@pytest.mark.parametrize("case", sorted(DRIFT_EVENTS))
def test_storage_drift_drops_a_hostile_record(no_aws, monkeypatch, tmp_path, capsys, case):
    desired = tmp_path / "desired.json"
    desired.write_text(render({PRIMARY: {"region": REGION}}, {"file_system_id": "fs-1"}))
    configure(monkeypatch, DriftConfig(stack=STACK, run_id=RUN, desired_file=str(desired)))
    result = drift.handler(copy.deepcopy(DRIFT_EVENTS[case]), None)
    assert result["decision"] == "dropped"
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]


def test_the_aws_corpus_is_large_enough():
    events = len(HANDOFF_EVENTS) + len(SPOT_EVENTS) + len(DRIFT_EVENTS) + 5 * len(HOSTILE_ENVELOPES)
    state = len(WATCH_STATE) + len(MARKERS) + len(PRIORS) + len(LOGS) + 1
    assert events >= 40 and state >= 20


# --- every AWS handler: envelopes of hostile shape ------------------------------------


def envelope(**changes: Any) -> dict:
    event = spot_warning("i-0abc1234def567890")
    event.update(changes)
    return event


HOSTILE_ENVELOPES = {
    "source a list": envelope(source=["aws.ec2"]),
    "detail-type of 100 kB": envelope(**{"detail-type": "x" * 100_000}),
    "time NaN": envelope(time="NaN"),
    "time with a 99-hour offset": envelope(time="2026-01-01T00:00:00+99:00"),
    "id an object": envelope(id={"$ne": None}),
    "detail null bytes": envelope(detail="\x00" * 64),
    "a body of 10,000 keys": {f"k{i}": i for i in range(10_000)},
    "detail-type with a NUL": envelope(**{"detail-type": "EC2 Spot Instance Interruption Warning\x00"}),
}


def handlers(tmp_path) -> dict[str, tuple[Any, Any]]:
    from ftfleet.lambdas.capacity_watch import handler as capacity
    from ftfleet.lambdas.capacity_watch.config import Config as CapacityConfig
    from ftfleet.lambdas.lifecycle_handoff import handler as handoff
    from ftfleet.lambdas.lifecycle_handoff.config import Config as HandoffConfig
    from ftfleet.lambdas.replication_watch import handler as watch
    from ftfleet.lambdas.replication_watch.config import Config as WatchConfig
    from ftfleet.lambdas.spot_interruption.config import Config as SpotConfig
    from ftfleet.lambdas.unhealthy_node import handler as unhealthy
    from ftfleet.lambdas.unhealthy_node.config import Config as UnhealthyConfig

    desired = tmp_path / "desired.json"
    desired.write_text(render({PRIMARY: {"region": REGION}}, {"file_system_id": "fs-1"}))
    base = {"stack": STACK, "run_id": RUN}
    return {
        "spot_interruption": (spot, SpotConfig(**base, groups=(SPOT_GROUP,), bucket=PRIMARY, root=ROOT)),
        "lifecycle_handoff": (
            handoff,
            HandoffConfig(
                **base, groups=(HANDOFF_GROUP,), bucket=PRIMARY, root=ROOT, max_wait_s=60.0, heartbeat_s=20.0
            ),
        ),
        "unhealthy_node": (
            unhealthy,
            UnhealthyConfig(**base, groups=(SWEEP_GROUP,), bucket=PRIMARY, root=ROOT, grace_s=600.0, max_per_hour=2),
        ),
        "storage_drift": (drift, DriftConfig(**base, desired_file=str(desired))),
        "replication_watch": (
            watch,
            WatchConfig(**base, bucket=PRIMARY, replica_bucket=REPLICA, replica_region=REPLICA_REGION, root=ROOT),
        ),
        "capacity_watch": (capacity, CapacityConfig(**base, groups=(SWEEP_GROUP,), loss_s=1200.0)),
    }


@pytest.mark.parametrize(
    "function",
    [
        "spot_interruption",
        "lifecycle_handoff",
        "unhealthy_node",
        "storage_drift",
        "replication_watch",
        "capacity_watch",
    ],
)
@pytest.mark.parametrize("case", sorted(HOSTILE_ENVELOPES))
def test_every_handler_drops_a_hostile_envelope_without_calling_aws(
    no_aws, monkeypatch, tmp_path, capsys, function, case
):
    # No AWS at all: a handler that went past validation would fail.
    module, config = handlers(tmp_path)[function]
    configure(monkeypatch, config)
    assert module.handler(copy.deepcopy(HOSTILE_ENVELOPES[case]), None)["decision"] == "dropped"
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]
