"""The drill's plan: faults in order, spaced, each on the right node."""

from __future__ import annotations

import pytest

from drill.scenario import FAULTS, build_plan, parse_faults
from ftfleet.errors import UserError


def test_every_fault_gets_its_own_step_and_nodes_change_where_a_node_must_go():
    plan = build_plan(list(FAULTS), first_step=20, spacing=20)
    assert plan.steps == 160
    assert [(s.node, s.triggers, s.stop_at_step, s.before) for s in plan.segments] == [
        ("node-1", [("notice", 20)], None, []),
        ("node-2", [("rebalance", 40), ("sigkill", 60)], 80, []),
        ("node-3", [], 120 + 20, ["corrupt"]),
        ("node-4", [], None, ["bucket_loss"]),
    ]
    assert (plan.nan_step, plan.hang_step) == (100, 120)
    assert [plan.step_of(k) for k in FAULTS] == [20, 40, 60, 80, 100, 120, 140]


def test_a_short_drill_runs_on_as_many_nodes_as_its_faults_need():
    plan = build_plan(["notice", "sigkill"], first_step=10, spacing=15)
    assert [(s.triggers, s.stop_at_step) for s in plan.segments] == [
        ([("notice", 10)], None),
        ([("sigkill", 25)], None),
    ]
    assert plan.steps == 40


def test_faults_are_put_in_drill_order_and_unknown_ones_refused():
    assert parse_faults("sigkill, notice") == ["notice", "sigkill"]
    assert parse_faults("bucket-loss") == ["bucket_loss"]
    assert parse_faults("all") == list(FAULTS)
    with pytest.raises(UserError, match="unknown fault meteor"):
        parse_faults("notice,meteor")


def test_a_plan_needs_room_for_a_checkpoint_before_each_fault():
    with pytest.raises(UserError, match="at least 2 steps"):
        build_plan(["notice"], spacing=1)
    with pytest.raises(UserError, match="at least one fault"):
        build_plan([])
