"""bench/revisions_ab.py's parts that need no trainer run: what it reads from a run's
events, the shim that points the editable install at a worktree, the order of the runs,
and how a run that fails or runs too long ends (small Python processes stand in for
torchrun and its workers)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "revisions_ab.py"


@pytest.fixture(scope="module")
def ab():
    spec = importlib.util.spec_from_file_location("revisions_ab", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_stats_leave_out_the_first_steps_and_split_steps_by_a_snapshot_in_flight(ab, tmp_path):
    ev = []
    t = 100.0
    for step in range(1, 11):
        busy = step % 3 == 1 and step > 1  # the step after each snapshot of step 3, 6, 9
        t += 2.5 if busy else 2.0
        ev.append({"t": t, "event": "step", "step": step, "seconds": 2.5 if busy else 2.0, "snapshotting": busy})
        if step % 3 == 0:
            ev.append({"t": t, "event": "snapshot", "step": step, "blocked_s": 0.1 * step})
            ev.append({"t": t + 1, "event": "snapshotted", "step": step, "background_s": 0.2})
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in ev) + "\n")
    s = ab.stats(tmp_path)
    # Steps 4..10 counted; the wall runs from the end of step 4 to the end of step 10.
    end_of_4 = next(e["t"] for e in ev if e.get("step") == 4)
    assert s["steps"] == 7 and s["wall_s"] == pytest.approx(ev[-1]["t"] - end_of_4)
    assert (s["quiet_step_s"], s["busy_step_s"], s["busy_steps"]) == (2.0, 2.5, 3)  # steps 4, 7, 10
    assert s["snapshots"] == 2 and s["blocked_s"] == pytest.approx(0.75)  # steps 6 and 9; 3 is left out
    assert s["background_s"] == 0.2


def test_a_run_with_too_few_steps_or_a_restart_is_refused(ab, tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"t": 1.0, "event": "step", "step": 4, "seconds": 1.0}) + "\n")
    with pytest.raises(SystemExit, match="more --steps"):
        ab.stats(tmp_path)
    ev = [{"t": float(s), "event": "step", "step": s, "seconds": 1.0, "attempt": int(s > 6)} for s in range(1, 9)]
    path.write_text("".join(json.dumps(e) + "\n" for e in ev))
    with pytest.raises(SystemExit, match="restart"):
        ab.stats(tmp_path)


def test_the_shim_points_the_editable_finder_at_its_own_tree(ab, tmp_path, monkeypatch):
    finder = types.ModuleType("__editable___ftfleet_0_1_0_finder")
    finder.MAPPING = {"ftfleet": str(ab.REPO / "ftfleet"), "drill": str(ab.REPO / "drill")}
    monkeypatch.setitem(sys.modules, finder.__name__, finder)
    shim = tmp_path / "sitecustomize.py"
    shim.write_text(ab.SHIM.format(repo=str(ab.REPO)))
    exec(compile(shim.read_text(), str(shim), "exec"), {"__file__": str(shim)})
    assert finder.MAPPING == {"ftfleet": str(tmp_path / "ftfleet"), "drill": str(tmp_path / "drill")}


def test_the_pairs_of_repeats_run_abba(ab):
    assert [ab.order(r, ["base", "head"]) for r in range(4)] == [
        ["base", "head"],
        ["head", "base"],
        ["base", "head"],
        ["head", "base"],
    ]


SPAWNS_A_WORKER = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
open(sys.argv[1], "w").write(str(worker.pid))
time.sleep(60)
"""


@pytest.mark.integration
def test_a_run_past_its_timeout_is_stopped_with_its_workers(ab, tmp_path):
    from drill.runner import _stat

    pid_file = tmp_path / "worker.pid"
    argv = [sys.executable, "-c", SPAWNS_A_WORKER, str(pid_file)]
    with pytest.raises(SystemExit, match="ran past 10 s"):
        ab.run_to_end(argv, tmp_path, dict(os.environ), tmp_path / "run.log", timeout=10)
    assert pid_file.exists(), "the stand-in never started its worker: raise the timeout"
    worker = int(pid_file.read_text())
    stat = _stat(worker)  # gone, or a zombie until init reaps it
    assert stat is None or stat[0] in ("Z", "X"), stat


@pytest.mark.integration
def test_a_failed_run_stops_the_bench_with_its_log(ab, tmp_path):
    argv = [sys.executable, "-c", "import sys; print('bad override'); sys.exit(2)"]
    with pytest.raises(SystemExit, match="exited 2(.|\n)*bad override"):
        ab.run_to_end(argv, tmp_path, dict(os.environ), tmp_path / "run.log", timeout=30)


@pytest.mark.integration
def test_each_revision_runs_with_the_environment_its_own_bench_gives(ab, tmp_path, monkeypatch):
    own = tmp_path / "own"
    (own / "bench").mkdir(parents=True)
    (own / "bench" / "goodput_bench.py").write_text(
        "import os\n"
        "def env(extra=None):\n"
        "    return {'MARK': 'own', 'SEEN_TUNABLES': os.environ.get('GLIBC_TUNABLES', '-'), **(extra or {})}\n"
    )
    # The bench's own process may carry tunables; the revision decides its own.
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    got = ab.tree_env(own)
    assert got == {"MARK": "own", "SEEN_TUNABLES": "-", "PYTHONPATH": str(own)}
    # A revision whose bench has no env(): this bench's, pointed at the worktree.
    old = tmp_path / "old"
    (old / "bench").mkdir(parents=True)
    (old / "bench" / "goodput_bench.py").write_text("")
    fallback = ab.tree_env(old)
    assert fallback["PYTHONPATH"] == str(old) and fallback["OMP_NUM_THREADS"] == "1" and "MARK" not in fallback
