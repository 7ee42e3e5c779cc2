"""Bad configuration of the remediation functions: one line naming the key, exit 2."""

from __future__ import annotations

import pytest

from ftfleet.cli import main
from tests.infra.test_config import bad_stack

BAD = {
    "trail mode": (
        {"ftfleet:cloudTrail": "maybe"},
        "ftfleet:cloudTrail is 'maybe'; use create (a trail for this stack)",
    ),
    "no replacements": (
        {"ftfleet:unhealthyNodeMaxReplacementsPerHour": 0},
        "ftfleet:unhealthyNodeMaxReplacementsPerHour is 0; it must be at least 1",
    ),
    "a drain per hour": (
        {"ftfleet:unhealthyNodeMaxReplacementsPerHour": 500},
        "ftfleet:unhealthyNodeMaxReplacementsPerHour is 500; it must be at most 100",
    ),
    "grace too short": (
        {"ftfleet:unhealthyNodeGraceSeconds": 30},
        "ftfleet:unhealthyNodeGraceSeconds is 30; it must be at least 60",
    ),
    "lag alarm too short": (
        {"ftfleet:replicationLagAlarmSeconds": 10},
        "ftfleet:replicationLagAlarmSeconds is 10; it must be at least 60",
    ),
    "retention rule that is not one": (
        {"ftfleet:checkpointRetention": ["all for 6h", "daily"]},
        "ftfleet:checkpointRetention[1]: 'daily' is not a rule",
    ),
    "switch not a boolean": (
        {"ftfleet:remediationLifecycleHandoff": "sometimes"},
        "ftfleet:remediationLifecycleHandoff must be true or false",
    ),
    "subscription without a protocol": (
        {"ftfleet:alarmSubscriptions": ["oncall@example.com"]},
        "ftfleet:alarmSubscriptions contains 'oncall@example.com'; write protocol:endpoint",
    ),
    "subscription of an unknown protocol": (
        {"ftfleet:alarmSubscriptions": ["pager:42"]},
        "ftfleet:alarmSubscriptions contains 'pager:42'; write protocol:endpoint",
    ),
    "email that is no address": (
        {"ftfleet:alarmSubscriptions": ["email:oncall"]},
        "ftfleet:alarmSubscriptions contains 'email:oncall'; a email endpoint is an email address",
    ),
    "sms not in E.164": (
        {"ftfleet:alarmSubscriptions": ["sms:555-0123"]},
        "a sms endpoint is a phone number in E.164 form",
    ),
    "subscriber twice": (
        {"ftfleet:alarmSubscriptions": ["email:a@example.com", "email:a@example.com"]},
        "ftfleet:alarmSubscriptions lists a subscriber twice",
    ),
    "mistyped switch": (
        {"ftfleet:remediationLifecycleHandof": False},
        "unknown config key ftfleet:remediationLifecycleHandof: did you mean ftfleet:remediationLifecycleHandoff?",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_remediation_config_exits_2_with_one_line_naming_the_key(case, tmp_path, capsys):
    changes, expected = BAD[case]
    assert main(["plan", bad_stack(tmp_path, changes)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert expected in err
