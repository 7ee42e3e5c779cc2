"""lifecycle_handoff: heartbeats while it waits for the node's marker, completes the
action when the marker appears or at the deadline, and never leaves a heartbeat behind."""

from __future__ import annotations

import threading
import time
from unittest import mock

import botocore.client
import pytest

from ftfleet import contract
from ftfleet.lambdas.common import aws
from ftfleet.lambdas.common.events import iso
from ftfleet.lambdas.lifecycle_handoff import handler as handoff
from ftfleet.lambdas.lifecycle_handoff.config import Config
from tests.lambdas.conftest import (
    PRIMARY,
    ROOT,
    RUN,
    STACK,
    Context,
    FakeClock,
    MissingOps,
    client_error,
    configure,
    decisions,
    lifecycle_action,
    make_bucket,
    malformed_variants,
    metric_sum,
    s3_put,
    throttle,
)

GROUP = "ftfleet-aws-test-workers"
NODE = "i-0abc1234def567890"
HOOK = contract.TERMINATION_HOOK_NAME
MAX_WAIT = 300.0
DEFAULT = object()


class Autoscaling(MissingOps):
    """The two lifecycle calls moto 5.2.5 lacks, with AWS's answer once an action is done."""

    def __init__(self):
        super().__init__({"RecordLifecycleActionHeartbeat": self._heartbeat, "CompleteLifecycleAction": self._complete})
        self.done: set[str] = set()
        self.beat = threading.Event()

    def _gone(self, op, params):
        return client_error(
            "ValidationError", f"No active Lifecycle Action found with token {params['LifecycleActionToken']}", op
        )

    def _heartbeat(self, params):
        if params["LifecycleActionToken"] in self.done:
            raise self._gone("RecordLifecycleActionHeartbeat", params)
        self.beat.set()
        return {}

    def _complete(self, params):
        if params["LifecycleActionToken"] in self.done:
            raise self._gone("CompleteLifecycleAction", params)
        self.done.add(params["LifecycleActionToken"])
        return {}


@pytest.fixture
def asg():
    fake = Autoscaling()
    with mock.patch.object(botocore.client.BaseClient, "_make_api_call", lambda c, op, p: fake(c, op, p)):
        yield fake


class Clock(FakeClock):
    """A fake clock whose sleeps can run a step of the scenario."""

    def __init__(self, start, on_sleep=None):
        super().__init__(start)
        self.on_sleep = on_sleep

    def sleep(self, seconds):
        if self.on_sleep:
            self.on_sleep(self)
        super().sleep(seconds)


@pytest.fixture
def setup(moto, monkeypatch):
    make_bucket(PRIMARY)

    def run(heartbeat_s=3600.0, on_sleep=None, context=None, event=DEFAULT):
        configure(
            monkeypatch,
            Config(
                stack=STACK,
                run_id=RUN,
                groups=(GROUP,),
                bucket=PRIMARY,
                root=ROOT,
                max_wait_s=MAX_WAIT,
                heartbeat_s=heartbeat_s,
                poll_s=30.0,
            ),
        )
        clock = Clock(time.time(), on_sleep)
        monkeypatch.setattr(handoff, "clock", clock)
        ev = lifecycle_action(NODE, GROUP, HOOK, time=iso(clock.t)) if event is DEFAULT else event
        return handoff.handler(ev, context or Context()), clock

    return run


def write_marker(written_at, node=NODE, run=RUN, reason="termination"):
    marker = contract.CommitMarker(run, node, 1200, reason, True, written_at)
    s3_put(PRIMARY, f"{ROOT}/{contract.marker_key(node)}", marker.to_json())


def heartbeat_threads():
    return [t for t in threading.enumerate() if t.name.startswith("ftfleet-heartbeat") and t.is_alive()]


def test_the_action_completes_as_soon_as_the_node_s_marker_appears(setup, asg):
    def node_commits_on_second_poll(clock):
        if len(clock.slept) == 1:
            write_marker(clock.t)

    result, clock = setup(on_sleep=node_commits_on_second_poll)
    assert result["decision"] == "completed" and result["outcome"] == "marker" and result["marker_step"] == 1200
    assert asg.calls[-1] == (
        "CompleteLifecycleAction",
        {
            "AutoScalingGroupName": GROUP,
            "LifecycleHookName": HOOK,
            "InstanceId": NODE,
            "LifecycleActionToken": "tok-1",
            "LifecycleActionResult": "CONTINUE",
        },
    )
    assert clock.slept == [30.0, 30.0]  # waited exactly until the marker was there
    assert metric_sum("HandoffWaitSeconds", {"Stack": STACK, "Outcome": "marker"}) == pytest.approx(60.0, abs=1.0)


def test_without_a_marker_the_action_completes_at_the_deadline(setup, asg):
    result, clock = setup()
    assert result["outcome"] == "deadline"
    assert asg.names() == ["CompleteLifecycleAction"]
    assert sum(clock.slept) == pytest.approx(MAX_WAIT, abs=1.0)


def test_the_deadline_respects_the_function_s_own_time_limit(setup, asg):
    result, clock = setup(context=Context(remaining_s=60.0))
    assert result["outcome"] == "deadline"
    assert sum(clock.slept) == pytest.approx(60.0 - handoff.MARGIN_S, abs=1.0)


@pytest.mark.parametrize(
    "marker",
    [
        {"written_at_offset": -contract.MARKER_NOTICE_SLACK_S - 60},  # an earlier notice's marker
        {"reason": "rebalance"},  # an early checkpoint: the node carries on
        {"run": "another-run"},
    ],
    ids=["stale", "rebalance", "other-run"],
)
def test_a_marker_that_does_not_release_the_node_is_ignored(setup, asg, marker):
    def stale_marker_is_there(clock):
        if not clock.slept:
            write_marker(
                clock.t + marker.get("written_at_offset", 0.0),
                run=marker.get("run", RUN),
                reason=marker.get("reason", "termination"),
            )

    result, _ = setup(on_sleep=stale_marker_is_there)
    assert result["outcome"] == "deadline"


def test_a_marker_written_during_the_spot_notice_before_the_event_releases_the_node(setup, asg):
    result, _ = setup(on_sleep=lambda clock: write_marker(clock.t - 90.0) if not clock.slept else None)
    assert result["outcome"] == "marker"


def test_heartbeats_are_sent_while_waiting_and_stop_with_the_wait(setup, asg):
    def marker_after_a_heartbeat(clock):
        assert asg.beat.wait(10), "no heartbeat while waiting"
        write_marker(clock.t)

    result, _ = setup(heartbeat_s=0.001, on_sleep=marker_after_a_heartbeat)
    assert result["outcome"] == "marker" and result["heartbeats"] >= 1
    names = asg.names()
    assert "RecordLifecycleActionHeartbeat" in names and names[-1] == "CompleteLifecycleAction"
    assert heartbeat_threads() == []
    calls_after = len(asg.calls)
    time.sleep(0.01)  # a leaked loop would beat again here
    assert len(asg.calls) == calls_after


def test_when_the_node_completed_the_action_first_the_wait_stops(setup, asg):
    def node_completes_itself(clock):
        asg.done.add("tok-1")
        asg.beat.clear()

    result, _ = setup(heartbeat_s=0.001, on_sleep=node_completes_itself)
    assert result["decision"] == "already-complete" and result["outcome"] == "already-complete"
    assert "CompleteLifecycleAction" not in asg.names()
    assert heartbeat_threads() == []


def test_a_duplicate_delivery_is_harmless(setup, asg):
    write_marker(time.time())
    first, _ = setup()
    second, _ = setup()
    assert first["decision"] == "completed"
    assert second["decision"] == "already-complete"
    assert asg.names() == ["CompleteLifecycleAction", "CompleteLifecycleAction"]


def test_a_failing_bucket_ends_the_wait_with_an_error_and_no_heartbeat_left(setup, asg, capsys):
    throttle(aws.client("s3"), "ListObjectsV2", times=50)
    with pytest.raises(Exception, match="SlowDown"):
        setup(heartbeat_s=0.001)
    assert heartbeat_threads() == []
    assert "CompleteLifecycleAction" not in asg.names()  # the retry or the hook's timeout decides
    assert decisions(capsys)[-1]["decision"] == "error"


def test_throttled_marker_reads_are_retried(setup, asg):
    write_marker(time.time())
    hits = throttle(aws.client("s3"), "ListObjectsV2", times=2)
    result, _ = setup()
    assert result["outcome"] == "marker" and len(hits) == 2


@pytest.mark.parametrize(
    ("group", "hook", "reason"),
    [
        ("someone-elses-group", HOOK, "group of another stack"),
        (GROUP, "someone-elses-hook", "hook 'someone-elses-hook' is not"),
    ],
)
def test_actions_of_other_groups_and_hooks_are_dropped(setup, asg, group, hook, reason):
    result, _ = setup(event=lifecycle_action(NODE, group, hook))
    assert result["decision"] == "dropped" and reason in result["reason"]
    assert asg.calls == []


def test_a_launch_transition_is_dropped(setup, asg):
    event = lifecycle_action(NODE, GROUP, HOOK)
    event["detail"]["LifecycleTransition"] = "autoscaling:EC2_INSTANCE_LAUNCHING"
    result, _ = setup(event=event)
    assert result["decision"] == "dropped" and asg.calls == []


@pytest.mark.parametrize(
    "event",
    malformed_variants(
        lifecycle_action(NODE, GROUP, HOOK),
        ["LifecycleActionToken", "AutoScalingGroupName", "LifecycleHookName", "EC2InstanceId", "LifecycleTransition"],
    ),
)
def test_a_malformed_event_is_logged_and_dropped(setup, asg, capsys, event):
    result, _ = setup(event=event)
    assert result["decision"] == "dropped"
    assert [d["decision"] for d in decisions(capsys)] == ["dropped"]
    assert asg.calls == []
