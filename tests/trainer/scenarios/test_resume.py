"""Bit-exact resume and resharding, end to end through torchrun.

A run stopped at arbitrary steps (cleanly, or by kill -9) and resumed ends with the
same state_sha256 as an uninterrupted run; a checkpoint written by N ranks continues on
M ranks at exactly the next global sample.
"""

from __future__ import annotations

import pytest

from ftfleet.trainer.events import read_events
from tests.trainer.conftest import (
    LOADER_WORKERS,
    assert_each_sample_once,
    ckpt_hash,
    copy_steps,
    kill9,
    run_trainer,
    sample_trace,
    start_trainer,
    wait_for,
)

pytestmark = pytest.mark.integration

STEPS, BATCH = 24, 6


@pytest.mark.timeout(240)
def test_two_process_run_stopped_twice_ends_bit_identical(session_dir, ref2):
    d = session_dir / "stopped2"
    first = run_trainer(2, d, LOADER_WORKERS, "train.stop_at_step=7")
    assert (first["step"], first["status"], first["resumed_from"]) == (7, "stopped", None)
    assert [c["step"] for c in first["committed"]] == [4, 7]

    second = run_trainer(2, d, LOADER_WORKERS, "train.stop_at_step=13")
    assert second["resumed_from"]["step"] == 7 and second["step"] == 13

    final = run_trainer(2, d, LOADER_WORKERS)
    assert final["resumed_from"]["step"] == 13
    assert final["step"] == STEPS and final["world_size"] == 2
    assert final["state_sha256"] == ref2["state_sha256"]
    assert_each_sample_once(sample_trace(d), STEPS, BATCH)
    # What the checkpoint holds is what the trainer had.
    assert ckpt_hash(d / "checkpoints" / f"step-{STEPS}") == final["state_sha256"]
    # The asynchronous saves after the second resume hold the same state as those of the
    # uninterrupted run: the copy was taken before the next optimizer step on both ranks.
    for step in (16, 20):
        assert ckpt_hash(d / "checkpoints" / f"step-{step}") == ckpt_hash(
            ref2["run_dir"] / "checkpoints" / f"step-{step}"
        ), f"step-{step} differs"


@pytest.mark.timeout(240)
def test_auto_save_mode_saves_both_ways_and_resumes_bit_identical(session_dir, ref2):
    """checkpoint.async_save=auto: interval saves in the background and in the
    foreground, each holding the reference state of its step; the other mode's costs
    ride in the checkpoint, and the resumed run ends bit-identical."""
    d = session_dir / "auto"
    auto = [
        "checkpoint.async_save=auto",
        "checkpoint.keep=100",
        "resilience.interval.mode=adaptive",
        "resilience.interval.fixed_steps=3",
        "resilience.interval.max_steps=3",
    ]
    first = run_trainer(2, d, *auto, "train.stop_at_step=13")
    assert first["step"] == 13
    final = run_trainer(2, d, *auto)
    assert final["resumed_from"]["step"] == 13
    assert final["state_sha256"] == ref2["state_sha256"]
    saves = [e for e in read_events(d) if e["event"] == "save" and e["reason"] == "interval"]
    assert {e["mode"] for e in saves} == {"async", "sync"}, saves
    mine = {p.name for p in (d / "checkpoints").glob("step-*")}
    common = sorted(mine & {p.name for p in (ref2["run_dir"] / "checkpoints").glob("step-*")})
    assert len(common) >= 2, (mine, common)
    for name in common:
        assert ckpt_hash(d / "checkpoints" / name) == ckpt_hash(ref2["run_dir"] / "checkpoints" / name), name


def test_the_uninterrupted_runs_differ_from_their_initial_state(ref1, ref2):
    """Guards the comparisons above: the hashes describe trained, per-run states."""
    assert ref1["state_sha256"] != ref2["state_sha256"]
    assert ref1["step"] == ref2["step"] == STEPS
    assert ref1["loss"] < 4.1 and ref2["loss"] < 4.1  # ln(64) = 4.16 at initialisation


@pytest.mark.timeout(240)
def test_kill_9_during_a_local_save_leaves_nothing_wrong_and_resume_is_bit_exact(session_dir, ref1):
    """A single process saving every 2 steps is killed while a step directory exists
    without its manifest. Every checkpoint a loader accepts afterwards holds exactly the
    reference state of its step, and the resumed run ends bit-identical."""
    d = session_dir / "killed1"
    ckpt = d / "checkpoints"
    proc = start_trainer(1, d, "resilience.interval.fixed_steps=2", "checkpoint.keep=100")

    def mid_save():
        committed = [p for p in ckpt.glob("step-*") if (p / "manifest.json").exists()]
        partial = [p for p in ckpt.glob("step-*") if not (p / "manifest.json").exists() and any(p.glob("*.distcp"))]
        return len(committed) >= 2 and partial

    try:
        wait_for(mid_save, timeout=90, what="a save in progress")
    finally:
        kill9(proc)

    from ftfleet.trainer.checkpoint.manifest import read_manifest, verify_dir

    accepted = []
    for step_dir in sorted(ckpt.glob("step-*")):
        manifest = read_manifest(step_dir)
        if manifest is None or verify_dir(step_dir, manifest):
            continue
        accepted.append(manifest.step)
        reference = ref1["run_dir"] / "checkpoints" / step_dir.name
        assert ckpt_hash(step_dir) == ckpt_hash(reference), f"{step_dir.name} differs"
    assert accepted, "at least one checkpoint was committed before the kill"

    resumed = run_trainer(1, d, "resilience.interval.fixed_steps=2", "checkpoint.keep=100")
    assert resumed["resumed_from"]["step"] == max(accepted)
    assert resumed["state_sha256"] == ref1["state_sha256"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "src, dst, at",
    [
        (2, 1, 8),
        (2, 3, 12),
        pytest.param(1, 2, 10, marks=pytest.mark.chaos),  # one rank to more: the chaos tier
    ],
)
def test_checkpoint_reshards_and_continues_at_the_next_global_sample(session_dir, ref1, ref2, src, dst, at):
    ref = ref2 if src == 2 else ref1
    d = session_dir / f"reshard-{src}to{dst}"
    copy_steps(ref["run_dir"] / "checkpoints", d / "checkpoints", [at])
    out = run_trainer(dst, d, "checkpoint.enabled=false")
    assert out["resumed_from"] == {"step": at, "tier": "local", "world_size": src, "location": str(d / "checkpoints")}
    assert (out["step"], out["world_size"], out["samples_seen"]) == (STEPS, dst, STEPS * BATCH)
    trace = sample_trace(ref["run_dir"], d, max_step={ref["run_dir"]: at})
    assert_each_sample_once(trace, STEPS, BATCH)
    # The new world size really split the batches: dst ranks per step after the resume.
    assert all(len(trace[s]) == dst for s in range(at + 1, STEPS + 1))
    assert out["loss"] < 4.1
