"""SaveSchedule's measure of what an in-memory snapshot costs training: the time it
blocked plus what the steps beside its background part lost, bounded by that part's
own duration; steps that also ran beside a durable save are the save's."""

from __future__ import annotations

import types

import torch

from ftfleet.trainer.callbacks import StepInfo
from ftfleet.trainer.resilience.interval.adaptive import IntervalConfig
from ftfleet.trainer.resilience.interval.schedule import IntervalState, SaveSchedule


class FakeCkpt:
    def __init__(self, background_s: float) -> None:
        self.cfg = types.SimpleNamespace(enabled=False)
        self.on_commit: list = []
        self.app_state = types.SimpleNamespace(extras={})
        self.background_s = background_s
        self.snapshots = types.SimpleNamespace(last_complete=None)

    def snapshot(self, step: int) -> float:
        self.snapshots.last_complete = (step, self.background_s)  # done by the next step
        return 0.05


def _step(step: int, seconds: float, saving: bool = False, snapshotting: bool = False) -> StepInfo:
    return StepInfo(step, torch.tensor(0.0), step, seconds, saving, snapshotting)


def _schedule(background_s: float, events: list, first: int = 4) -> SaveSchedule:
    cfg = IntervalConfig(mtbf_s=600.0, mtbf_source="config", snapshot_fixed_steps=first)
    log = types.SimpleNamespace(emit=lambda event, **f: events.append((event, f)))
    return SaveSchedule(cfg, FakeCkpt(background_s), last_step=100, events=log)


def test_the_steps_beside_a_snapshot_count_their_time_over_the_quiet_median():
    events: list = []
    s = _schedule(0.8, events)
    for i in range(1, 5):  # quiet steps of 1.0 s; the snapshot at step 4
        s.on_step_end(None, _step(i, 1.0))
    s.on_step_end(None, _step(5, 1.3, snapshotting=True))
    s.on_step_end(None, _step(6, 1.0))
    done = [f for e, f in events if e == "snapshotted"]
    assert done == [{"step": 4, "background_s": 0.8, "slowdown_s": 0.3, "counted": True}]
    assert abs(s.interval.snapshot_s - 0.35) < 1e-9  # blocked 0.05 + slowdown 0.3


def test_a_slowdown_is_bounded_by_the_background_part_and_save_steps_are_not_counted():
    events: list = []
    s = _schedule(0.2, events)
    for i in range(1, 5):
        s.on_step_end(None, _step(i, 1.0))
    s.on_step_end(None, _step(5, 3.0, snapshotting=True))  # 2 s slower: something else
    step = 5
    while step < s.next_snapshot:  # quiet steps up to the next snapshot
        step += 1
        s.on_step_end(None, _step(step, 1.0))
    s.on_step_end(None, _step(step + 1, 1.5, saving=True, snapshotting=True))  # the save's
    s.on_step_end(None, _step(step + 2, 1.0))
    done = [f["slowdown_s"] for e, f in events if e == "snapshotted"]
    assert done[0] == 0.2 and set(done[1:]) == {0.0}


def test_the_first_snapshots_interval_is_planned_again_once_it_is_measured():
    events: list = []
    s = _schedule(0.1, events)  # snapshot_fixed_steps=4: the first at step 4
    for i in range(1, 7):
        s.on_step_end(None, _step(i, 1.0, snapshotting=(i == 5)))
    # Measured after step 5 (C = 0.05 + 0 s); at step 6 the next is planned from step 4
    # by Daly's interval for that cost, not at 4 + 4.
    from ftfleet.trainer.resilience.interval.adaptive import daly_interval

    assert s.next_snapshot == 4 + max(1, round(daly_interval(0.05, 600.0) / 1.0))


def test_snapshot_costs_carry_over_a_restart_and_a_first_unmeasured_snapshot_is_no_sample():
    events: list = []
    before = _schedule(0.1, events)
    before.interval.record_snapshot(0.05, 0.1, 0.1)
    before.interval.record_save(0.01, 2.0)
    saved = {k: v.clone() for k, v in IntervalState(before.interval).state_dict().items()}

    # A replacement process: its first snapshot, at step 2, is slow and ends before
    # enough quiet steps were measured (3).
    after = _schedule(4.0, events, first=2)
    IntervalState(after.interval).load_state_dict(saved)
    assert after.interval.snapshots == 1 and abs(after.interval.snapshot_s - 0.15) < 1e-9
    assert after.interval.saves == 1 and after.interval.persist_s == 2.0
    for i in range(1, 4):
        after.on_step_end(None, _step(i, 5.0 if i == 3 else 1.0, snapshotting=(i == 3)))
    after.on_step_end(None, _step(4, 1.0))
    first = [f for e, f in events if e == "snapshotted"][-1]
    assert first["counted"] is False and first["background_s"] == 4.0
    assert after.interval.snapshots == 1 and abs(after.interval.snapshot_s - 0.15) < 1e-9

    fresh = _schedule(4.0, [], first=2)  # nothing carried: the first snapshot is the only measure
    for i in range(1, 5):
        fresh.on_step_end(None, _step(i, 5.0 if i == 3 else 1.0, snapshotting=(i == 3)))
    assert fresh.interval.snapshots == 1 and abs(fresh.interval.snapshot_s - 4.05) < 1e-9


def test_a_runs_first_unmeasured_snapshot_plans_only_until_a_measured_one_replaces_it():
    """A fresh run's first snapshot ends before a quiet step was measured: its whole
    background part counts, as a stand-in. The next snapshot, measured against quiet
    steps, replaces it instead of being averaged with it (carried over a restart too)."""
    events: list = []
    s = _schedule(4.0, events, first=2)
    for i in range(1, 5):  # the snapshot at step 2 ends at step 4, before enough quiet steps
        s.on_step_end(None, _step(i, 5.0 if i == 3 else 1.0, snapshotting=(i == 3)))
    assert s.interval.snapshot_provisional and abs(s.interval.snapshot_s - 4.05) < 1e-9
    _, why = s.interval.snapshot_interval_steps(1.0)
    assert "(snapshot: blocked + slowdown, provisional: no quiet step to compare with)" in why
    saved = {k: v.clone() for k, v in IntervalState(s.interval).state_dict().items()}
    s.ckpt.background_s = 0.1
    step = 5
    while s.interval.snapshot_provisional:
        s.on_step_end(None, _step(step, 1.0, snapshotting=(step == s.next_snapshot + 1)))
        step += 1
        assert step < 200
    assert s.interval.snapshots == 1 and abs(s.interval.snapshot_s - 0.05) < 1e-9  # 0.05 blocked, no slowdown
    # The snapshot that replaced it was planned from the stand-in's cost when it was taken:
    # its interval is planned again once it is measured, not kept.
    from ftfleet.trainer.resilience.interval.adaptive import daly_interval

    taken = [f["step"] for e, f in events if e == "snapshot"][-1]
    for i in range(step, step + 3):
        s.on_step_end(None, _step(i, 1.0))
    assert s.next_snapshot == taken + max(1, round(daly_interval(0.05, 600.0) / 1.0))
    s.interval.record_snapshot(0.25)  # measured samples average as before
    assert s.interval.snapshots == 2 and abs(s.interval.snapshot_s - (0.3 * 0.25 + 0.7 * 0.05)) < 1e-9

    after = _schedule(4.0, [], first=2)  # a replacement process continues with the stand-in
    IntervalState(after.interval).load_state_dict(saved)
    assert after.interval.snapshot_provisional and after.interval.snapshots == 1
    after.interval.record_snapshot(0.1, 0.05, 0.2)
    assert not after.interval.snapshot_provisional and abs(after.interval.snapshot_s - 0.15) < 1e-9
    old = {k: v for k, v in saved.items() if k != "snapshot_provisional"}  # written before the flag
    older = _schedule(4.0, [], first=2)
    IntervalState(older.interval).load_state_dict(old)
    assert not older.interval.snapshot_provisional and abs(older.interval.snapshot_s - 4.05) < 1e-9


def test_a_checkpoint_without_snapshot_costs_keeps_the_live_ones():
    """Checkpoints written before the snapshots' costs were kept have only ``history``."""
    source = _schedule(0.1, []).interval
    source.record_save(0.02, 1.0)
    old = {"history": IntervalState(source).state_dict()["history"]}
    target = _schedule(0.1, []).interval
    target.record_snapshot(0.05, 0.2, 0.3)
    IntervalState(target).load_state_dict(old)
    assert target.saves == 1 and target.persist_s == 1.0
    assert target.snapshots == 1 and abs(target.snapshot_s - 0.25) < 1e-9


class SavingCkpt(FakeCkpt):
    """Durable saves on: each save is recorded; its commit is delivered by the test."""

    def __init__(self) -> None:
        super().__init__(0.1)
        self.cfg = types.SimpleNamespace(enabled=True)
        self.snapshots = None
        self.saves: list[int] = []
        self.newest_on_disk: int | None = None
        self.stats = types.SimpleNamespace(last_blocked_s=0.01, last_commit_s=2.0)

    def save(self, step: int, blocking: bool = False) -> None:
        self.saves.append(step)


def _saving_schedule() -> tuple[SaveSchedule, SavingCkpt]:
    ckpt = SavingCkpt()
    cfg = IntervalConfig(mtbf_s=600.0, mtbf_source="config", fixed_steps=9)
    return SaveSchedule(cfg, ckpt, last_step=1000), ckpt


def test_the_first_save_comes_once_the_step_time_is_measured_and_daly_once_its_cost_is():
    """Not fixed_steps in (500 by default: a 300-step run saved only its last step)."""
    s, ckpt = _saving_schedule()  # fixed_steps=9
    s.restored(None, 0)
    for i in range(1, 7):
        s.on_step_end(None, _step(i, 1.0))
    # Step 1 is the warm-up, steps 2-5 measure the step time; planned again at step 6,
    # the first save is due there.
    assert ckpt.saves == [6] and s.reason.startswith("adaptive: no save measured yet")
    s.on_step_end(None, _step(7, 1.0))
    s._on_commit(types.SimpleNamespace(step=6, total_bytes=0, reused_bytes=0))  # its commit lands after step 7
    s.on_step_end(None, _step(8, 1.0))  # the stopgap would save at 15; now Daly's
    expected, _ = s.interval.interval_steps(1.0)
    assert expected > 9 and s.next_save == 6 + expected and ckpt.saves == [6]


def test_a_first_save_due_sooner_by_fixed_steps_is_the_only_unmeasured_one():
    ckpt = SavingCkpt()
    s = SaveSchedule(IntervalConfig(mtbf_s=600.0, mtbf_source="config", fixed_steps=4), ckpt, last_step=1000)
    s.restored(None, 0)
    for i in range(1, 10):
        s.on_step_end(None, _step(i, 1.0))
    # Its commit has not landed: the stopgap goes on (8), and no save is added at step 6.
    assert ckpt.saves == [4, 8]


def test_after_a_restore_from_memory_the_interval_runs_from_the_newest_durable_step():
    s, ckpt = _saving_schedule()
    s.interval.record_save(0.01, 2.0)  # the history a restore brings back
    ckpt.newest_on_disk = 54
    s.restored(types.SimpleNamespace(step=79, tier="memory"), 79)
    assert s.next_save == 79 + 9  # no step time yet: a stopgap from now, not due at once
    s.on_step_end(None, _step(80, 4.0))  # the warm-up step after the restore: not counted
    for step in range(81, 85):
        s.on_step_end(None, _step(step, 1.0))
        assert s.next_save == 88 and ckpt.saves == []  # too few steps measured yet
    s.on_step_end(None, _step(85, 1.0))  # chosen again with 5 step times
    expected, _ = s.interval.interval_steps(1.0)
    assert s.next_save == 54 + expected and ckpt.saves == [] and s._replan_save is None


class AutoCkpt(SavingCkpt):
    """checkpoint.async_save=auto: each save's ``asynchronous`` is recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg = types.SimpleNamespace(enabled=True, async_save="auto")
        self.modes: list[tuple[int, bool, bool]] = []

    def save(self, step: int, blocking: bool = False, asynchronous: bool | None = None) -> None:
        self.saves.append(step)
        self.modes.append((step, blocking, asynchronous))
        self.stats.last_async = asynchronous


def test_auto_saves_each_way_once_then_the_cheaper_and_a_blocking_save_in_the_foreground():
    events: list = []
    ckpt = AutoCkpt()
    log = types.SimpleNamespace(emit=lambda event, **f: events.append((event, f)))
    s = SaveSchedule(
        IntervalConfig(mtbf_s=600.0, mtbf_source="config", fixed_steps=3), ckpt, last_step=1000, events=log
    )
    s.restored(None, 0)
    costs = {True: (0.02, 3.0), False: (0.5, 0.6)}  # (blocked, commit) s: C async 3.0, sync 0.6
    step = 0
    while len(ckpt.saves) < 4:
        step += 1
        s.on_step_end(None, _step(step, 1.0))  # k not measured: 1, a background save costs its whole persist
        if ckpt.saves and ckpt.saves[-1] == step:
            ckpt.stats.last_blocked_s, ckpt.stats.last_commit_s = costs[ckpt.stats.last_async]
            s._on_commit(types.SimpleNamespace(step=step, total_bytes=0, reused_bytes=0))
    assert [a for _, _, a in ckpt.modes] == [True, False, False, False]
    assert s.interval.costs["async"].saves == 1 and s.interval.costs["sync"].saves == 3
    assert [f["mode"] for e, f in events if e == "save"] == ["async", "sync", "sync", "sync"]
    s.save(step + 1, "emergency", blocking=True)
    assert ckpt.modes[-1] == (step + 1, True, False)
    state = IntervalState(s.interval).state_dict()
    assert set(state) == {"history", "snapshots", "snapshot_provisional", "other"}
    again = SaveSchedule(IntervalConfig(), AutoCkpt(), last_step=10)
    IntervalState(again.interval).load_state_dict(state)
    assert again.interval.costs["sync"].saves == 3 and again.interval.costs["async"].saves == 1


def test_a_configured_mode_is_passed_on_as_before():
    s, ckpt = _saving_schedule()  # SavingCkpt.save takes no `asynchronous`
    s.save(5, "interval")
    assert ckpt.saves == [5] and s.interval.modes == ("async",)


class MemoryCkpt(FakeCkpt):
    """Snapshots and background saves: which steps each was taken at."""

    def __init__(self, async_save: bool | str) -> None:
        super().__init__(0.1)
        self.cfg = types.SimpleNamespace(enabled=True, save_from_memory=True, async_save=async_save)
        self.saves: list[int] = []
        self.snapped: list[int] = []
        self.newest_on_disk: int | None = None
        self.stats = types.SimpleNamespace(last_blocked_s=0.01, last_commit_s=2.0, last_async=async_save is True)

    def snapshot(self, step: int) -> float:
        self.snapped.append(step)
        return super().snapshot(step)

    def save(self, step: int, blocking: bool = False, **_: bool) -> None:
        self.saves.append(step)


def test_a_background_save_from_memory_snapshots_its_step_as_one_of_the_schedules_snapshots():
    cfg = IntervalConfig(mode="fixed", fixed_steps=3, snapshot_fixed_steps=50)
    for async_save, snapshots_at_saves in ((True, True), (False, False)):
        ckpt = MemoryCkpt(async_save)
        s = SaveSchedule(cfg, ckpt, last_step=1000)
        for i in range(1, 8):
            s.on_step_end(None, _step(i, 1.0))
        assert ckpt.saves == [3, 6]
        # A synchronous save writes the live state: no snapshot for it.
        assert ckpt.snapped == ([3, 6] if snapshots_at_saves else [])
