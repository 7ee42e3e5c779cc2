import math

import pytest
import torch

from ftfleet.contract import EXIT_UNRECOVERABLE
from ftfleet.errors import ConfigError
from ftfleet.trainer.resilience.anomaly.detector import Action, AnomalyConfig, AnomalyDetector, RepeatedAnomalyError


def warmed(policy="skip", steps=20, loss=2.0, **kw):
    det = AnomalyDetector(AnomalyConfig(policy=policy, min_history=10, window=20, **kw))
    for step in range(steps):
        assert det.check(step, loss + 0.01 * (step % 3), grad_norm=1.0).ok
    return det


@pytest.mark.parametrize("loss, grad", [(math.nan, 1.0), (math.inf, 1.0), (2.0, math.nan), (2.0, -math.inf)])
def test_a_non_finite_loss_or_gradient_norm_is_skipped(loss, grad):
    det = AnomalyDetector()
    decision = det.check(0, loss, grad)
    assert decision.action is Action.SKIP and "non-finite" in decision.reason
    assert (det.counters.nonfinite, det.counters.skipped) == (1, 1)


def test_tensors_are_accepted_as_loss_and_gradient_norm():
    det = AnomalyDetector()
    assert det.check(0, torch.tensor(1.5), torch.tensor(0.3)).ok
    assert det.check(1, torch.tensor(float("nan")), None).action is Action.SKIP


def test_a_loss_spike_beyond_the_factor_of_the_rolling_median_is_an_anomaly():
    det = warmed(spike_factor=3.0)
    assert det.check(20, 5.9).ok  # below 3x the median of ~2.0
    decision = det.check(21, 30.0)
    assert decision.action is Action.SKIP
    assert "rolling median" in decision.reason and det.counters.spikes == 1


def test_spikes_are_not_judged_before_enough_history():
    det = AnomalyDetector(AnomalyConfig(min_history=10, window=20))
    for step in range(9):
        assert det.check(step, 1.0).ok
    assert det.check(9, 1000.0).ok


def test_a_spike_does_not_raise_its_own_baseline():
    det = warmed(spike_factor=3.0)
    for step in range(20, 30):
        assert det.check(step, 100.0).action is Action.SKIP
    assert det.check(30, 2.0).ok


def test_gradient_norm_spikes_are_judged_only_when_configured():
    assert warmed().check(20, 2.0, grad_norm=1000.0).ok
    decision = warmed(grad_norm_spike_factor=10.0).check(20, 2.0, grad_norm=1000.0)
    assert decision.action is Action.SKIP and "grad_norm" in decision.reason


def test_the_rollback_policy_asks_for_a_rollback_and_counts_it():
    det = warmed(policy="rollback")
    decision = det.check(25, math.nan)
    assert decision.action is Action.ROLLBACK and decision.step == 25
    assert det.counters.rollbacks == 1


def test_repeated_rollbacks_at_the_same_step_stop_the_run_with_a_clear_message():
    det = warmed(policy="rollback", max_rollbacks_per_step=2)
    assert det.check(25, math.inf).action is Action.ROLLBACK
    assert det.check(25, math.inf).action is Action.ROLLBACK
    with pytest.raises(RepeatedAnomalyError, match="step 25 is anomalous again after 2 rollbacks") as exc:
        det.check(25, math.inf)
    assert exc.value.exit_code == EXIT_UNRECOVERABLE == 77


def test_rollbacks_at_different_steps_do_not_add_up():
    det = warmed(policy="rollback", max_rollbacks_per_step=1)
    for step in (30, 40, 50):
        assert det.check(step, math.nan).action is Action.ROLLBACK


def test_endless_skipping_stops_the_run():
    det = AnomalyDetector(AnomalyConfig(max_consecutive_skips=3))
    for step in range(3):
        assert det.check(step, math.nan).action is Action.SKIP
    with pytest.raises(RepeatedAnomalyError, match="4 anomalous steps in a row"):
        det.check(3, math.nan)


def test_a_good_step_resets_the_run_of_skips():
    det = AnomalyDetector(AnomalyConfig(max_consecutive_skips=2))
    for step in range(10):
        det.check(2 * step, math.nan)
        assert det.check(2 * step + 1, 1.0).ok


def test_state_survives_a_restart():
    det = warmed(policy="rollback")
    det.check(25, math.nan)
    fresh = AnomalyDetector(det.config)
    fresh.load_state_dict(det.state_dict())
    assert fresh.counters == det.counters
    assert fresh.check(26, 1000.0).action is Action.ROLLBACK  # the median came along


@pytest.mark.parametrize(
    "field, value, fix",
    [
        ("policy", "retry", "skip or rollback"),
        ("spike_factor", 0.5, "factor above 1"),
        ("window", 2, "at least 3"),
        ("min_history", 500, "1 to resilience.anomaly.window"),
        ("max_rollbacks_per_step", 0, "1 or more"),
    ],
)
def test_bad_anomaly_settings_name_the_field_and_the_fix(field, value, fix):
    with pytest.raises(ConfigError, match=fix) as exc:
        AnomalyConfig(**{field: value})
    assert f"resilience.anomaly.{field}" in str(exc.value)
