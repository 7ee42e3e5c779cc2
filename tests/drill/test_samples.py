"""The samples behind a run's final state (drill/samples.py), from synthetic traces: an
in-place restart that rolled back, then a new round at another world size."""

from __future__ import annotations

import json

import pytest

from drill.samples import each_sample_once, final_trace


def _run(tmp_path, events, traces):
    run_dir = tmp_path / "run"
    (run_dir / "samples").mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    for name, lines in traces.items():
        (run_dir / "samples" / name).write_text("".join(f"{s} {a} {b}\n" for s, a, b in lines))
    return run_dir


def _steps(first, last, world, batch=4, rank=0):
    per = batch // world
    return [(s, (s - 1) * batch + rank * per, (s - 1) * batch + (rank + 1) * per - 1) for s in range(first, last + 1)]


EVENTS = [
    {"event": "start"},
    {"event": "fresh"},
    {"event": "start"},  # an in-place restart: back to step 3 from 5
    {"event": "restored", "step": 3},
    {"event": "start"},  # a new round of one rank, from step 6
    {"event": "restored", "step": 6},
]


def test_each_attempt_keeps_its_steps_up_to_where_the_next_one_resumed(tmp_path):
    traces = {
        # rank 0 lived through the in-place restart: both attempts in one file
        "rank0-pid1.txt": _steps(1, 5, 2) + _steps(4, 7, 2),
        # rank 1's process died at step 5; a spare took it from step 4
        "rank1-pid2.txt": _steps(1, 5, 2, rank=1),
        "rank1-pid3.txt": _steps(4, 7, 2, rank=1),
        # the new round's single rank
        "rank0-pid4.txt": _steps(7, 9, 1),
    }
    trace = final_trace(_run(tmp_path, EVENTS, traces))
    assert each_sample_once(trace, 9, 4) is None
    assert len(trace[7]) == 1, "step 7 of the rolled-back round counted"


def test_a_sample_seen_twice_or_a_step_missing_is_named(tmp_path):
    traces = {"rank0-pid1.txt": _steps(1, 5, 1) + _steps(4, 7, 1) + _steps(7, 9, 1)}
    trace = final_trace(_run(tmp_path, EVENTS, traces))
    assert each_sample_once(trace, 9, 4) is None  # one process through all three attempts
    twice = {**trace, 5: [*trace[5], (0, 0)]}
    assert each_sample_once(twice, 9, 4) == "step 5 consumed samples [0, 16, 17, 18, 19]"
    missing = {s: v for s, v in trace.items() if s != 8}
    assert each_sample_once(missing, 9, 4) == "no rank trained step 8"
    assert each_sample_once({1: [(0, 3)], 2: [(4, 7)]}, 1, 4) == "extra steps traced: [2]"


def test_steps_no_attempt_resumed_for_are_refused(tmp_path):
    traces = {"rank0-pid1.txt": _steps(1, 5, 1) + _steps(2, 3, 1)}
    with pytest.raises(ValueError, match="steps from 2 follow no attempt that resumed from 1"):
        final_trace(_run(tmp_path, EVENTS, traces))
