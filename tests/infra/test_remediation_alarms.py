"""The stack's alarms notify someone, and the replication-lag alarm does not flap.

CloudWatch's own evaluation is not in moto: :func:`alarm_state` stands in for it as the
CloudWatch User Guide documents it ("Configuring how CloudWatch alarms treat missing
data", "How alarm state is evaluated when data is missing"). AWS publishes no formula
for the length of the evaluation range (only an example where 3 evaluation periods
fetch 5), so every length from the evaluation periods to two more is tried.
"""

from __future__ import annotations

import random

import pytest

from ftfleet.infra import policies
from ftfleet.infra.aws import remediation_patterns
from tests.infra.conftest import recording, res_view

ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
TOPIC = "aws:sns/topic:Topic"
SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"
#: How late a replication_watch data point can be after its scheduled time: EventBridge
#: runs a scheduled rule within its minute, and the run takes up to its timeout (120 s).
JITTER_S = 60 + 120


def alarm_state(values: list[float | None], alarm: dict, range_len: int) -> str:
    """The state of ``alarm`` (recorded inputs) evaluated over the last ``range_len``
    periods' values (None: no data point in that period)."""
    n = int(alarm["evaluationPeriods"])
    m = int(alarm.get("datapointsToAlarm") or n)
    window = values[-range_len:]
    existing = [v for v in window if v is not None]
    treat = alarm.get("treatMissingData", "missing")

    def breaching(v: float) -> bool:
        op, t = alarm["comparisonOperator"], alarm["threshold"]
        return {
            "GreaterThanThreshold": v > t,
            "GreaterThanOrEqualToThreshold": v >= t,
            "LessThanThreshold": v < t,
            "LessThanOrEqualToThreshold": v <= t,
        }[op]

    if len(existing) == len(window):
        verdicts = [breaching(v) for v in window[-n:]]
    elif len(existing) >= n:  # the missing ones are ignored, whatever treatMissingData says
        verdicts = [breaching(v) for v in existing[-n:]]
    elif treat in ("missing", "ignore") and not existing:
        return "INSUFFICIENT_DATA"
    else:
        fill = {"breaching": True, "notBreaching": False}.get(treat, False)
        verdicts = [fill if v is None else breaching(v) for v in window[-n:]]
    return "ALARM" if sum(verdicts) >= m else "OK"


def scheduled_points(hours: float, interval_s: float, seed: int, value: float = 0.0, stop_at: float | None = None):
    """(time, value) of a scheduled function's data points: one per interval from a
    random start, each late by up to JITTER_S; none from ``stop_at`` on."""
    rng = random.Random(seed)
    start = rng.uniform(0, interval_s)
    out, k = [], 0
    while (t := start + k * interval_s) < hours * 3600:
        if stop_at is None or t < stop_at:
            out.append((t + rng.uniform(0, JITTER_S), value))
        k += 1
    return out


def states(alarm: dict, points, hours: float, range_len: int) -> list[str]:
    """The alarm's state at the end of each period."""
    period = int(alarm["period"])
    count = int(hours * 3600 // period)
    per: list[float | None] = [None] * count
    for t, v in points:
        p = int(t // period)
        if p < count:
            per[p] = v if per[p] is None else max(per[p], v)  # the alarm's statistic is Maximum
    return [alarm_state(per[: p + 1], alarm, range_len) for p in range(range_len, count)]


def lag_alarm(stack: str = "aws-prod") -> dict:
    (alarm,) = [r.inputs for r in recording(stack).of_type(ALARM) if r.inputs["name"].endswith("-replication-lag")]
    return alarm


INTERVAL_S = remediation_patterns.REPLICATION_WATCH_MINUTES * 60


@pytest.mark.parametrize("seed", range(5))
def test_the_replication_lag_alarm_stays_ok_while_the_watcher_reports_no_lag(seed):
    alarm = lag_alarm()
    assert alarm["treatMissingData"] == "breaching"  # a silent watcher is an alarm too
    n = int(alarm["evaluationPeriods"])
    points = scheduled_points(24, INTERVAL_S, seed)
    del points[len(points) // 2]  # one failed run (its errors alarm reports it)
    for range_len in range(n, n + 3):
        assert set(states(alarm, points, 24, range_len)) == {"OK"}, range_len


@pytest.mark.parametrize("seed", range(3))
def test_the_replication_lag_alarm_fires_when_the_watcher_stops_or_lag_persists(seed):
    alarm = lag_alarm()
    n, period = int(alarm["evaluationPeriods"]), int(alarm["period"])
    stop = 12 * 3600
    silent = scheduled_points(24, INTERVAL_S, seed, stop_at=stop)
    lagging = scheduled_points(24, INTERVAL_S, seed, value=float(alarm["threshold"]) + 1)
    for range_len in range(n, n + 3):
        got = states(alarm, silent, 24, range_len)
        first = got.index("ALARM") + range_len  # period index of the first ALARM
        assert 0 < (first + 1) * period - stop <= (range_len + 2) * period, range_len
        assert states(alarm, lagging, 24, range_len)[-1] == "ALARM"


def test_a_lag_alarm_whose_period_is_the_schedule_s_flaps():
    # What the lag alarm was: one period of the schedule's length, missing data breaching.
    old = {**lag_alarm(), "period": INTERVAL_S, "evaluationPeriods": 1, "datapointsToAlarm": 1}
    got = states(old, scheduled_points(24, INTERVAL_S, seed=0), 24, range_len=1)
    assert "ALARM" in got and "OK" in got


def test_no_alarm_is_silent():
    for stack in ("aws-dev", "aws-prod"):
        rec = recording(stack)
        topics = {t.urn: rec.region_of(t) for t in rec.of_type(TOPIC)}
        alarms = rec.of_type(ALARM)
        assert len(alarms) >= 16
        for alarm in alarms:
            assert alarm.inputs.get("actionsEnabled", True) is True
            linked = [u for u in alarm.deps("alarmActions") if u in topics]
            assert linked and {topics[u] for u in linked} == {rec.region_of(alarm)}, alarm.name
            assert alarm.inputs["okActions"] == alarm.inputs["alarmActions"]
        assert [v for v in policies.evaluate(res_view(rec)) if v[0] == "cloudwatch-alarms-notify"] == []


def res(props, name="alarm", region="us-east-1", deps=None):
    return policies.Res(ALARM, name, f"urn:{name}", props, region, deps or {})


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"alarmActions": []}, "no SNS topic among its alarm actions: the alarm notifies no one"),
        ({}, "no SNS topic among its alarm actions: the alarm notifies no one"),
        (
            {"alarmActions": ["arn:aws:sns:us-east-1:123456789012:t"], "actionsEnabled": False},
            "actions are disabled: the alarm notifies no one",
        ),
        (
            {"alarmActions": ["arn:aws:sns:us-west-2:123456789012:t"]},
            "its topic is in us-west-2, not in its own region us-east-1",
        ),
    ],
)
def test_a_silent_alarm_is_caught(props, message):
    found = [(n, m) for p, n, m in policies.evaluate([res(props)]) if p == "cloudwatch-alarms-notify"]
    assert found == [("alarm", message)]
    good = res({"alarmActions": ["arn:aws:sns:us-east-1:123456789012:t"]})
    assert [v for v in policies.evaluate([good]) if v[0] == "cloudwatch-alarms-notify"] == []


def test_subscriptions_from_config_reach_every_alarm_topic(variant):
    rec = variant(alarmSubscriptions=["email:oncall@example.com", "https://hooks.example.com/ftfleet"])
    topics = {t.urn: rec.region_of(t) for t in rec.of_type(TOPIC)}
    assert sorted(topics.values()) == ["us-east-1", "us-west-2"]
    subs = {(s.deps("topic")[0], s.inputs["protocol"], s.inputs["endpoint"]) for s in rec.of_type(SUBSCRIPTION)}
    assert subs == {
        (urn, protocol, endpoint)
        for urn in topics
        for protocol, endpoint in (("email", "oncall@example.com"), ("https", "https://hooks.example.com/ftfleet"))
    }
    assert variant(remediationReplicationLag=False).of_type(TOPIC)[0].inputs["name"].endswith("-alarms")
