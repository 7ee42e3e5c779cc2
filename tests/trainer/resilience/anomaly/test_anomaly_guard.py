"""Anomaly handling in the loop: the verdict stays on the device (no host read on steps
that do not log) and is the detector's, bit for bit; a fused optimizer skips the update
exactly as if it had not been called."""

from __future__ import annotations

import math
import random

import pytest
import torch

from ftfleet.trainer.resilience.anomaly.detector import Action, AnomalyConfig, AnomalyDetector, RepeatedAnomalyError
from ftfleet.trainer.resilience.anomaly.device_check import DeviceCheck
from ftfleet.trainer.resilience.anomaly.guard import AnomalyGuard

CPU = torch.device("cpu")


def values_stream(seed: int, steps: int) -> list[tuple[float, float]]:
    """Losses and norms with NaNs, infinities, spikes and even-sized histories."""
    rng = random.Random(seed)
    out = []
    for i in range(steps):
        loss, norm = 4.0 * math.exp(-i / 200) + rng.random() * 0.1, 1.0 + rng.random()
        kind = rng.random()
        if kind < 0.03:
            loss = math.nan
        elif kind < 0.05:
            norm = math.inf
        elif kind < 0.10:
            loss *= rng.choice([2.0, 6.0, 40.0])
        elif kind < 0.14:
            norm *= rng.choice([2.0, 12.0])
        out.append((loss, norm))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_device_rule_decides_exactly_as_the_detector(seed):
    cfg = AnomalyConfig(
        spike_factor=3.0, grad_norm_spike_factor=5.0, window=8, min_history=4, max_consecutive_skips=10_000
    )
    host, device = AnomalyDetector(cfg), DeviceCheck(cfg, CPU)
    for step, (loss, norm) in enumerate(values_stream(seed, 400), start=1):
        bad = bool(device.update(torch.tensor([loss, norm], dtype=torch.float64)))
        assert bad == (host.check(step, loss, norm).action is not Action.OK), step
    assert host.counters.skipped > 20  # the stream exercised the rule


def fused_pair():
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    return (a, torch.optim.AdamW(a.parameters(), lr=0.1, fused=True)), (
        b,
        torch.optim.AdamW(b.parameters(), lr=0.1, fused=True),
    )


def backward(model, seed):
    torch.manual_seed(seed)
    model(torch.randn(5, 4)).pow(2).sum().backward()


def test_a_device_skip_leaves_weights_and_optimizer_state_as_not_stepping():
    (a, opt_a), (b, opt_b) = fused_pair()
    for model, opt in ((a, opt_a), (b, opt_b)):  # one good step each: the state exists
        backward(model, 1)
        opt.step()
        opt.zero_grad()
    backward(a, 2)
    opt_a.grad_scale, opt_a.found_inf = None, torch.tensor(1.0)
    opt_a.step()  # skipped on the device
    del opt_a.grad_scale, opt_a.found_inf
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(opt_a.state[p][key], opt_b.state[q][key]), key


class HostReadError(AssertionError):
    pass


@pytest.fixture
def no_host_reads(monkeypatch):
    """Any read of a tensor's value on the host (what would wait for a GPU) fails."""

    def refuse(*_args, **_kwargs):
        raise HostReadError("a tensor value was read on the host")

    def forbid():
        for name in ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__"):
            monkeypatch.setattr(torch.Tensor, name, refuse)

    return forbid


def test_judging_and_skipping_on_the_device_never_read_a_value_on_the_host(no_host_reads, monkeypatch):
    (model, opt), _ = fused_pair()
    guard = AnomalyGuard(AnomalyConfig(), ckpt=None, optimizer=opt, device=CPU, settle_every=10)
    assert guard.device_check is not None
    losses = [torch.tensor(2.0), torch.tensor(math.nan), torch.tensor(1.9)]
    no_host_reads()
    for step, loss in enumerate(losses, start=1):
        backward(model, step)
        verdict = guard.judge(step, loss, torch.tensor(1.0))
        guard.apply(verdict)
        opt.zero_grad()
    monkeypatch.undo()
    guard.settle()  # the logging step: one read of everything since the last
    assert guard.detector.counters.skipped == 1 and guard.detector.counters.nonfinite == 1
    assert int(opt.state[next(model.parameters())]["step"]) == 2  # step 2's update was skipped


def test_too_many_skips_stop_the_run_when_the_verdicts_are_read():
    (model, opt), _ = fused_pair()
    guard = AnomalyGuard(AnomalyConfig(max_consecutive_skips=2), ckpt=None, optimizer=opt, device=CPU, settle_every=10)
    for step in range(1, 4):
        guard.judge(step, torch.tensor(math.nan), torch.tensor(1.0))
    with pytest.raises(RepeatedAnomalyError, match="3 anomalous steps in a row, the last at step 3"):
        guard.settle()


@pytest.mark.parametrize("policy, fused", [("rollback", True), ("skip", False)])
def test_a_rollback_policy_or_an_optimizer_without_found_inf_judges_on_the_host(policy, fused):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), fused=fused)
    guard = AnomalyGuard(AnomalyConfig(policy=policy), ckpt=None, optimizer=opt, device=CPU, settle_every=10)
    assert guard.device_check is None
    verdict = guard.judge(1, torch.tensor(math.nan), torch.tensor(1.0))
    assert verdict.found_inf is None and verdict.action is (Action.ROLLBACK if policy == "rollback" else Action.SKIP)
