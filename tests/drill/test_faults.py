"""The drill's measures of each fault, on synthetic event logs (trainer/events.py's
contract)."""

from __future__ import annotations

import pytest

from drill.faults import FaultRecord, measure
from tests.drill.events import ev, life, restart_run, t_of

# -- preemption notice ------------------------------------------------------------


def notice_run(exit_code=75, within=True):
    a = life(100, 0.0, last=31)  # step 31 at t=4.0
    a += [
        ev(
            4.05,
            "notice",
            kind="termination",
            source="aws-spot-instance-action",
            received_at=3.9,
            deadline=123.8,
            terminal=True,
            step=31,
        ),
        ev(4.06, "save", step=31, reason="notice", blocking=True),
        ev(
            4.3,
            "committed",
            step=31,
            reason="notice",
            blocked_s=0.2,
            commit_s=0.24,
            deadline=123.8,
            within_deadline=within,
        ),
        ev(4.35, "marker", step=31, reason="termination", path="x", uploaded=False),
        ev(4.4, "exit", code=exit_code, reason="preempted", step=31),
    ]
    b = life(200, 6.0, restored=31, first=32, last=40)
    return a + b


def test_a_notice_is_detected_committed_within_its_deadline_and_loses_no_work():
    r = measure(FaultRecord("notice", 3.8, at_step=30), notice_run())
    assert r.ok, r.reason
    assert r.detect_s == pytest.approx(0.25)
    assert r.lost_steps == 0
    assert r.resume_s == pytest.approx(7.0 - 3.8)


def test_the_emergency_checkpoint_is_the_notices_step_even_if_an_older_save_lands_first():
    events = notice_run()
    events.append(ev(4.1, "committed", step=30, reason="interval", blocked_s=0.1, commit_s=0.5))
    events.sort(key=lambda e: e["t"])
    r = measure(FaultRecord("notice", 3.8, at_step=30), events)
    assert r.ok and "step 31 committed 0.25s after agreement" in r.reason


def test_a_notice_that_does_not_end_in_exit_75_fails():
    r = measure(FaultRecord("notice", 3.8, at_step=30), notice_run(exit_code=1))
    assert not r.ok and "exit 75" in r.reason


def test_an_emergency_checkpoint_after_the_deadline_fails():
    r = measure(FaultRecord("notice", 3.8, at_step=30), notice_run(within=False))
    assert not r.ok and "deadline" in r.reason


def test_a_notice_nobody_acted_on_fails():
    r = measure(FaultRecord("notice", 3.8), life(100, 0.0, last=40))
    assert not r.ok and "no termination notice" in r.reason


# -- rebalance ---------------------------------------------------------------------


def rebalance_run(exit_after=False):
    a = life(100, 0.0, last=60)  # step 40 at t=4.9
    a.append(
        ev(
            4.95,
            "notice",
            kind="rebalance",
            source="aws-rebalance-recommendation",
            received_at=4.9,
            deadline=124.9,
            terminal=False,
            step=40,
        )
    )
    a.append(
        ev(
            5.2,
            "committed",
            step=40,
            reason="rebalance",
            blocked_s=0.1,
            commit_s=0.3,
            deadline=124.9,
            within_deadline=True,
        )
    )
    if exit_after:
        a.append(ev(5.3, "exit", code=75, reason="preempted", step=40))
    return sorted(a, key=lambda e: e["t"])


def test_a_rebalance_recommendation_checkpoints_early_and_training_goes_on():
    r = measure(FaultRecord("rebalance", 4.85, at_step=40), rebalance_run())
    assert r.ok, r.reason
    assert r.detect_s == pytest.approx(0.1)
    assert r.lost_steps == 0
    assert r.resume_s == pytest.approx(5.0 - 4.85)  # step 41 at t=5.0


def test_a_rebalance_recommendation_that_stops_the_run_fails():
    r = measure(FaultRecord("rebalance", 4.85, at_step=40), rebalance_run(exit_after=True))
    assert not r.ok and "not a termination" in r.reason


# -- SIGKILL and hang: torchrun restarts the group ---------------------------------------


def test_a_sigkill_loses_the_steps_since_the_last_checkpoint():
    r = measure(FaultRecord("sigkill", 5.45, at_step=45, t_group_exit=5.45, t_group_down=5.7), restart_run())
    assert r.ok, r.reason
    assert r.detect_s == pytest.approx(0.25)
    assert r.lost_steps == 5
    assert r.resume_s == pytest.approx(8.0 - 5.45)


def test_a_sigkill_without_a_restarted_group_fails():
    r = measure(FaultRecord("sigkill", 5.45, t_group_down=5.7), life(100, 0.0, last=45))
    assert not r.ok and "no restarted group" in r.reason


def test_a_sigkill_torchrun_never_noticed_fails():
    r = measure(FaultRecord("sigkill", 5.45), restart_run())
    assert not r.ok and "tore the group down" in r.reason


def test_a_hang_is_detected_when_the_watchdog_ends_a_worker():
    events = restart_run()
    last_progress = t_of(events, 45)
    r = measure(
        FaultRecord(
            "hang", last_progress, at_step=46, t_group_exit=last_progress + 5.1, t_group_down=last_progress + 5.3
        ),
        events,
    )
    assert r.ok, r.reason
    assert r.detect_s == pytest.approx(5.1)
    assert r.lost_steps == 5


def test_an_undetected_hang_fails():
    r = measure(FaultRecord("hang", 5.4, at_step=46), restart_run())
    assert not r.ok and "not detected" in r.reason


def in_process_run(after_pids=(100, 102)):
    """Rank 0 (pid 100) survives a failure after step 45; the next attempt starts in the
    same process 0.8 s later and restores step 44 from memory."""
    a = life(100, 0.0, last=45)  # step 45 at t=5.4
    a[0]["pids"] = [100, 101]
    b = life(100, 6.2, attempt=1, restored=44, tier="memory", first=45, last=60)
    b[0]["pids"] = list(after_pids)
    return a + b


def test_an_in_process_sigkill_names_the_processes_kept_and_replaced():
    r = measure(FaultRecord("sigkill", 5.45, at_step=45, in_process=True), in_process_run())
    assert r.ok, r.reason
    assert "1 of 2 processes never exited (rank 1: pid 101 -> 102)" in r.reason
    assert "memory" in r.reason
    assert r.detect_s == pytest.approx(6.2 - 5.45)
    assert r.resume_s == pytest.approx(7.2 - 5.45)
    assert r.lost_steps == 1


def test_an_in_process_hang_that_kept_every_process():
    r = measure(FaultRecord("hang", 5.4, at_step=46, in_process=True), in_process_run(after_pids=(100, 101)))
    assert r.ok, r.reason
    assert "2 of 2 processes never exited (every process kept)" in r.reason


def test_an_in_process_failure_with_no_attempt_after_it_fails():
    events = life(100, 0.0, last=45)
    r = measure(FaultRecord("sigkill", 5.45, at_step=45, in_process=True), events)
    assert not r.ok and "no restarted attempt" in r.reason


# -- NaN batch ---------------------------------------------------------------------------


def test_a_skipped_nan_batch_loses_no_work():
    events = life(100, 0.0, last=110)  # step 104 at t=11.3
    events.append(ev(11.35, "anomaly", step=105, action="skip", reason="non-finite loss"))
    events.sort(key=lambda e: e["t"])
    r = measure(FaultRecord("nan", 0.0, at_step=105), events)
    assert r.ok, r.reason
    assert r.lost_steps == 0
    assert r.detect_s == pytest.approx(11.35 - t_of(events, 104))


def test_a_rolled_back_nan_batch_loses_the_steps_since_the_checkpoint():
    events = life(100, 0.0, last=104)
    events += [
        ev(11.35, "anomaly", step=105, action="rollback", reason="non-finite loss"),
        ev(11.6, "rollback", from_step=105, to_step=100),
        ev(11.7, "step", step=101, loss=1.0, seconds=0.1),
    ]
    r = measure(FaultRecord("nan", 0.0, at_step=105), events)
    assert r.ok, r.reason
    assert r.lost_steps == 5
    assert r.resume_s == pytest.approx(11.7 - t_of(events, 104))


def test_a_nan_batch_nobody_noticed_fails():
    r = measure(FaultRecord("nan", 0.0, at_step=105), life(100, 0.0, last=110))
    assert not r.ok and "no anomaly" in r.reason


# -- faults applied while the run is stopped -------------------------------------------


def test_a_corrupted_newest_checkpoint_is_skipped_for_the_previous_one():
    events = life(100, 0.0, last=90) + life(200, 20.0, restored=80, first=81, last=100)
    r = measure(FaultRecord("corrupt", 19.5, at_step=90, newest_step=90, previous_step=80), events)
    assert r.ok, r.reason
    assert r.lost_steps == 10
    assert r.detect_s == pytest.approx(0.5)
    assert r.resume_s == pytest.approx(21.0 - 19.5)


def test_resuming_from_the_corrupted_checkpoint_fails():
    events = life(100, 0.0, last=90) + life(200, 20.0, restored=90, first=91, last=100)
    r = measure(FaultRecord("corrupt", 19.5, newest_step=90, previous_step=80), events)
    assert not r.ok and "not skipped" in r.reason


def test_the_lost_primary_bucket_is_restored_from_the_replica():
    events = life(100, 0.0, last=140) + life(200, 30.0, restored=140, tier="replica", first=141)
    r = measure(FaultRecord("bucket_loss", 29.0, newest_step=140), events)
    assert r.ok, r.reason
    assert r.lost_steps == 0


@pytest.mark.parametrize("restored,tier", [(140, "primary"), (None, "local")])
def test_a_restore_from_anything_but_the_replica_after_losing_the_primary_fails(restored, tier):
    events = life(100, 0.0, last=140) + life(200, 30.0, restored=restored, tier=tier, first=141)
    assert not measure(FaultRecord("bucket_loss", 29.0, newest_step=140), events).ok


def test_a_fault_the_drill_could_not_inject_fails_with_its_reason():
    r = measure(FaultRecord("sigkill", 1.0, error="the run never reached step 60"), [])
    assert not r.ok and r.reason == "the run never reached step 60"


def test_an_unknown_fault_kind_is_refused():
    with pytest.raises(ValueError, match="fault kind"):
        FaultRecord("meteor", 0.0)


# -- GCP: the same measures, GCP's notices and its one dual-region bucket ----------------


def test_a_gcp_live_migration_is_measured_as_an_advisory_maintenance_notice():
    events = [
        {**e, "kind": "maintenance", "source": "gcp-maintenance-event"} if e["event"] == "notice" else e
        for e in rebalance_run()
    ]
    rec = FaultRecord("rebalance", 4.85, at_step=40, notice_kind="maintenance", label="maintenance event")
    r = measure(rec, events)
    assert r.ok, r.reason
    assert r.name == "maintenance event"
    assert not measure(FaultRecord("rebalance", 4.85, at_step=40), events).ok  # no rebalance notice in it


@pytest.mark.parametrize("restored,tier,ok", [(140, "primary", True), (140, "local", False), (None, "local", False)])
def test_after_losing_a_gcp_location_the_run_must_restore_from_the_bucket(restored, tier, ok):
    events = life(100, 0.0, last=140) + life(200, 30.0, restored=restored, tier=tier, first=141)
    rec = FaultRecord("bucket_loss", 29.0, newest_step=140, expected_tier="primary")
    assert measure(rec, events).ok is ok
