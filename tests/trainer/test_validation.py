"""Validation: an evaluation leaves the run as it was, measures the mean over the same
samples every time, refuses bad input in one line, and asks for a milestone's save."""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
import torch

from ftfleet.errors import ConfigError
from ftfleet.trainer.callbacks import StepInfo
from ftfleet.trainer.config import load_config
from ftfleet.trainer.losses import next_token_loss
from ftfleet.trainer.model import GPT
from ftfleet.trainer.resilience.interval.adaptive import IntervalConfig
from ftfleet.trainer.resilience.interval.schedule import SaveSchedule
from ftfleet.trainer.validation import EXTRA, Best, Validation
from tests.trainer.conftest import BASE, CONFIG


class Recorder:
    def __init__(self) -> None:
        self.notes: list = []
        self.requests: list = []
        self.events: list = []
        self.app_state = types.SimpleNamespace(extras={})

    def annotate(self, step, notes) -> None:
        self.notes.append((step, notes))

    def request(self, step, reason) -> None:
        self.requests.append((step, reason))

    def emit(self, event, **fields) -> None:
        self.events.append((event, fields))


def make_run(*overrides: str, world_size: int = 1):
    cfg = load_config(CONFIG, [*BASE, "validation.every=2", "validation.batches=2", *overrides], environ={})
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model.factories["factory"].args)
    env = types.SimpleNamespace(world_size=world_size, rank=0, device=torch.device("cpu"), is_rank0=True)
    rec = Recorder()
    run = types.SimpleNamespace(cfg=cfg, env=env, model=model, ckpt=rec)
    return run, rec


def validation(run, rec) -> Validation:
    return Validation(run, rec, events=rec)


def rng_states():
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def info(step: int) -> StepInfo:
    return StepInfo(step, torch.tensor(0.0), step * 6, 0.1)


def test_an_evaluation_is_the_mean_over_the_held_out_samples_and_leaves_the_rngs_and_mode_as_they_were():
    run, rec = make_run()
    v = validation(run, rec)
    assert run.ckpt.app_state.extras[EXTRA] is v.best
    before = rng_states()
    values = v.evaluate(run, 2)
    after = rng_states()
    assert torch.equal(before[0], after[0]) and np.array_equal(before[1], after[1]) and before[2] == after[2]
    assert run.model.training
    # By hand: the held-out stream's first two batches of 6, dropout off.
    held_out = run.cfg.validation.factories["factory"](job=run.cfg)
    train_set = run.cfg.data.factories["factory"](job=run.cfg)
    assert not np.array_equal(held_out[0], train_set[0])
    run.model.eval()
    with torch.no_grad():
        losses = [
            next_token_loss(run.model, torch.from_numpy(np.stack([held_out[i] for i in range(b * 6, b * 6 + 6)])))
            for b in range(2)
        ]
    run.model.train()
    assert values == {"loss": pytest.approx(float(sum(losses)) / 2, rel=1e-6)}
    assert v.evaluate(run, 4) == values  # the same samples and weights: the same value


def test_a_strictly_better_evaluation_is_a_milestone_and_asks_for_its_save():
    run, rec = make_run(
        "validation.metrics=tests.trainer.userpkg:token_accuracy", "validation.metric=accuracy", "validation.mode=max"
    )
    v = validation(run, rec)
    v.on_step_end(run, info(1))  # not an evaluation step
    assert rec.notes == [] and rec.requests == []
    v.on_step_end(run, info(2))
    ((step, notes),) = rec.notes
    assert (
        step == 2 and set(notes.validation) == {"loss", "accuracy", "count"} and notes.validation["count"] == 6
    )  # a mean of per-batch values
    assert notes.milestone.metric == "accuracy" and notes.milestone.mode == "max" and notes.milestone.keep == "best"
    assert rec.requests == [(2, "milestone")]
    v.on_step_end(run, info(4))  # the same weights: not strictly better
    assert rec.notes[-1][1].milestone is None and rec.requests == [(2, "milestone")]
    assert [f["best"] for e, f in rec.events if e == "validation"] == [True, False]
    assert v.summary()["milestone"] == {"step": 2, "metric": "accuracy", "value": notes.milestone.value}
    # The best so far is part of the checkpoint.
    again = Best()
    again.load_state_dict(v.best.state_dict())
    assert (again.value, again.step) == (v.best.value, 2)
    empty = Best()
    empty.load_state_dict(Best().state_dict())
    assert (empty.value, empty.step) == (None, None)


def test_milestones_none_evaluates_and_logs_only():
    run, rec = make_run("validation.milestones=none")
    v = validation(run, rec)
    v.on_step_end(run, info(2))
    assert rec.notes[0][1].milestone is None and rec.requests == [] and v.best.step == 2


@pytest.mark.parametrize(
    ("overrides", "world", "message"),
    [
        (
            ["validation.metric=accuracy"],
            1,
            "validation.metric='accuracy' is not among what validation.metrics returns (loss)",
        ),
        (["validation.metrics=tests.trainer.userpkg:not_metrics"], 1, "validation.metrics returned int"),
        (["validation.metrics=tests.trainer.userpkg:list_metrics"], 1, "validation.metrics returned list for a batch"),
        (["validation.batches=0"], 1, "validation.batches=0 reads the whole set"),
        (["validation.batch_size=5"], 2, "validation.batch_size=5 is not divisible by the world size 2"),
    ],
)
def test_bad_validation_input_is_one_line_naming_the_key(overrides, world, message):
    run, rec = make_run(*overrides, world_size=world)
    with pytest.raises(ConfigError) as exc:
        validation(run, rec).on_step_end(run, info(2))
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("validation.mode=lower", "validation.mode='lower': use min"),
        ("validation.milestones=forever", "validation.milestones='forever': use best, all or none"),
        ("validation.every=-1", "validation.every=-1: use 0 or more"),
        ("validation.evry=3", "did you mean validation.every?"),
        ("validation.factory=synthetik", "did you mean synthetic?"),
        ("validation.metrics=tests.trainer.userpkg:takes_nothing", "the trainer calls it as (cfg"),
    ],
)
def test_a_bad_validation_section_is_refused_when_the_config_loads(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("?", r"\?")):
        load_config(CONFIG, [*BASE, override], environ={})


def test_validation_is_not_part_of_the_config_hash():
    plain = load_config(CONFIG, BASE, environ={})
    assert load_config(CONFIG, [*BASE, "validation.every=5", "validation.metric=acc"], environ={}).config_hash() == (
        plain.config_hash()
    )


def test_a_requested_save_comes_at_its_step_beside_the_interval_and_never_at_the_last_step():
    saved: list = []
    ckpt = types.SimpleNamespace(
        cfg=types.SimpleNamespace(enabled=True, async_save=True, save_from_memory=False),
        on_commit=[],
        app_state=types.SimpleNamespace(extras={}),
        snapshots=None,
        save=lambda step, blocking=False: saved.append(step),
    )
    events: list = []
    log = types.SimpleNamespace(emit=lambda event, **f: events.append((event, f)))
    s = SaveSchedule(IntervalConfig(mode="fixed", fixed_steps=100), ckpt, last_step=10, events=log)
    s.request(1, "milestone")
    s.on_step_end(None, info(2))  # asked at another step: dropped
    s.request(3, "milestone")
    s.on_step_end(None, info(3))
    s.request(4, "milestone")
    s.on_step_end(None, info(5))
    s.request(10, "milestone")
    s.on_step_end(None, info(10))  # the final save takes the last step
    assert saved == [3]
    assert [f["reason"] for e, f in events if e == "save"] == ["milestone"]


def test_a_run_with_validation_stopped_and_resumed_ends_where_the_reference_ends_and_keeps_its_milestone(
    tmp_path, ref2, capsys
):
    """Two ranks, evaluated every 6 steps with mode=max on the loss (the loss falls, so the
    first evaluation stays the best): the resumed run must take the best from the
    checkpoint, or its first evaluation would count as the best again."""
    import json

    from ftfleet import retention
    from ftfleet.cli import main
    from tests.trainer.conftest import run_trainer

    run_dir = tmp_path / "run"
    flags = ["validation.every=6", "validation.mode=max", "checkpoint.keep=2"]
    first = run_trainer(2, run_dir, *flags, "train.stop_at_step=14")
    assert first["step"] == 14 and first["milestone"]["step"] == 6
    done = run_trainer(2, run_dir, *flags)
    assert done["state_sha256"] == ref2["state_sha256"]  # evaluations change nothing
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    evaluations = [e for e in events if e["event"] == "validation"]
    assert [e["step"] for e in evaluations] == [6, 12, 18, 24]
    losses = [e["metrics"]["loss"] for e in evaluations]
    assert losses == sorted(losses, reverse=True)  # falls: every later one is worse by mode=max
    assert [e["best"] for e in evaluations] == [True, False, False, False]
    assert done["milestone"] == {"step": 6, "metric": "loss", "value": losses[0]}
    assert done["validation"] == {"step": 24, "metrics": {"loss": losses[3]}}
    # The fast tier keeps its newest two and the milestone; the list names it.
    ckpts = run_dir / "checkpoints"
    assert sorted(int(p.name.split("-")[1]) for p in ckpts.glob("step-*")) == [6, 20, 24]
    assert main(["ckpt", "list", str(ckpts), "--json"]) == 0
    rows = {r["step"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[6]["kept_by"] == f"milestone (loss {losses[0]:.6g})" and rows[6]["validation"] == {"loss": losses[0]}
    assert rows[24]["retention"] == {"rules": list(retention.DEFAULT_SCHEDULE), "pinned": []}  # every manifest


def test_an_iterable_set_is_read_from_its_start_at_every_evaluation_and_running_out_is_one_line():
    run, rec = make_run("validation.factory=tests.trainer.userpkg:short_stream")
    v = validation(run, rec)
    first = v.evaluate(run, 2)
    assert v.evaluate(run, 4) == first  # from the start again: the same samples
    mapped, _ = make_run()
    assert first == pytest.approx(validation(mapped, Recorder()).evaluate(mapped, 2), rel=1e-6)  # the same 12 samples
    # 15 samples: two batches of 6 and a short one of 3, each sample weighing the same.
    run, rec = make_run("validation.factory=tests.trainer.userpkg:short_stream", "validation.batches=3")
    three = validation(run, rec).evaluate(run, 2)
    held_out = mapped.cfg.validation.factories["factory"](job=mapped.cfg)  # the stream's samples, by index
    run.model.eval()
    with torch.no_grad():
        losses = [next_token_loss(run.model, torch.from_numpy(np.stack([held_out[i]]))) for i in range(15)]
    run.model.train()
    assert three["loss"] == pytest.approx(float(sum(losses)) / 15, rel=1e-5)
    run, rec = make_run("validation.factory=tests.trainer.userpkg:short_stream", "validation.batches=4")
    with pytest.raises(ConfigError) as exc:
        validation(run, rec).evaluate(run, 2)
    assert "ran out after 3 of validation.batches=4" in str(exc.value) and "\n" not in str(exc.value)


def test_building_the_validation_leaves_the_rngs_as_they_were_whatever_its_factories_draw():
    run, rec = make_run("validation.factory=tests.trainer.userpkg:drawing_set")
    before = rng_states()
    validation(run, rec)
    after = rng_states()
    assert torch.equal(before[0], after[0]) and np.array_equal(before[1], after[1]) and before[2] == after[2]
