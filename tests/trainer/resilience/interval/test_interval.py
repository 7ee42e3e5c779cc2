import math

import pytest

from ftfleet.errors import ConfigError
from ftfleet.trainer.resilience.interval.adaptive import (
    PROBE_EVERY,
    AdaptiveInterval,
    IntervalConfig,
    daly_interval,
    young_interval,
)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_young_is_the_square_root_of_twice_cost_times_mtbf():
    assert young_interval(60.0, 3600.0) == pytest.approx(657.267, abs=1e-3)


def test_daly_matches_his_higher_order_formula():
    # sqrt(2*60*3600) * (1 + sqrt(60/7200)/3 + (60/7200)/9) - 60, worked by hand
    assert daly_interval(60.0, 3600.0) == pytest.approx(617.8756, abs=1e-3)
    assert daly_interval(10.0, 3600.0) < young_interval(10.0, 3600.0)


def test_daly_is_the_mtbf_when_a_checkpoint_costs_twice_the_mtbf():
    assert daly_interval(800.0, 400.0) == 400.0


def test_formulas_reject_meaningless_inputs():
    with pytest.raises(ValueError, match="MTBF"):
        daly_interval(1.0, 0.0)
    with pytest.raises(ValueError, match="checkpoint cost"):
        young_interval(-1.0, 10.0)


def test_fixed_mode_uses_the_fixed_steps_and_says_so():
    chooser = AdaptiveInterval(IntervalConfig(mode="fixed", fixed_steps=250))
    chooser.record_save(1.0, 5.0)
    steps, reason = chooser.interval_steps(0.5)
    assert steps == 250 and "fixed" in reason


def test_adaptive_mode_waits_for_a_measured_save():
    steps, reason = AdaptiveInterval(IntervalConfig(fixed_steps=300)).interval_steps(0.5)
    assert steps == 300 and "no save measured yet" in reason


def test_adaptive_mode_uses_daly_with_the_measured_cost_and_configured_mtbf():
    config = IntervalConfig(mtbf_s=3600.0, mtbf_source="config", persist_overhead=0.0)
    chooser = AdaptiveInterval(config)
    chooser.record_save(blocked_s=2.0, persist_s=10.0)
    steps, reason = chooser.interval_steps(step_time_s=0.5)
    assert steps == round(daly_interval(2.0, 3600.0) / 0.5)
    assert "Daly" in reason and "C=2.00s" in reason and "M=3600s" in reason


def test_background_persist_time_counts_as_configured():
    chooser = AdaptiveInterval(IntervalConfig(mtbf_source="config", mtbf_s=3600.0, persist_overhead=0.5))
    chooser.record_save(blocked_s=2.0, persist_s=10.0)
    seconds, _ = chooser.interval_s()
    assert seconds == pytest.approx(daly_interval(7.0, 3600.0))


def _steps(chooser, quiet, busy):
    for seconds in quiet:
        chooser.record_step(seconds, during_save=False)
    for seconds in busy:
        chooser.record_step(seconds, during_save=True)


def test_the_persist_overhead_is_measured_from_steps_with_and_without_a_save():
    chooser = AdaptiveInterval(IntervalConfig(mtbf_source="config", mtbf_s=3600.0))
    chooser.record_save(blocked_s=2.0, persist_s=10.0)
    _steps(chooser, quiet=[1.0, 1.0, 0.9, 1.1, 5.0], busy=[1.5, 1.5, 1.4])
    k, why = chooser.overhead()
    assert k == pytest.approx(0.5)
    assert "measured" in why
    assert chooser.interval_s()[0] == pytest.approx(daly_interval(2.0 + 0.5 * 10.0, 3600.0))


def test_the_overhead_counts_fully_until_measured_and_is_clipped_to_0_1():
    chooser = AdaptiveInterval(IntervalConfig())
    chooser.record_save(blocked_s=1.0, persist_s=4.0)
    _steps(chooser, quiet=[1.0, 1.0], busy=[3.0])
    assert chooser.overhead() == (1.0, "1 (not measured yet)")
    assert chooser.cost()[0] == pytest.approx(5.0)
    _steps(chooser, quiet=[1.0], busy=[3.0])
    assert chooser.overhead()[0] == 1.0  # 3x slower steps: capped at the whole persist time
    fast = AdaptiveInterval(IntervalConfig())
    _steps(fast, quiet=[1.0, 1.0, 1.0], busy=[0.9, 0.9])
    assert fast.overhead()[0] == 0.0


def test_a_save_that_slows_training_lengthens_the_interval():
    gpu, cpu = (AdaptiveInterval(IntervalConfig(mtbf_source="config", mtbf_s=600.0)) for _ in range(2))
    for chooser, busy in ((gpu, 1.01), (cpu, 1.8)):
        chooser.record_save(blocked_s=0.05, persist_s=2.0)
        _steps(chooser, quiet=[1.0] * 5, busy=[busy] * 3)
    assert cpu.interval_steps(1.0)[0] > 2 * gpu.interval_steps(1.0)[0]


def test_a_configured_overhead_overrides_the_measurement():
    chooser = AdaptiveInterval(IntervalConfig(persist_overhead=0.25))
    _steps(chooser, quiet=[1.0] * 3, busy=[2.0] * 3)
    assert chooser.overhead() == (0.25, "0.25 (configured)")


def test_costs_are_an_ewma_of_recent_saves():
    chooser = AdaptiveInterval(IntervalConfig(ewma_alpha=0.5))
    chooser.record_save(4.0, 8.0)
    chooser.record_save(2.0, 4.0)
    assert (chooser.blocked_s, chooser.persist_s) == (3.0, 6.0)


def test_the_interval_is_never_shorter_than_one_save():
    chooser = AdaptiveInterval(IntervalConfig(mtbf_source="config", mtbf_s=60.0, persist_overhead=0.0))
    chooser.record_save(blocked_s=0.01, persist_s=30.0)  # Daly says ~1 s
    steps, reason = chooser.interval_steps(0.1)
    assert steps == 301  # 30.01 s of save at 0.1 s/step, rounded up
    assert "raised to one save's duration" in reason


def test_observed_interruptions_shorten_the_interval():
    clock = Clock()
    chooser = AdaptiveInterval(IntervalConfig(mtbf_s=4 * 3600.0), clock=clock)
    chooser.record_save(1.0, 5.0)
    clock.now = 3600.0
    calm, _ = chooser.interval_s()
    for _ in range(6):
        chooser.record_interruption()
    stormy, reason = chooser.interval_s()
    assert stormy < calm
    m, _ = chooser.mtbf()
    assert m == pytest.approx((3600.0 + 4 * 3600.0) / 7)
    assert "6 interruptions" in reason


def test_a_long_quiet_run_lengthens_the_interval():
    clock = Clock()
    chooser = AdaptiveInterval(IntervalConfig(mtbf_s=3600.0), clock=clock)
    chooser.record_save(1.0, 5.0)
    early, _ = chooser.interval_s()
    clock.now = 48 * 3600.0
    assert chooser.interval_s()[0] > early


def test_max_steps_caps_the_interval_but_not_below_one_save():
    chooser = AdaptiveInterval(IntervalConfig(mtbf_source="config", mtbf_s=36000.0, max_steps=100))
    chooser.record_save(2.0, 8.0)
    assert chooser.interval_steps(1.0)[0] == 100
    assert chooser.interval_steps(0.01)[0] == math.ceil(10.0 / 0.01)


def test_the_run_history_survives_a_restart():
    clock = Clock()
    first = AdaptiveInterval(IntervalConfig(), clock=clock)
    first.record_save(1.0, 4.0)
    first.record_interruption()
    clock.now = 1000.0
    second = AdaptiveInterval(IntervalConfig(), clock=clock)
    second.load_state_dict(first.state_dict())
    clock.now = 1500.0
    assert second.run_time_s() == 1500.0
    assert second.mtbf() == first.mtbf()
    assert second.interval_s() == first.interval_s()


def test_step_time_must_be_measured():
    with pytest.raises(ValueError, match="step_time_s"):
        AdaptiveInterval().interval_steps(0.0)


@pytest.mark.parametrize(
    "field, value, fix",
    [
        ("mode", "auto", "adaptive or fixed"),
        ("mtbf_source", "fleet", "observed or config"),
        ("mtbf_s", 0.0, "positive number of seconds"),
        ("ewma_alpha", 0.0, "0 < alpha <= 1"),
        ("persist_overhead", 2.0, "fraction from 0 to 1"),
        ("fixed_steps", 0, "1 or more"),
        ("memory_share", 1.0, "fraction from 0 to below 1"),
        ("memory_share", -0.1, "fraction from 0 to below 1"),
        ("notice_share", 1.0, "fraction from 0 to below 1"),
    ],
)
def test_bad_interval_settings_name_the_field_and_the_fix(field, value, fix):
    with pytest.raises(ConfigError, match=fix) as exc:
        IntervalConfig(**{field: value})
    assert f"resilience.interval.{field}" in str(exc.value)


def test_snapshots_follow_daly_for_their_own_cost_and_the_same_mtbf():
    cfg = IntervalConfig(mtbf_s=3600.0, mtbf_source="config", snapshot_fixed_steps=7)
    iv = AdaptiveInterval(cfg, clock=Clock())
    assert iv.snapshot_interval_steps(0.5)[0] == 7  # nothing measured yet
    iv.record_snapshot(0.02)
    iv.record_save(1.0, 9.0)  # a durable save 500x dearer: much rarer
    steps, why = iv.snapshot_interval_steps(0.5)
    assert steps == round(daly_interval(0.02, 3600.0) / 0.5) == 24
    assert "snapshot" in why and "M=3600s" in why
    durable, _ = iv.interval_steps(0.5)
    assert durable > 10 * steps


def test_a_snapshots_cost_is_what_it_blocked_plus_what_the_steps_beside_it_lost():
    cfg = IntervalConfig(mtbf_s=3600.0, mtbf_source="config")
    iv = AdaptiveInterval(cfg, clock=Clock())
    # 0.05 s blocked, a 0.8 s background part that cost the step beside it 0.4 s.
    iv.record_snapshot(0.05, slowdown_s=0.4, background_s=0.8)
    steps, why = iv.snapshot_interval_steps(0.5)
    assert steps == round(daly_interval(0.45, 3600.0) / 0.5)
    assert "C=0.4500s (snapshot: blocked + slowdown" in why
    # Never closer than one snapshot end to end: one is in flight at a time.
    cheap = AdaptiveInterval(IntervalConfig(mtbf_s=10.0, mtbf_source="config"), clock=Clock())
    cheap.record_snapshot(0.001, slowdown_s=0.0, background_s=2.0)
    steps, why = cheap.snapshot_interval_steps(0.5)
    assert steps == 5 and "raised to one snapshot's duration 2.00s" in why
    with pytest.raises(ValueError, match="must be >= 0"):
        iv.record_snapshot(0.1, slowdown_s=-1.0)


def test_steps_beside_a_snapshot_are_not_quiet_steps():
    iv = AdaptiveInterval(IntervalConfig(), clock=Clock())
    for _ in range(3):
        iv.record_step(1.0, during_save=False)
    iv.record_step(5.0, during_save=False, during_snapshot=True)
    assert iv.quiet_step_s() == 1.0


def test_snapshots_in_fixed_mode_come_every_snapshot_fixed_steps():
    iv = AdaptiveInterval(IntervalConfig(mode="fixed", snapshot_fixed_steps=3))
    iv.record_snapshot(0.02)
    assert iv.snapshot_interval_steps(0.5)[0] == 3
    with pytest.raises(ConfigError, match="snapshot_fixed_steps=0: use 1 or more"):
        IntervalConfig(snapshot_fixed_steps=0)


def test_the_durable_interval_is_planned_for_the_failures_memory_cannot_recover():
    iv = AdaptiveInterval(IntervalConfig(mtbf_s=600.0, mtbf_source="config", memory_share=0.9), clock=Clock())
    iv.record_save(1.0, 0.0)
    iv.record_snapshot(0.1)
    durable, why = iv.interval_steps(1.0)
    assert durable == round(daly_interval(1.0, 6000.0))  # 10% of the failures: M = 6000 s
    assert "10% of them need the disk: M=6000s" in why
    # The snapshots still cover every failure.
    assert iv.snapshot_interval_steps(1.0)[0] == round(daly_interval(0.1, 600.0))
    plain = AdaptiveInterval(IntervalConfig(mtbf_s=600.0, mtbf_source="config"), clock=Clock())
    plain.record_save(1.0, 0.0)
    assert plain.interval_steps(1.0)[0] == round(daly_interval(1.0, 600.0)) < durable


def test_the_snapshot_interval_is_planned_for_the_failures_without_a_notice():
    iv = AdaptiveInterval(IntervalConfig(mtbf_s=600.0, mtbf_source="config", notice_share=0.5), clock=Clock())
    iv.record_save(1.0, 0.0)
    iv.record_snapshot(0.1)
    steps, why = iv.snapshot_interval_steps(1.0)
    assert steps == round(daly_interval(0.1, 1200.0)) > round(daly_interval(0.1, 600.0))
    assert "50% of them without a notice: M=1200s" in why
    assert iv.interval_steps(1.0)[0] == round(daly_interval(1.0, 600.0))  # the durable one: every failure


@pytest.mark.parametrize("key", ["memory_share", "notice_share"])
def test_a_memory_or_notice_share_needs_the_in_memory_snapshots(tmp_path, key):
    from ftfleet.trainer.config import load_config

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"resilience: {{interval: {{{key}: 0.5}}}}\n")
    with pytest.raises(ConfigError, match=f"{key}=0.5: set checkpoint.memory=true"):
        load_config(str(cfg), [])
    assert getattr(load_config(str(cfg), ["checkpoint.memory=true"]).resilience.interval, key) == 0.5


def _auto(**cfg):
    return AdaptiveInterval(IntervalConfig(mtbf_source="config", mtbf_s=600.0, **cfg), modes=("async", "sync"))


def test_auto_measures_each_mode_then_takes_the_cheaper_and_probes_the_other():
    chooser = _auto(ewma_alpha=1.0)  # each mode's newest save is its cost
    _steps(chooser, quiet=[1.0] * 5, busy=[1.8] * 3)  # k = 0.8: a background save slows steps a lot
    assert chooser.choose_mode() == ("async", "auto: measuring a async save")
    chooser.record_save(0.02, 3.0, "async")  # C = 0.02 + 0.8 x 3.0 = 2.42
    assert chooser.choose_mode()[0] == "sync"  # never measured
    chooser.record_save(0.7, 0.05, "sync")  # C = 0.7 + 1 x 0.05 (its k not measured yet)
    mode, why = chooser.choose_mode()
    assert mode == "sync" and why == "auto: sync C=0.75s < async C=2.42s"
    assert chooser.cost()[0] == pytest.approx(0.75) and "sync save" in chooser.cost()[1]
    assert (chooser.blocked_s, chooser.persist_s) == (0.7, 0.05)  # the chosen mode's
    for _ in range(PROBE_EVERY - 1):  # sync saves; async's sample ages
        chooser.record_save(0.7, 0.05, "sync")
    assert chooser.choose_mode()[0] == "async" and "again" in chooser.choose_mode()[1]
    chooser.record_save(0.02, 0.2, "async")  # the machine got quieter: async is cheaper now
    assert chooser.best_mode() == "async"


def test_a_gpu_like_host_keeps_saving_in_the_background():
    chooser = _auto()
    _steps(chooser, quiet=[1.0] * 5, busy=[1.01] * 3)  # k = 0.01
    chooser.record_save(0.02, 3.0, "async")
    chooser.record_save(0.7, 0.05, "sync")
    assert chooser.choose_mode()[0] == "async"


def test_one_mode_is_never_probed_and_its_costs_keep_the_old_names():
    chooser = AdaptiveInterval(IntervalConfig(), modes=("sync",))
    chooser.record_save(0.7, 0.1)
    assert chooser.choose_mode() == ("sync", "sync (configured)")
    state = chooser.state_dict()
    assert (state["blocked_s"], state["saves"]) == (0.7, 1) and "other_saves" not in state
    with pytest.raises(ValueError, match="modes"):
        AdaptiveInterval(IntervalConfig(), modes=("fast",))


def test_both_modes_costs_carry_over_a_restart():
    source = _auto()
    source.record_save(0.02, 3.0, "async")
    source.record_save(0.7, 0.05, "sync")
    target = _auto()
    target.load_state_dict(source.state_dict())
    assert target.costs["async"].persist_s == 3.0 and target.costs["sync"].blocked_s == 0.7
    assert target.saves == 2 and target.choose_mode()[0] in ("async", "sync")
    old = {k: v for k, v in source.state_dict().items() if not k.startswith("other_")}
    older = _auto()
    older.record_save(0.9, 0.1, "sync")
    older.load_state_dict(old)  # a checkpoint of a run with one mode: the other stays
    assert older.costs["sync"].blocked_s == 0.9 and older.costs["async"].persist_s == 3.0


def test_the_steps_beside_a_blocking_saves_commit_do_not_make_a_background_save_look_free():
    chooser = _auto()
    for seconds in [1.0] * 5:
        chooser.record_step(seconds, during_save=False)
    for seconds in [1.8] * 3:  # beside a background write
        chooser.record_step(seconds, during_save=True, mode="async")
    for seconds in [1.0] * 20:  # beside a blocking save's commit: nothing to slow
        chooser.record_step(seconds, during_save=True, mode="sync")
    assert chooser.overhead("async")[0] == pytest.approx(0.8)
    assert chooser.overhead("sync")[0] == 0.0
