"""The node completes its own termination lifecycle action (AWS), against moto behind
the stand-in for the call moto lacks (drill/aws_standin.py)."""

from __future__ import annotations

import logging

import pytest

from drill.aws_standin import AwsStandIn
from drill.fake_metadata import FakeMetadataServer
from ftfleet import contract
from ftfleet.trainer.resilience.preemption.release import LifecycleRelease
from tests.trainer.resilience.aws_group import GROUP, make_group


@pytest.fixture(scope="module")
def standin():
    with AwsStandIn() as server:
        yield server


@pytest.fixture
def aws_env(standin, monkeypatch):
    for k, v in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", standin.url)
    standin.calls.clear()
    return standin


@pytest.fixture(scope="module")
def instance_id(standin):
    return make_group(standin.moto_url)


def env(metadata_url: str, instance_id: str, **extra: str) -> dict[str, str]:
    return {
        "FTFLEET_CLOUD": "aws",
        "FTFLEET_REGION": "us-east-1",
        "FTFLEET_NODE_ID": instance_id,
        "FTFLEET_METADATA_ENDPOINT": metadata_url,
        **extra,
    }


def test_the_node_completes_its_action_with_continue_in_the_group_named_by_its_imds_tag(aws_env, instance_id):
    with FakeMetadataServer(instance_id=instance_id, group_name=GROUP) as imds:
        release = LifecycleRelease.from_env(env(imds.url, instance_id))
        outcome = release.complete()
    assert outcome["result"] == "completed", outcome
    (call,) = aws_env.completions()
    assert call["params"] == {
        "LifecycleHookName": contract.TERMINATION_HOOK_NAME,
        "AutoScalingGroupName": GROUP,
        "InstanceId": instance_id,
        "LifecycleActionResult": "CONTINUE",
    }


def test_the_group_name_from_the_environment_wins_over_imds(aws_env, instance_id):
    release = LifecycleRelease.from_env(env("http://127.0.0.1:9", instance_id, FTFLEET_GROUP_NAME=GROUP))
    assert release.complete()["result"] == "completed"
    assert aws_env.completions()[0]["params"]["AutoScalingGroupName"] == GROUP


def test_without_a_group_the_node_calls_nothing_and_says_so_once(aws_env, instance_id, caplog):
    with FakeMetadataServer(instance_id=instance_id) as imds, caplog.at_level(logging.WARNING, "ftfleet.lifecycle"):
        outcome = LifecycleRelease.from_env(env(imds.url, instance_id)).complete()
    assert outcome["result"] == "no-group"
    assert aws_env.calls == []
    assert len([r for r in caplog.records if r.name == "ftfleet.lifecycle"]) == 1


def test_a_refused_completion_is_one_log_line_and_never_raises(aws_env, caplog):
    release = LifecycleRelease.from_env(env("http://127.0.0.1:9", "i-0notinthegroup0000", FTFLEET_GROUP_NAME=GROUP))
    with caplog.at_level(logging.WARNING, "ftfleet.lifecycle"):
        outcome = release.complete()
    assert outcome["result"] == "no-action", outcome
    (record,) = [r for r in caplog.records if r.name == "ftfleet.lifecycle"]
    assert "lifecycle_handoff completes it" in record.getMessage()


def test_an_unreachable_endpoint_fails_within_the_retry_bound_without_raising(monkeypatch, instance_id):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, "test")
    release = LifecycleRelease.from_env(env("http://127.0.0.1:9", instance_id, FTFLEET_GROUP_NAME=GROUP))
    outcome = release.complete()
    assert outcome["result"] == "failed" and "Connect" in outcome["error"], outcome


@pytest.mark.parametrize(
    "environ",
    [
        {"FTFLEET_CLOUD": "gcp", "FTFLEET_REGION": "us-central1", "FTFLEET_NODE_ID": "vm-1"},
        {"FTFLEET_CLOUD": "aws", "FTFLEET_NODE_ID": "i-1"},
        {"FTFLEET_CLOUD": "aws", "FTFLEET_REGION": "us-east-1"},
    ],
    ids=["gcp", "no-region", "no-node-id"],
)
def test_no_lifecycle_release_off_aws_or_without_region_or_instance(environ):
    assert LifecycleRelease.from_env(environ) is None
