"""The goodput benchmark's arithmetic, on a synthetic event log (the benchmark itself
runs in `make chaos`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from ftfleet.trainer.resilience.interval.adaptive import daly_goodput

BENCH = Path(__file__).resolve().parents[2] / "bench" / "goodput_bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("goodput_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["goodput_bench"] = module
    spec.loader.exec_module(module)
    return module


def life(pid, t0, steps, *, restored=None, step_s=1.0, start_s=0.5, restore_s=0.8, costs=()):
    """One rank-0 process: start, restore (or fresh), then one step every step_s."""
    ev = [{"t": t0, "event": "start", "pid": pid, "attempt": 0}]
    t = t0 + restore_s
    if restored is None:
        ev.append({"t": t, "event": "fresh", "pid": pid})
    else:
        ev.append({"t": t, "event": "restored", "pid": pid, "step": restored})
    for c in costs:
        ev.append({"t": t, "event": "interval", "pid": pid, "steps": 5, "why": "", "cost_s": c})
    for i, step in enumerate(steps):
        t += step_s
        if i == 0:
            ev.append({"t": t, "event": "first_step", "pid": pid, "step": step})
        ev.append({"t": t, "event": "step", "pid": pid, "step": step, "seconds": step_s})
    return ev


def test_restart_cost_lost_work_and_goodput(bench):
    # Life 1 trains steps 1-10 (t = 101..110); SIGKILL at t = 110.5, the group is down
    # at 111; life 2 starts at 114 (3 s of process start), restores step 8 in 0.8 s and
    # runs steps 9-20.
    events = life(1, 100.0, range(1, 11), restore_s=0.0, costs=[None, 0.4]) + life(
        2, 114.0, range(9, 21), restored=8, costs=[0.5, 0.6]
    )
    run = SimpleNamespace(
        failures=[bench.Failure("sigkill", 110.5, t_end=111.0)], overrides=["resilience.interval.mode=adaptive"]
    )
    r = bench.measure("ftfleet", run, events, ref_step_s=1.0, steps=20)
    (f,) = r["failures"]
    assert f["lost_steps"] == 2  # reached 10, resumed from 8
    # Down at 111, first step after the restore began at 114 + 0.8 = 114.8 (its own
    # second of compute is useful work, not restart).
    assert f["restart_s"] == pytest.approx(3.8)
    assert f["process_start_s"] == pytest.approx(3.0)
    assert f["restore_s"] == pytest.approx(0.8)
    wall = (114.8 + 12) - 101.0
    assert r["wall_s"] == pytest.approx(round(wall, 1))
    assert r["goodput"] == pytest.approx(round(19 / wall, 4))  # the 19 steps after the first
    assert r["adaptive_cost_s"] == pytest.approx(0.5)
    # The wall time, taken apart: 19 steps that advanced (2-10, 11-20), 2 computed again
    # (9, 10), the restart from the last step at 110 to 114.8; nothing else.
    o = r["overhead_s"]
    assert o == {
        "useful": 19.0,
        "redo": 2.0,
        "save": 0.0,
        "snapshot": 0.0,
        "noise": 0.0,
        "spare": 0.0,
        "between": 0.0,
        "restart": 4.8,
    }
    assert sum(o.values()) == pytest.approx(wall)


def test_steps_beside_a_spare_nodes_start_are_counted_apart_from_the_noise(bench):
    slow = (2, 4, 5, 8)  # 1.5 s each instead of 1.0
    events = life(1, 100.0, range(1, 11), restore_s=0.0)
    shift = 0.0
    for e in events:
        if e["event"] in ("step", "first_step"):
            if e["event"] == "step" and e["step"] in slow:
                shift += 0.5
                e.update(seconds=1.5, snapshotting=e["step"] == 5)  # step 5's extra stays the snapshot's
            e["t"] += shift if e["event"] == "step" else 0.0
    # Steps 2 (101.0-102.5), 4 (103.5-105.0) and 5 (105.0-106.5) ran beside a spare node
    # started at 101.0 and ready at 105.5; step 8 (108.5-110.0) beside one started at
    # 109.0 and still starting when the run ended (its window closes at the last step,
    # 112.0). Step 2 is one of the life's first two, the new process's own warm-up:
    # noise. Spare: steps 4 and 8.
    run = SimpleNamespace(failures=[], overrides=[], spare_boots={"n-2": [101.0, 105.5], "n-3": [109.0, None]})
    r = bench.measure("inprocess", run, events, ref_step_s=1.0, steps=10)
    o = r["overhead_s"]
    assert (o["spare"], o["snapshot"], o["noise"]) == (pytest.approx(1.0), pytest.approx(0.5), pytest.approx(0.5))
    assert sum(o.values()) == pytest.approx(r["wall_s"])
    assert r["spare_boots_s"] == [4.5, 3.0]  # the second closed at the last step, 112.0


def test_useful_step_time_is_the_median_step_without_a_save_in_flight(bench):
    events = life(1, 100.0, range(1, 11), restore_s=0.0)
    for e in events:
        if e["event"] == "step" and e["step"] % 3 == 0:  # slowed by a background save
            e.update(seconds=2.5, saving=True)
    run = SimpleNamespace(failures=[], overrides=[])
    r = bench.measure("async", run, events, ref_step_s=0.5, steps=10)
    assert r["useful_step_s"] == pytest.approx(1.0)
    assert r["goodput"] == pytest.approx(round(9 * 1.0 / r["wall_s"], 4), abs=1e-3)
    assert r["goodput_vs_reference"] == pytest.approx(round(9 * 0.5 / r["wall_s"], 4), abs=1e-3)
    # Steps 3, 6, 9 each took 1.5 s more than the useful second, with a save in flight.
    assert r["overhead_s"]["save"] == pytest.approx(4.5) and r["overhead_s"]["noise"] == 0.0
    assert sum(r["overhead_s"].values()) == pytest.approx(r["wall_s"])


def test_an_uninterrupted_run_at_its_useful_speed_has_goodput_one(bench):
    run = SimpleNamespace(failures=[], overrides=[])
    r = bench.measure("sync", run, life(1, 100.0, range(1, 31), restore_s=0.0), ref_step_s=1.0, steps=30)
    assert r["goodput"] == pytest.approx(1.0) and r["goodput_vs_reference"] == pytest.approx(1.0)


def test_markdown_and_plot(bench, tmp_path):
    T, C, R = 120.0, 1.6, 8.0
    model = {
        "mtbf_s": T,
        "cost_s": C,
        "restart_s": R,
        "daly_interval_s": 20.0,
        "daly_goodput": daly_goodput(20.0, C, R, T),
        "young_interval_s": 19.6,
        "young_goodput": daly_goodput(19.6, C, R, T),
        "restart_free_goodput": 0.9,
        "restart_phases": {"process_start_s": 5.0, "restore_s": 1.2},
        "adaptive_cost_s": 0.4,
        "adaptive_daly_goodput": 0.85,
        "curve": [{"interval_s": x, "goodput": daly_goodput(x, C, R, T)} for x in (1.0, 5.0, 20.0, 80.0, 400.0)],
    }
    results = [
        {
            "name": "sync",
            "interval_steps": 10,
            "interval_s": 20.0,
            "saves": 5,
            "save_blocked_s": 1.6,
            "failures": [{"kind": "notice"}, {"kind": "sigkill"}],
            "lost_steps": 7,
            "restart_s": 8.0,
            "wall_s": 500.0,
            "goodput": 0.8,
            "useful_step_s": 1.6,
            "goodput_vs_reference": 0.82,
        }
    ]
    setup = {
        "mtbf_s": T,
        "notice_lead_s": 20.0,
        "d_model": 960,
        "state_mb": 455.0,
        "sync_save_s": C,
        "steps": 300,
        "ref_step_s": 1.6,
        "ref_step_s_before": 1.5,
        "ref_step_s_after": 1.7,
        "nproc": 2,
    }
    md = bench.markdown(setup, model, results)
    assert "| sync | 10 steps (20.0 s) |" in md and "process_start_s" in md
    assert "C = 0.40 s" in md
    json.dumps(model)  # what goodput.json holds
    pytest.importorskip("matplotlib")  # the bench extra; `make chaos` installs it
    out = tmp_path / "goodput.png"
    assert bench.plot(out, model, results) == f"wrote {out}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_two_level_model_from_a_runs_measured_costs(bench):
    """An inprocess row of a full goodput run, whose model was worked out by hand:
    0.882."""
    r = {
        "snapshots": 33,
        "snapshot_blocked_s": 0.137,
        "snapshot_slowdown_s": 0.183,
        "saves": 8,
        "save_blocked_s": 0.908,
        "interval_s": 45.82,
        "emergency_blocked_s": 1.0321,
        "overhead_s": {"save": 8.9},
        "useful_step_s": 2.2294,
        "failures": [
            {"kind": "notice", "restart_s": 2.03},
            {"kind": "sigkill", "restart_s": 0.97},
            {"kind": "notice", "restart_s": 1.99},
            {"kind": "sigkill", "restart_s": 1.22},
        ],
    }
    m = bench.two_level_model(r, 120.0, 0.5)
    assert m["snapshot_interval_s"] == pytest.approx(12.39, abs=0.01)  # sqrt(2 x 0.32 x 120 / 0.5)
    assert (m["snapshots"], m["durable"], m["failures"]) == pytest.approx((0.0516, 0.0441, 0.0219), abs=1e-4)
    assert m["goodput"] == pytest.approx(0.8824, abs=1e-4)
    # Cheaper snapshots, fewer notices: less waste.
    assert bench.two_level_model({**r, "snapshot_slowdown_s": 0.0}, 120.0, 0.5)["goodput"] > m["goodput"]
    assert bench.two_level_model({**r, "snapshots": 0}, 120.0, 0.5) is None  # no in-memory tier
    assert bench.two_level_model({**r, "snapshot_slowdown_s": None}, 120.0, 0.5) is None  # none completed
    assert bench.two_level_model({**r, "failures": r["failures"][:1]}, 120.0, 0.5) is None  # no SIGKILL measured


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="lowering a niceness needs root (CAP_SYS_NICE)")
def test_a_spare_node_taking_over_gets_its_priority_back_in_every_thread(bench):
    code = "import subprocess, threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); "
    code += "subprocess.run(['sleep', '30'])"
    proc = subprocess.Popen(["nice", "-n", str(bench.SPARE_NICE), sys.executable, "-c", code])
    try:
        tids = []
        for _ in range(100):  # the child and the thread start
            kids = bench._children(proc.pid)
            tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
            if kids and len(tids) >= 2:
                break
            time.sleep(0.05)
        everyone = tids + kids
        assert all(os.getpriority(os.PRIO_PROCESS, t) == bench.SPARE_NICE for t in everyone)
        bench.unnice(proc.pid)
        assert all(os.getpriority(os.PRIO_PROCESS, t) == 0 for t in everyone)
    finally:
        for p in bench._children(proc.pid):
            os.kill(p, 9)
        proc.kill()
        proc.wait()


def test_a_gone_nodes_snapshot_files_become_the_next_spares_reserve(bench, tmp_path):
    from ftfleet.contract import RESERVE_DIR
    from ftfleet.trainer.checkpoint.memory import reserve_files

    old, new = tmp_path / "old", tmp_path / "new"
    tier = old / "ftfleet-goodput"
    sizes = {
        "node-0/rank-0/step-4/snapshot-0.bin": 3 << 20,
        "node-0/rank-1/step-4/snapshot-1.bin": 3 << 20,
        "node-0/rank-0/.free-next/snapshot-0.bin": 3 << 20,
        "node-0/peer/rank-1/step-4/snapshot-1.bin": 3 << 20,
        "reserve/local0-2": 4 << 20,
        "reserve/.local1-2": 4 << 20,  # being reserved when the node went: not whole
        "node-0/rank-0/step-4/manifest.json": 100,
    }
    inodes = {}
    for rel, n in sizes.items():
        p = tier / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * n)
        inodes[p.stat().st_ino] = n
    size = (3 << 20) + 4096  # the bench's estimate: a little over the snapshots' size
    assert bench.recycle_memory(old, new, nproc=2, size=size) == 5
    reserve = new / "ftfleet-goodput" / RESERVE_DIR
    names = sorted(p.name for p in reserve.iterdir())
    assert names == ["local0-0", "local0-1", "local0-2", "local1-0", "local1-1"]
    for p in reserve.iterdir():
        assert p.stat().st_ino in inodes
        assert p.stat().st_size >= size * 5 // 4
        assert p.stat().st_blocks * 512 <= inodes[p.stat().st_ino] + (1 << 20)  # grown by a hole
    assert (tier / "node-0/rank-0/step-4/manifest.json").exists()  # not a snapshot: left
    assert (tier / "reserve/.local1-2").exists()
    # The spare, whose own estimate came out larger still, finds them reserved and
    # allocates nothing new for them (the same inodes).
    assert reserve_files(new / "ftfleet-goodput", size + (256 << 10), 3, 0) == 3
    assert reserve_files(new / "ftfleet-goodput", size + (256 << 10), 2, 1) == 2
    assert {p.stat().st_ino for p in reserve.iterdir()} <= set(inodes)


class FakeNode:
    """A node of the bench (drill.runner.Node's surface), nothing run: its log says it
    is warm at once; ``exit_next`` makes the next one exit while it boots."""

    started: list[FakeNode] = []

    def __init__(self, name, command, env, cwd, log_path):
        self.name, self.command, self.env, self.log_path = name, command, env, log_path
        self.exit_code = 1 if FakeNode.exit_next else None
        FakeNode.exit_next = False
        self.killed = False
        self.pid = 100000 + len(FakeNode.started)  # never signalled: unnice and cpu_seconds are stand-ins too

    exit_next = False

    def start(self):
        FakeNode.started.append(self)
        return self

    def poll(self):
        return self.exit_code

    def kill(self):
        self.killed = True

    def log_tail(self, chars=3000):
        return "warm: waiting for the gate"


@pytest.fixture
def fake_nodes(bench, monkeypatch):
    FakeNode.started, FakeNode.exit_next = [], False
    monkeypatch.setattr(bench, "Node", FakeNode)
    monkeypatch.setattr(bench, "CAN_UNNICE", False)
    monkeypatch.setattr(bench, "BOOT_POLL_S", 0.01)
    monkeypatch.setattr(bench, "cpu_seconds", lambda pid: 1.0)  # idle
    unniced = []
    monkeypatch.setattr(bench, "unnice", unniced.append)
    return unniced


def faulted_run(bench, tmp_path, spares=1):
    args = SimpleNamespace(nproc=2, shm_root=str(tmp_path / "shm"))
    (tmp_path / "work").mkdir(exist_ok=True)
    return bench.FaultedRun(
        "inprocess",
        [],
        watch_notices=True,
        args=args,
        work=tmp_path / "work",
        metadata=SimpleNamespace(url="http://127.0.0.1:1"),
        spares=spares,
    )


def test_a_spare_node_boots_before_the_job_and_inherits_the_gone_nodes_ram(bench, tmp_path, fake_nodes):
    run = faulted_run(bench, tmp_path)
    first = run.launch()
    spare = run.standby
    assert FakeNode.started == [spare, first]  # the spare first, booted, then the node that trains
    assert "--wait-for" in spare.command and "--wait-for" not in first.command
    assert run.spare_boots[spare.name] == [None, None]  # its window opens at the first commit
    gate = Path(spare.command[spare.command.index("--wait-for") + 1])
    assert not gate.exists()
    # The node that trains has snapshot files in its RAM when it goes.
    shm = Path(first.env["FTFLEET_SHM_DIR"])
    snap = shm / "ftfleet-goodput" / "node-0" / "rank-0" / "step-3" / "snapshot-0.bin"
    snap.parent.mkdir(parents=True)
    snap.write_bytes(b"s" * (2 << 20))
    inode = snap.stat().st_ino
    run.gone(first)
    assert first.killed and shm.exists()  # kept for the next spare
    second = run.launch()
    assert second is spare and gate.exists() and fake_nodes == [spare.pid]
    nxt = run.standby
    assert nxt is not None and nxt is not spare and run.spare_boots[nxt.name][0] is not None
    reserve = Path(nxt.env["FTFLEET_SHM_DIR"]) / "ftfleet-goodput" / "reserve"
    assert [p.stat().st_ino for p in reserve.iterdir()] == [inode]
    assert not shm.exists()  # the rest of the gone node's RAM is freed
    run.close()
    assert all(n.killed for n in FakeNode.started)
    assert not any((tmp_path / "shm").iterdir()) and not gate.exists()


def test_a_spare_node_that_exits_while_it_boots_is_replaced(bench, tmp_path, fake_nodes):
    FakeNode.exit_next = True
    run = faulted_run(bench, tmp_path)
    first = run.launch()
    dead, node, spare = FakeNode.started
    assert dead.exit_code == 1 and dead.killed and node is first
    assert dead.name not in run.spare_boots  # no start window left open for the whole run
    assert spare is run.standby and spare.exit_code is None
    run.close()


def test_torchrun_runs_start_no_spare_node(bench, tmp_path, fake_nodes):
    run = faulted_run(bench, tmp_path, spares=0)
    node = run.launch()
    assert FakeNode.started == [node] and run.standby is None
    assert "FTFLEET_SHM_DIR" not in node.env
    run.gone(node)
    nxt = run.launch()
    assert FakeNode.started == [node, nxt] and run.standby is None  # a fresh node, no spare
    run.close()


def test_a_start_window_without_a_start_is_left_out(bench):
    run = SimpleNamespace(spare_boots={"a": [None, None], "b": [10.0, 40.0], "c": [50.0, None], "d": [None, 5.0]})
    assert bench.spare_windows(run, end=60.0) == [(10.0, 40.0), (50.0, 60.0)]
    assert bench.spare_windows(run) == [(10.0, 40.0)]


@pytest.mark.integration
def test_the_bench_process_itself_never_imports_torch(tmp_path):
    # A take-over runs the bench's own code beside the recovery (the reserve's size from
    # the newest checkpoint, the files moved): torch there would be seconds of CPU that
    # no fleet pays.
    code = """
import importlib.util, sys
from pathlib import Path
from types import SimpleNamespace
spec = importlib.util.spec_from_file_location("g", sys.argv[1])
m = importlib.util.module_from_spec(spec)
sys.modules["g"] = m
spec.loader.exec_module(m)
work = Path(sys.argv[2])
run = SimpleNamespace(run_dir=work / "run", args=SimpleNamespace(nproc=2))
m.recycle_memory(work / "old", work / "new", 2, m.FaultedRun.reserve_bytes(run))
print("torch" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", code, str(BENCH), str(tmp_path)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


@pytest.mark.integration
def test_cpu_seconds_counts_a_process_and_its_children(bench):
    code = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        first, used = bench.cpu_seconds(proc.pid), 0.0
        for _ in range(200):  # the child spins: its CPU time shows within seconds
            time.sleep(0.05)
            used = bench.cpu_seconds(proc.pid) - first
            if used > 0.2:
                break
        assert used > 0.2
    finally:
        for p in bench._children(proc.pid):
            os.kill(p, 9)
        proc.kill()
        proc.wait()
