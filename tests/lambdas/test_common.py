"""The shared pieces: configuration at cold start, the decision log, the heartbeat loop,
conditional JSON updates and client retries."""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
import threading

import boto3
import pytest

from ftfleet.lambdas.common import aws, runtime
from ftfleet.lambdas.common.config import (
    COUNT,
    NAMES,
    SECONDS,
    FunctionConfig,
    FunctionConfigError,
    StackConfig,
    var,
)
from ftfleet.lambdas.common.events import Dropped
from ftfleet.lambdas.common.heartbeat import Gone, Heartbeat
from ftfleet.lambdas.spot_interruption.config import Config as SpotConfig
from tests.lambdas.conftest import PRIMARY, REGION, decisions, make_bucket


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample(FunctionConfig):
    groups: tuple[str, ...] = var("T_GROUPS", "the groups", NAMES)
    wait: float = var("T_WAIT", "seconds to wait", SECONDS)
    limit: int = var("T_LIMIT", "a limit", COUNT, default=3)


def test_config_round_trips_through_the_environment():
    cfg = Sample(groups=("a", "b"), wait=2.5, limit=7)
    assert Sample.from_env(cfg.to_env()) == cfg
    assert Sample.from_env({"T_GROUPS": '["a"]', "T_WAIT": "1"}).limit == 3


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"T_WAIT": "1"}, "T_GROUPS is not set: the groups"),
        ({"T_GROUPS": '["a"]', "T_WAIT": "  "}, "T_WAIT is not set"),
        ({"T_GROUPS": "a,b", "T_WAIT": "1"}, "T_GROUPS='a,b' is not a JSON list of names"),
        ({"T_GROUPS": "[]", "T_WAIT": "1"}, "T_GROUPS='[]' is not a JSON list of names"),
        ({"T_GROUPS": '["a"]', "T_WAIT": "-4"}, "T_WAIT='-4' is not a positive number of seconds"),
        ({"T_GROUPS": '["a"]', "T_WAIT": "1", "T_LIMIT": "0"}, "T_LIMIT='0' is not a whole number >= 1"),
    ],
)
def test_a_missing_or_bad_variable_is_one_line_naming_it(environ, message):
    with pytest.raises(FunctionConfigError) as err:
        Sample.from_env(environ)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_function_without_its_environment_fails_before_reading_the_event(monkeypatch, capsys):
    from ftfleet.lambdas.spot_interruption import handler as spot

    for name in SpotConfig.env_names():
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(FunctionConfigError, match="FTFLEET_STACK is not set"):
        spot.handler({"not": "even looked at"}, None)
    assert decisions(capsys) == []


def test_inside_lambda_a_missing_variable_fails_the_cold_start_itself(monkeypatch):
    monkeypatch.setenv("AWS_LAMBDA_FUNCTION_NAME", "ftfleet-aws-test-spot-interruption")
    for name in SpotConfig.env_names():
        monkeypatch.delenv(name, raising=False)
    name = "ftfleet.lambdas.spot_interruption.handler"
    saved = sys.modules.pop(name)
    try:
        with pytest.raises(FunctionConfigError, match="is not set"):
            importlib.import_module(name)
    finally:
        sys.modules[name] = saved


def test_runtime_logs_an_unexpected_error_and_raises_it_for_a_retry(monkeypatch, capsys):
    monkeypatch.setenv("FTFLEET_STACK", "s")
    monkeypatch.setenv("FTFLEET_RUN_ID", "r")

    class Cfg(StackConfig):
        pass

    def boom(event, cfg, log, context):
        raise RuntimeError("the API said no")

    with pytest.raises(RuntimeError):
        runtime.run("probe", Cfg, boom, {}, None)
    (line,) = decisions(capsys)
    assert line["decision"] == "error" and line["level"] == "ERROR" and "the API said no" in line["error"]

    def drop(event, cfg, log, context):
        raise Dropped("not ours", thing="x")

    assert runtime.run("probe", Cfg, drop, {}, None) == decisions(capsys)[0]


# --- the heartbeat loop -------------------------------------------------------------


def test_heartbeat_stops_when_the_wait_ends():
    seen = threading.Event()
    with Heartbeat(seen.set, 0.001) as hb:
        assert seen.wait(5)
    beats = hb.beats
    assert not hb.alive and hb.beats == beats


def test_heartbeat_stops_when_the_wait_raises():
    hb = Heartbeat(lambda: None, 0.001)
    with pytest.raises(ValueError), hb:
        raise ValueError("the wait failed")
    assert not hb.alive


def test_heartbeat_stops_when_the_wait_is_cancelled():
    hb = Heartbeat(lambda: None, 0.001)
    with pytest.raises(KeyboardInterrupt), hb:
        raise KeyboardInterrupt
    assert not hb.alive


def test_heartbeat_stops_by_itself_when_the_action_is_gone_and_survives_failed_beats():
    calls = []
    errors = []

    def beat():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("flaky")
        raise Gone("no active lifecycle action")

    with Heartbeat(beat, 0.001, on_error=errors.append) as hb:
        assert hb.gone.wait(5)
    assert not hb.alive and len(calls) == 3 and hb.failures == 2 and len(errors) == 2


def test_no_heartbeat_before_the_first_interval():
    calls = []
    with Heartbeat(lambda: calls.append(1), 3600):
        pass
    assert calls == []


# --- conditional JSON updates ----------------------------------------------------------


def test_update_json_never_loses_a_concurrent_write(moto):
    make_bucket(PRIMARY)
    key = "checkpoints/r/fleet/doc.json"
    raced = []

    def add(item):
        def change(doc):
            doc = dict(doc or {"items": []})
            if not raced:  # another writer lands between our read and our write, once
                raced.append(1)
                boto3.client("s3", region_name=REGION).put_object(
                    Bucket=PRIMARY, Key=key, Body=json.dumps({"items": ["theirs"]}).encode()
                )
            return {"items": [*doc["items"], item]}, True

        return change

    doc, changed = aws.update_json(PRIMARY, key, add("ours"))
    assert changed and doc == {"items": ["theirs", "ours"]}
    stored = json.loads(boto3.client("s3", region_name=REGION).get_object(Bucket=PRIMARY, Key=key)["Body"].read())
    assert stored == {"items": ["theirs", "ours"]}


def test_update_json_writes_nothing_when_nothing_changes(moto):
    make_bucket(PRIMARY)
    doc, changed = aws.update_json(PRIMARY, "k.json", lambda d: (d, False))
    assert (doc, changed) == (None, False)
    assert "Contents" not in boto3.client("s3", region_name=REGION).list_objects_v2(Bucket=PRIMARY)


def test_clients_use_standard_retries_and_are_built_on_first_use():
    assert aws._client.cache_info().currsize == 0
    ec2 = aws.client("ec2")
    assert ec2.meta.config.retries["mode"] == "standard"
    assert aws.client("ec2", None) is ec2 and aws._client.cache_info().currsize == 1


def test_update_json_writes_into_a_bucket_with_an_object_lock_default_retention(moto, monkeypatch):
    """Prod buckets lock every new version; such a PUT needs a checksum, which SDKs older
    than Lambda's newest (or configured "when_required") do not add on their own."""
    import botocore.config

    monkeypatch.setattr(
        aws, "_CONFIG", aws._CONFIG.merge(botocore.config.Config(request_checksum_calculation="when_required"))
    )
    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=PRIMARY, ObjectLockEnabledForBucket=True)
    s3.put_object_lock_configuration(
        Bucket=PRIMARY,
        ObjectLockConfiguration={
            "ObjectLockEnabled": "Enabled",
            "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}},
        },
    )
    doc, changed = aws.update_json(PRIMARY, "fleet/doc.json", lambda d: ({"n": 1}, True))
    assert changed and json.loads(s3.get_object(Bucket=PRIMARY, Key="fleet/doc.json")["Body"].read()) == {"n": 1}
