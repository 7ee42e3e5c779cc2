"""``ftfleet torchrun``: torchrun that exits with the trainer's code, in one line
(trainer/torchrun.py), and the worker's side of it (trainer/agent.py). The launches:
tests/trainer/scenarios/test_vision.py (a SIGTERM stop: 75) and
tests/trainer/test_config.py (a bad config: 2, one line)."""

from __future__ import annotations

import os
import signal

import pytest
import torch.distributed.run
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ftfleet.cli import main as ftfleet
from ftfleet.contract import agent_exit_file
from ftfleet.trainer import agent


@pytest.fixture
def launch(monkeypatch, tmp_path, capsys):
    """``ftfleet torchrun`` whose torchrun run ends as ``outcome`` says: None (done), an
    exception, or a code the trainer leaves in the exit file before the exception."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))

    def go(outcome=None, left: int | None = None) -> tuple[int, list[str]]:
        def run(args):
            assert args.nproc_per_node == "2" and args.training_script == "train.py"
            if left is not None:
                with open(agent_exit_file(os.getpid()), "w") as f:
                    f.write(f"{left}\n")
            if outcome is not None:
                raise outcome

        monkeypatch.setattr(torch.distributed.run, "run", run)
        code = ftfleet(["torchrun", "--nproc-per-node=2", "train.py", "--config", "x.yaml"])
        return code, capsys.readouterr().err.splitlines()

    return go


def failed(*exitcodes: int) -> ChildFailedError:
    failures = {
        r: ProcessFailure(local_rank=r, pid=100 + r, exitcode=c, error_file="") for r, c in enumerate(exitcodes)
    }
    for r, failure in failures.items():
        failure.timestamp = r  # rank 0 failed first
    return ChildFailedError("train.py", failures)


def test_a_finished_run_exits_0_and_says_nothing(launch):
    assert launch() == (0, [])


def test_a_failed_rank_gives_its_code_in_one_line(launch):
    code, lines = launch(failed(76, 1))
    assert code == 76 and lines == [
        "ftfleet torchrun: exit 76, hang watchdog fired; restart the group (rank 0 exited 76)"
    ]


def test_a_rank_killed_by_a_signal_exits_128_plus_the_signal(launch):
    assert launch(failed(-9))[0] == 137


def test_a_stop_by_sigterm_exits_with_the_code_the_trainer_left(launch, tmp_path):
    code, lines = launch(SignalException("got signal: 15", sigval=signal.SIGTERM), left=75)
    assert code == 75 and len(lines) == 1 and "emergency checkpoint committed" in lines[0]
    assert not list(tmp_path.glob("ftfleet-agent-*.exit"))  # consumed
    assert launch(SignalException("got signal: 15", sigval=signal.SIGTERM))[0] == 128 + 15  # none left


def test_a_bad_config_leaves_its_one_line_to_the_trainer(launch):
    assert launch(failed(2, 2), left=2) == (2, [])


def test_the_worker_leaves_its_code_and_stops_an_agent_that_would_restart_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(agent, "torchrun_agent_pid", lambda: 4242)
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    assert agent.stop_agent(75, "going away") == 4242 and sent == [(4242, signal.SIGTERM)]
    # An agent that restarts nothing sees the exit itself; a SIGTERM adds only its traceback.
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    assert agent.stop_agent(2, "bad config") is None and len(sent) == 1
    assert open(agent_exit_file(4242, str(tmp_path))).read() == "2\n"


@pytest.mark.parametrize("restarts", ["0", "3"])
def test_a_bad_config_is_said_by_the_first_local_rank_out_whichever_it_is(monkeypatch, tmp_path, restarts):
    """The agent ends the other workers once one has exited: the one line comes from
    the rank that left the code first (here local rank 1), and only from it; that rank
    alone stops an agent that would restart the workers."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", restarts)
    monkeypatch.setattr(agent, "torchrun_agent_pid", lambda: 4242)
    monkeypatch.setattr(agent, "_started", lambda pid: 0.0)
    sent = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert agent.first_on_node(2, "bad configuration")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert not agent.first_on_node(2, "bad configuration")
    assert open(agent_exit_file(4242, str(tmp_path))).read() == "2\n"
    assert sent == ([] if restarts == "0" else [(4242, signal.SIGTERM)])


def test_an_exit_file_older_than_its_agent_is_an_earlier_agents_and_is_replaced(monkeypatch, tmp_path):
    """A plain torchrun leaves its exit file behind; an agent that later gets the same pid
    must not take it for a word of its own workers."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    monkeypatch.setattr(agent, "torchrun_agent_pid", lambda: 4242)
    path = agent_exit_file(4242, str(tmp_path))
    with open(path, "w") as f:
        f.write("75\n")
    os.utime(path, (1000.0, 1000.0))
    monkeypatch.setattr(agent, "_started", lambda pid: 2000.0)
    assert agent.first_on_node(2, "bad configuration") and open(path).read() == "2\n"
    monkeypatch.setattr(agent, "_started", lambda pid: None)  # /proc cannot say: keep what is there
    assert not agent.first_on_node(2, "bad configuration")


def test_a_process_start_time_is_read_from_proc():
    import time

    started = agent._started(os.getpid())
    assert started is not None and 0 < time.time() - started < 24 * 3600
    assert agent._started(2**22 + 1) is None
