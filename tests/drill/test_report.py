"""The drill's lives, goodput and report, on synthetic event logs."""

from __future__ import annotations

import json

import pytest

from drill.faults import FaultResult
from drill.lives import split_lives, steady_step_time
from drill.report import DrillReport, Goodput, predict
from ftfleet.trainer.resilience.interval.adaptive import daly_goodput, daly_interval
from tests.drill.events import life, restart_run

# -- lives, goodput and the report ----------------------------------------------------------


def test_events_are_split_into_lives_by_rank0_process():
    lives = split_lives(restart_run())
    assert [(life.pid, life.attempt, life.resumed_from) for life in lives] == [(100, 0, 0), (101, 1, 40)]
    assert lives[0].progress() == (45, pytest.approx(5.4))


def test_steady_step_time_excludes_start_up_and_restore():
    events = life(100, 0.0, last=11, dt=0.2) + life(101, 10.0, restored=11, first=12, last=21, dt=0.3)
    # 10 steps in 2.0 s, then 9 steps in 2.7 s
    assert steady_step_time(events) == pytest.approx(4.7 / 19)


def test_goodput_is_useful_step_time_over_wall_time():
    g = Goodput(final_step=200, wall_s=100.0, ref_step_s=0.4, ref_wall_s=90.0)
    assert g.useful_s == pytest.approx(80.0)
    assert g.goodput == pytest.approx(0.8)
    assert g.relative == pytest.approx(0.9)


def test_the_prediction_prices_the_runs_measured_costs_as_dalys_model_does():
    g = Goodput(final_step=200, wall_s=100.0, ref_step_s=0.4, ref_wall_s=90.0)
    saves = [{"event": "committed", "reason": "interval", "step": s, "blocked_s": 0.5} for s in (10, 20, 30, 40)]
    emergency = {"event": "committed", "reason": "notice", "step": 43, "blocked_s": 9.0}  # not an interval save
    faults = [FaultResult("sigkill", True, "", resume_s=r) for r in (4.0, 6.0)]
    p = predict([*saves, emergency], faults, g)
    assert (p.interval_s, p.cost_s, p.restart_s, p.faults, p.startup_s) == pytest.approx((4.0, 0.5, 5.0, 2, 10.0))
    # 10 s of start-up, 80 s of work with a 0.5 s save every 4 s, 2 x (5 s + 2 s)
    assert p.goodput == pytest.approx(80.0 / (10.0 + 80.0 * (1 + 0.5 / 4.0) + 2 * 7.0))
    assert (
        predict(saves[:1], faults, g) is None and predict(saves, [], g) is None and predict(saves, faults, None) is None
    )
    report = DrillReport(faults, g, "a", "a", True, "", prediction=p)
    assert "the model (Daly's costs, as `ftfleet plan` prices them) predicts" in report.to_text()
    assert report.to_json()["prediction"]["goodput"] == round(p.goodput, 4)


def test_daly_goodput_peaks_at_dalys_interval_and_falls_on_either_side():
    cost, restart, mtbf = 60 / 72, 5.0, 60.0
    best = daly_interval(cost, mtbf)
    g = daly_goodput(best, cost, restart, mtbf)
    assert 0 < g < 1
    assert daly_goodput(best / 3, cost, restart, mtbf) < g > daly_goodput(best * 3, cost, restart, mtbf)
    grid = max(daly_goodput(best * f / 100, cost, restart, mtbf) for f in range(50, 200))
    assert grid == pytest.approx(g, rel=2e-3)


def test_free_saves_and_restarts_with_rare_failures_approach_full_goodput():
    assert daly_goodput(1.0, 0.0, 0.0, 1e9) == pytest.approx(1.0, abs=1e-6)
    assert daly_goodput(10.0, 1.0, 0.0, 1e9) == pytest.approx(10 / 11, rel=1e-6)


def report(sha="abc", ok=True):
    faults = [
        FaultResult("notice", True, "fine", 0.3, 0, 3.1, 20),
        FaultResult("sigkill", ok, "fine" if ok else "no restarted group", 0.2, 4, 5.0, 40),
    ]
    return DrillReport(faults, Goodput(60, 40.0, 0.5, 35.0), sha, "abc", True, "the faulted run completed", ["a note"])


def test_the_drill_passes_only_when_every_recovery_worked_and_the_state_matches():
    assert report().ok
    failed = report(ok=False)
    assert not failed.ok and failed.reason == "SIGKILL of one worker: no restarted group"
    differs = report(sha="abd")
    assert not differs.ok and "differs" in differs.reason


def test_the_report_renders_one_row_per_fault_in_every_format():
    r = report()
    data = json.loads(r.dumps())
    assert [f["kind"] for f in data["faults"]] == ["notice", "sigkill"]
    assert data["goodput"]["goodput"] == pytest.approx(0.75)
    assert data["state_matches_reference"] is True
    md = r.to_markdown()
    assert sum(line.startswith("| ") for line in md.splitlines()) == 3  # header + 2 faults
    assert "goodput 0.750" in md
    text = r.to_text()
    assert "spot interruption notice" in text and text.rstrip().endswith("final state equals the reference")
