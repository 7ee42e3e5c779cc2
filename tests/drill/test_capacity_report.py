"""The capacity-loss drill passes only when the run completed in the standby region
with the reference's state and its first step there came within the limit of the
failover decision; the report says which measure failed."""

from __future__ import annotations

import json

from drill.capacity_report import FIRST_STEP_LIMIT_S, CapacityReport


def report(**kw) -> CapacityReport:
    fields = dict(
        loss_step=20,
        steps=60,
        loss_s=10.0,
        watch_every_s=2.0,
        t_loss=1000.0,
        t_decision=1012.0,
        t_sized=1015.0,
        t_first_standby_step=1030.0,
        home_last_step=21,
        home_committed_step=21,
        home_durable_at_loss=15,
        home_durable_at_decision=21,
        replica_at_decision=20,
        resumed_from=20,
        resumed_tier="primary",
        final_step=60,
        completed=True,
        state_sha256="ab" * 32,
        reference_sha256="ab" * 32,
    )
    return CapacityReport(**{**fields, **kw})


def test_a_completed_failover_with_the_reference_state_passes_and_is_measured_from_the_loss():
    r = report()
    assert r.ok and r.reason.startswith("the run moved to the standby region by itself")
    assert (r.loss_to_decision_s, r.decision_to_sized_s, r.decision_to_first_step_s, r.loss_to_first_step_s) == (
        12.0,
        3.0,
        18.0,
        30.0,
    )
    assert (r.steps_recomputed, r.not_replicated_steps) == (1, 1)
    data = json.loads(r.dumps())
    assert data["ok"] and data["state_matches_reference"] and data["decision_to_first_step_s"] == 18.0
    assert "PASS" in r.to_text() and "| failover decision -> first standby step | 18.0 s" in r.to_markdown()


def test_a_first_step_later_than_the_limit_after_the_decision_fails():
    r = report(t_first_standby_step=1012.0 + FIRST_STEP_LIMIT_S + 1)
    assert not r.ok and "limit 180 s" in r.reason


def test_a_final_state_other_than_the_reference_fails():
    r = report(state_sha256="cd" * 32)
    assert not r.ok and "differs from the reference's" in r.reason and "FAIL" in r.to_text()


def test_a_drill_that_ended_early_fails_with_its_problem_and_no_standby_times():
    r = report(t_decision=None, t_sized=None, t_first_standby_step=None, completed=False, problem="the watch\nlog")
    assert not r.ok and r.reason == "the watch"
    assert r.decision_to_first_step_s is None and "| failover decision -> standby sized | - |" in r.to_markdown()
