"""In-process restart with a warm spare (nvidia-resiliency-ext's wrapper around the
reference trainer, :mod:`ftfleet.trainer.inprocess`), end to end: 2 training processes
and 1 spare, gloo on CPU.

A SIGKILLed rank is replaced by the spare, the survivor never exits (same pid before
and after), everyone restores from the in-memory snapshots, and the run ends
bit-identical to the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from ftfleet.trainer.events import read_events
from tests.trainer.conftest import BASE, CONFIG, LOADER_WORKERS, MEMORY, REPO, child_env, inprocess_cmd, wait_for

pytest.importorskip("nvidia_resiliency_ext.inprocess", reason="make setup installs nvidia-resiliency-ext")

ARGS = [*BASE, *MEMORY, "train.step_events=true"]


def _events(run_dir):
    # The trainer's own reader: none yet is [], a line still being appended is skipped.
    return list(read_events(run_dir))


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_sigkilled_rank_is_replaced_by_the_spare_and_the_survivor_never_exits(tmp_path, ref2):
    run_dir, shm = tmp_path / "run", tmp_path / "shm"
    cmd = inprocess_cmd(run_dir, *ARGS, LOADER_WORKERS)  # the loader is built again in place
    log = open(tmp_path / "launch.log", "w")
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=child_env({"FTFLEET_SHM_DIR": str(shm)}), stdout=log, stderr=subprocess.STDOUT
    )
    try:
        wait_for(lambda: any(e["event"] == "step" and e["step"] >= 10 for e in _events(run_dir)), 120, what="step 10")
        pids = {}
        for line in (tmp_path / "launch.log").read_text().splitlines():
            if line.startswith("ftfleet.inprocess: process "):
                _, _, rank, _, pid = line.split()  # ftfleet.inprocess: process 1 pid 27269
                pids[int(rank)] = int(pid)
        os.kill(pids[1], signal.SIGKILL)
        assert proc.wait(timeout=180) == 0, (tmp_path / "launch.log").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state_sha256"] == ref2["state_sha256"]
    assert summary["resumed_from"]["tier"] == "memory" and summary["resumed_from"]["step"] >= 9
    assert summary["restarts"] == 1
    starts = [e for e in _events(run_dir) if e["event"] == "start"]
    assert [e["attempt"] for e in starts] == [0, 1]
    assert starts[0]["pid"] == starts[1]["pid"] == pids[0], "rank 0 exited"
    assert "exit codes [0, -9, 0]" in (tmp_path / "launch.log").read_text()


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_spare_node_starts_warm_and_trains_only_once_told(tmp_path):
    run_dir, gate = tmp_path / "run", tmp_path / "go"
    cmd = [
        sys.executable,
        "-m",
        "ftfleet.trainer.inprocess",
        "--nproc=1",
        "--spares=0",
        f"--wait-for={gate}",
        "--",
        "--config",
        str(CONFIG),
        *BASE,
        "train.steps=3",
        f"run_dir={run_dir}",
    ]
    log = tmp_path / "launch.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "warm: waiting for" in log.read_text(), 60, what="the worker waiting, warm")
        assert proc.poll() is None and not (run_dir / "events.jsonl").exists(), "trained before it was told"
        gate.touch()
        assert proc.wait(timeout=90) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads((run_dir / "summary.json").read_text())["step"] == 3


def test_the_wrapper_takes_any_soft_timeout_the_launcher_accepts(monkeypatch):
    from ftfleet.trainer.inprocess.ranks import Layout
    from ftfleet.trainer.inprocess.worker import build_wrapper

    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setattr("ftfleet.trainer.inprocess.ranks.CURRENT", None)  # node_fill sets it: undone after
    for soft in (2.0, 60.0, 600.0, 3600.0):  # 600 s was refused (its default barrier: 120 s)
        build_wrapper(Layout(1, 0, 2), soft)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_launcher_stops_the_rest_once_too_few_processes_are_left(tmp_path):
    """2 ranks and no spare: one killed leaves a world nobody can fill. The wrapper
    would wait out its barrier timeout; the launcher stops the survivor at once."""
    (tmp_path / "sleeper.py").write_text(FAKE_WORKER)
    cmd = [sys.executable, "-m", "ftfleet.trainer.inprocess", "--nproc=2", "--spares=0", "--worker=sleeper"]
    env = child_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "FAKE_OUT": str(tmp_path)})
    log = tmp_path / "launch.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready = tmp_path.glob
        wait_for(lambda: len(list(ready("ready-*"))) == 2, timeout=60, interval=0.05, what=f"2 workers: {log}")
        pids = [int(line.split()[-1]) for line in log.read_text().splitlines() if " pid " in line]
        os.kill(pids[1], signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its workers
    rest = log.read_text()
    assert "1 of 2 processes left, 2 needed: stopping" in rest, rest
    assert "exit codes [-15, -9]" in rest, rest
    assert proc.returncode == 1


#: A worker for the launcher's own tests: started into a round it says it is ready and
#: sleeps; started warm (``--assign-from-stdin``) it reads its place, says it, and ends.
#: Each process says it is ready, and each warm one its assignment, in a file of its own
#: (FAKE_OUT): lines two processes print to one shared log at once can interleave.
FAKE_WORKER = """
import json, os, sys, time
if "--assign-from-stdin" in sys.argv:
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    place = json.loads(line)
    with open(os.path.join(os.environ["FAKE_OUT"], f"assigned-{os.getpid()}"), "w") as out:
        out.write(f"{place['env']['RANK']} {place['stop_key']}")
    sys.exit(0)
open(os.path.join(os.environ["FAKE_OUT"], f"ready-{os.getpid()}"), "w").close()
time.sleep(600)
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_stopped_round_is_rejoined_by_the_launcher_with_its_warm_processes(tmp_path):
    """--rejoin: once too few processes are left the launcher stops the round, stays, and
    gives its places in the next round to the processes it started warm during the
    first; the job ends when they do."""
    (tmp_path / "fake.py").write_text(FAKE_WORKER)
    cmd = [sys.executable, "-m", "ftfleet.trainer.inprocess", "--nproc=2", "--spares=0", "--worker=fake"]
    cmd += ["--rejoin", "--warm-after=0", "--max-rounds=2"]
    env = child_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "FAKE_OUT": str(tmp_path)})
    log = tmp_path / "launch.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "warm for the next round" in log.read_text(), timeout=60, interval=0.05, what=str(log))
        ready = tmp_path.glob
        wait_for(lambda: len(list(ready("ready-*"))) == 2, timeout=60, interval=0.05, what=f"2 workers: {log}")
        text = log.read_text()
        pids = [int(line.split()[-1]) for line in text.splitlines() if " pid " in line]
        warm = [int(p) for p in text.split("warm for the next round: pids ")[1].split("\n")[0].split()]
        os.kill(pids[1], signal.SIGKILL)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    rest = log.read_text()
    assert "round 0: stopped; this node joins the next one" in rest, rest
    assigned = {int(p.name.split("-")[1]): p.read_text() for p in tmp_path.glob("assigned-*")}
    assert sorted(assigned.values()) == ["0 ftfleet/inprocess/r1/stop", "1 ftfleet/inprocess/r1/stop"], rest
    assert sorted(assigned) == sorted(warm), rest
    round1 = [int(line.split()[-1]) for line in rest.split("round 1, node")[1].splitlines() if " pid " in line]
    assert round1 == warm, rest


def test_an_assignment_is_one_json_line_or_a_clear_error():
    import io

    from ftfleet.trainer.inprocess.worker import take_assignment

    good = json.dumps({"env": {"RANK": "3", "WORLD_SIZE": "4"}, "wrapper_port": 29401, "stop_key": "r1/stop"})
    place = take_assignment(io.StringIO(good + "\n"))
    assert place is not None and place.env["RANK"] == "3" and place.wrapper_port == 29401
    assert take_assignment(io.StringIO(place.line())) == place  # what the launcher writes
    assert take_assignment(io.StringIO("")) is None  # end of input: not needed
    for bad in (
        "{",
        "[]",
        json.dumps({"env": {"RANK": 3}, "wrapper_port": 1, "stop_key": "k"}),
        json.dumps({"env": {"RANK": "3"}, "wrapper_port": 0, "stop_key": "k"}),
        json.dumps({"env": {}, "wrapper_port": 1, "stop_key": "k"}),
    ):
        with pytest.raises(ValueError) as exc:
            take_assignment(io.StringIO(bad + "\n"))
        assert str(exc.value).startswith("assignment:") and "\n" not in str(exc.value)


def test_the_launcher_refuses_a_soft_timeout_the_wrapper_cannot_poll():
    from ftfleet.trainer.inprocess.launch import main

    with pytest.raises(SystemExit) as exc:
        main(["--nproc=1", "--soft-timeout=1", "--", "--config", str(CONFIG)])
    assert exc.value.code == 2


@pytest.mark.parametrize("min_ranks", ["0", "3"])
def test_the_launcher_refuses_a_minimum_outside_the_world(min_ranks, capsys):
    from ftfleet.trainer.inprocess.launch import main

    with pytest.raises(SystemExit) as exc:
        main(["--nproc=2", f"--min-ranks={min_ranks}", "--", "--config", str(CONFIG)])
    assert exc.value.code == 2
    assert f"--min-ranks {min_ranks}: use 1 to 2 (every training node's ranks)" in capsys.readouterr().err


def test_the_world_is_all_ranks_or_none_unless_it_may_shrink(monkeypatch):
    """Two ranks, one spare, two processes lost: one left. Bit-exact mode stops the job
    (every process inactive, the launchers told why: no training on another trajectory);
    shrink mode lets it go on alone."""
    from nvidia_resiliency_ext.inprocess.rank_assignment import RankAssignmentCtx
    from nvidia_resiliency_ext.inprocess.state import Mode, State

    from ftfleet.trainer.inprocess import worker
    from ftfleet.trainer.inprocess.ranks import Layout

    monkeypatch.setenv("MASTER_PORT", "29999")  # the wrapper's store is not started here
    monkeypatch.setattr("ftfleet.trainer.inprocess.ranks.CURRENT", None)  # node_fill sets it: undone after
    asked: list[tuple[str, int]] = []
    monkeypatch.setattr(
        "ftfleet.trainer.inprocess.stores.request_stop", lambda key, reason, lost: asked.append((reason, lost))
    )
    for min_active, mode in ((None, Mode.INACTIVE), (1, Mode.ACTIVE)):
        assign = worker.build_wrapper(Layout(1, 0, 2, 1), 30, min_active=min_active).rank_assignment
        state = State(rank=0, world_size=3, active_world_size=2, initial_rank=0, initial_world_size=3)
        ctx = assign(RankAssignmentCtx(state, None, {1, 2}))
        assert ctx.state.mode == mode, (min_active, ctx.state)
    assert len(asked) == 1 and "1 of 2 ranks lost and no spare" in asked[0][0], asked
    assert asked[0][1] == 0, "one node, its rank 0 alive: no node lost"


@pytest.mark.timeout(240)
def test_a_hung_rank_is_restarted_in_place_by_the_failed_collective(tmp_path, ref2):
    """Rank 1 stops making progress before step 12. Rank 0's collective fails after
    parallel.collective_timeout_s, the wrapper restarts every process in place (the hung
    one is interrupted in its Python loop), nobody exits, and the run ends bit-identical.
    Without the collective timeout, rank 0 waited in gloo until the wrapper's hard
    timeout killed it (37.6 s, and the wrong process was replaced)."""
    run_dir, shm = tmp_path / "run", tmp_path / "shm"
    cmd = inprocess_cmd(
        run_dir,
        *ARGS,
        LOADER_WORKERS,  # rebuilt in place by both ranks
        "parallel.collective_timeout_s=2",
        "resilience.watchdog.timeout_s=20",
        "faults.hang_at_step=12",
        "faults.hang_rank=1",
        soft_timeout=30,
    )
    log = tmp_path / "launch.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=child_env({"FTFLEET_SHM_DIR": str(shm)}), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        assert proc.wait(timeout=200) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state_sha256"] == ref2["state_sha256"]
    assert summary["resumed_from"]["tier"] == "memory" and summary["resumed_from"]["step"] == 11
    starts = [e for e in _events(run_dir) if e["event"] == "start"]
    assert [e["attempt"] for e in starts] == [0, 1]
    assert starts[0]["pids"] == starts[1]["pids"], "a process was replaced"
    assert "exit codes [0, 0, 0]" in log.read_text()
    hung = next(e for e in _events(run_dir) if e["event"] == "step" and e["step"] == 11)
    assert starts[1]["t"] - hung["t"] < 20, "the restart waited for something else than the collective timeout"


@pytest.mark.integration
def test_a_warm_spare_has_imported_what_the_first_optimizer_would():
    """``warm_up`` (called by a waiting spare) leaves nothing for the build to import:
    the first optimizer's lazy import of torch._dynamo took about 1 s here."""
    code = (
        "import sys, torch\n"
        "from ftfleet.trainer.train import warm_up\n"
        "assert 'torch._dynamo' not in sys.modules, 'imported already: warm_up is moot'\n"
        "warm_up()\n"
        "before = set(sys.modules)\n"
        "torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))], lr=1e-3)\n"
        "new = sorted(m for m in set(sys.modules) - before if m.startswith('torch'))\n"
        "assert not new, new\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


SLOW_WARM_UP = """
import sys, time
import ftfleet.trainer.train
from ftfleet.trainer.inprocess.worker import main

if __name__ == "__main__":  # the loader workers' server imports this module too
    ftfleet.trainer.train.warm_up = lambda: time.sleep(600)  # a spare's warm-up that never ends
    ftfleet.trainer.train.train = lambda cfg, callbacks: time.sleep(600)  # a rank that needs no CPU
    sys.exit(main())
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_spare_process_starts_its_loader_workers_server_at_launch_not_after_its_warm_up(tmp_path):
    """A take-over soon after a launch found the spare's server still importing torch:
    1.13-1.22 s from the restore to the first step, against 0.37-0.51 s with the server
    started at launch (docs/BENCHMARKS.md). Here the spare's warm-up never ends, and its
    server must run all the same (a forkserver on every interpreter, `auto` picks it only
    where forking the trainer can deadlock)."""
    from tests.trainer.resilience.torchrun_tree import children

    (tmp_path / "slow_warm_up.py").write_text(SLOW_WARM_UP)
    cmd = [sys.executable, "-m", "ftfleet.trainer.inprocess", "--nproc=1", "--spares=1", "--worker=slow_warm_up"]
    cmd += ["--", "--config", str(CONFIG), *BASE, LOADER_WORKERS, "data.start_method=forkserver"]
    cmd += [f"run_dir={tmp_path / 'run'}"]
    env = child_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "FTFLEET_SHM_DIR": str(tmp_path / "shm")})
    log = tmp_path / "launch.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def spare_server() -> bool:
        spare = next((line.split()[-1] for line in log.read_text().splitlines() if " process 1 pid " in line), None)
        for child in children(int(spare)) if spare else []:
            with contextlib.suppress(OSError):
                if b"multiprocessing.forkserver" in open(f"/proc/{child}/cmdline", "rb").read():
                    return True
        return False

    try:
        wait_for(spare_server, 60, interval=0.05, what=f"the spare's loader workers' server: {log}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher, its workers and their servers
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    ("launched", "per_node", "rank", "slot"),
    [(0, 2, 0, 0), (1, 2, 1, 1), (2, 2, 1, 1), (2, 2, 0, 0), (3, 2, 5, 1), (0, 1, 0, 0), (1, 1, 0, 0)],
)
def test_a_spare_process_trains_on_the_device_of_the_rank_it_replaces(launched, per_node, rank, slot):
    # Found on a lent GPU: the spare of 1 rank (launched as LOCAL_RANK 1) took rank 0 and
    # asked for cuda:1 ("invalid device ordinal") in every attempt after.
    from ftfleet.trainer.inprocess.worker import device_slot

    assert device_slot(launched, per_node, rank) == slot


CRASHER = """
import sys
from ftfleet.trainer.callbacks import Callback
from ftfleet.trainer.inprocess.worker import main

class Crash(Callback):
    def on_train_start(self, run):
        raise RuntimeError("planted: every attempt fails before its first step")

sys.exit(main(callbacks=lambda overrides: ([Crash()], overrides)))
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_attempts_that_keep_failing_before_a_step_give_up_instead_of_looping(tmp_path):
    (tmp_path / "crasher.py").write_text(CRASHER)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "ftfleet.trainer.inprocess", "--nproc=1", "--spares=0", "--worker=crasher"]
    cmd += ["--max-failed-starts=2", "--", "--config", str(CONFIG), *BASE, f"run_dir={run_dir}"]
    env = child_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "FTFLEET_SHM_DIR": str(tmp_path / "shm")})
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=100)
    assert out.returncode != 0, out.stderr[-3000:]
    assert "error: 2 in-process attempts in a row failed before their first step: giving up in place" in out.stderr
    assert out.stderr.count("planted: every attempt fails") >= 2
    starts = [e for e in _events(run_dir) if e["event"] == "start"]
    assert [e["attempt"] for e in starts] == [0, 1], starts


def test_the_launcher_refuses_a_limit_of_no_attempts(capsys):
    from ftfleet.trainer.inprocess.launch import main

    with pytest.raises(SystemExit) as exc:
        main(["--nproc=1", "--max-failed-starts=0", "--", "--config", str(CONFIG)])
    assert exc.value.code == 2 and "--max-failed-starts 0: use 1 or more" in capsys.readouterr().err


def test_a_launcher_rejoins_only_where_a_new_round_helps():
    from ftfleet.trainer.inprocess.launch import EMERGENCY, RoundEnd, rejoin_reason

    assert rejoin_reason(RoundEnd(0, codes=[0, 0])) is None  # the job is done
    assert rejoin_reason(RoundEnd(1, stopped=True, codes=[-15])) == "stopped"
    assert rejoin_reason(RoundEnd(1, stopped=True, signalled=True, codes=[-15])) is None  # told to go
    assert rejoin_reason(RoundEnd(1, codes=[-9, -9])) == "every process of this node was killed"
    assert rejoin_reason(RoundEnd(75, codes=[75, 75])) == EMERGENCY  # another node's notice
    assert rejoin_reason(RoundEnd(75, signalled=True, codes=[75])) is None  # this node's own notice
    for code in (1, 2, 77, 78):  # a crash or a refusal a new round would repeat
        assert rejoin_reason(RoundEnd(code, codes=[code, -9])) is None


def test_the_next_rounds_slot_is_the_one_whose_ranks_the_node_trained(tmp_path):
    from ftfleet.trainer.inprocess.launch import held_slot

    assert held_slot(str(tmp_path), per_node=3, nproc=2, active=6) is None  # nothing noted: no preference
    (tmp_path / "local0").write_text("5\n")  # took node 2's ranks 4, 5 with a spare node's processes
    (tmp_path / "local1").write_text("4\n")
    (tmp_path / "local2").write_text("garbage")
    assert held_slot(str(tmp_path), per_node=3, nproc=2, active=6) == 2
    (tmp_path / "local0").write_text("7\n")  # a waiting rank: not a training slot
    (tmp_path / "local1").write_text("6\n")
    assert held_slot(str(tmp_path), per_node=3, nproc=2, active=6) is None


def test_a_process_notes_the_rank_it_trains_for_its_launcher(tmp_path, monkeypatch):
    from ftfleet.trainer.environment import INPROCESS_RANK_FILE
    from ftfleet.trainer.inprocess.worker import note_rank

    note_rank(3)  # no file asked for: nothing written, no error
    monkeypatch.setenv(INPROCESS_RANK_FILE, str(tmp_path / "local0"))
    note_rank(3)
    note_rank(4)
    assert (tmp_path / "local0").read_text() == "4\n" and not (tmp_path / "local0.tmp").exists()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_hsdp_shrinks_by_a_whole_replica_group_and_sees_every_sample_once(tmp_path):
    """4 ranks as 2 replica groups of 2 (HSDP), no spare, --group-size 2 --min-ranks 2:
    rank 3 is SIGKILLed; its group is dropped (rank 2 waits, like a spare), ranks 0 and 1
    go on as one group of 2 with the same global batch, from the fast tier (the
    snapshots are of another world), and every sample is consumed exactly once."""
    from drill.samples import final_trace
    from tests.trainer.conftest import assert_each_sample_once

    run_dir, shm = tmp_path / "run", tmp_path / "shm"
    trainer = [
        "--config",
        str(CONFIG),
        *ARGS,
        "parallel.replicas=2",
        # A rank waiting on the dead one in a collective or a peer copy is stuck there
        # until its timeout: kept short, below the wrapper's heartbeat timeout.
        "parallel.collective_timeout_s=2",
        "checkpoint.memory_timeout_s=3",
        "train.global_batch_size=8",
        "data.trace_samples=true",
        f"run_dir={run_dir}",
    ]
    launcher = ["--nproc=4", "--spares=0", "--min-ranks=2", "--group-size=2", "--soft-timeout=30"]
    launcher += ["--worker=drill.inprocess_worker"]
    cmd = [sys.executable, "-m", "ftfleet.trainer.inprocess", *launcher, "--", *trainer]
    log = tmp_path / "launch.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=child_env({"FTFLEET_SHM_DIR": str(shm)}), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for(lambda: any(e["event"] == "step" and e["step"] >= 10 for e in _events(run_dir)), 150, what="step 10")
        pids = {}
        for line in log.read_text().splitlines():
            if line.startswith("ftfleet.inprocess: process "):
                _, _, rank, _, pid = line.split()
                pids[int(rank)] = int(pid)
        os.kill(pids[3], signal.SIGKILL)
        assert proc.wait(timeout=180) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["resumed_from"]["tier"] == "local", summary["resumed_from"]  # resharded from the fast tier
    assert summary["samples_seen"] == summary["step"] * 8
    starts = [e for e in _events(run_dir) if e["event"] == "start"]
    assert [(e["world_size"], e["replica_groups"], e["group_size"]) for e in starts] == [(4, 2, 2), (2, 1, 2)]
    assert_each_sample_once(final_trace(run_dir), summary["step"], 8)
