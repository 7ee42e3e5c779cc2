"""Which launcher a trainer process is tied to, and that no commit happens once it is
gone (in-process: the end of a real orphan is tests/.../test_launcher_death.py)."""

from __future__ import annotations

import os
import sys

import pytest

from ftfleet.trainer.checkpoint.comm import LocalComm
from ftfleet.trainer.resilience.fencing import fence, launcher
from ftfleet.trainer.resilience.fencing.leave import descendants


class Left(Exception):
    """Stands in for the process's exit (leave ends the process with os._exit)."""


@pytest.fixture
def orphaned(monkeypatch):
    """This process bound to a launcher that is no longer its parent; leaving raises Left."""

    def leave(why, **fields):
        raise Left(why, fields)

    monkeypatch.setattr(launcher, "_bound", os.getppid() + 1_000_000)
    monkeypatch.setattr(fence, "leave", leave)
    monkeypatch.setattr(fence, "_current", None)


def test_a_process_no_launcher_started_is_tied_to_nothing():
    assert launcher.launcher_of({}) is None


def test_a_torchrun_worker_is_tied_to_its_parent_the_agent():
    assert launcher.launcher_of({"TORCHELASTIC_RUN_ID": "none"}) == (os.getppid(), "the torchrun agent")


def test_an_in_process_worker_is_tied_to_the_pid_its_launcher_passed():
    env = {"FTFLEET_LAUNCHER_PID": "4242", "TORCHELASTIC_RUN_ID": "none"}
    assert launcher.launcher_of(env) == (4242, "the in-process launcher")


def test_an_unbound_process_counts_its_launcher_alive():
    assert launcher.bound_launcher() is None and launcher.launcher_alive()


def test_an_orphan_refuses_the_commit_it_was_about_to_make(orphaned, tmp_path):
    from ftfleet.trainer.checkpoint.commit import commit_step

    (tmp_path / "__0_0.distcp").write_bytes(b"x" * 10)
    (tmp_path / ".metadata").write_bytes(b"m")

    class Info:
        relative_path, offset, length = "__0_0.distcp", 0, 10

    class Metadata:
        storage_data = {"k": Info()}

    assert not launcher.launcher_alive()
    with pytest.raises(Left, match=r"checkpoint step-3 refused: the launcher \(pid \d+\) is gone"):
        commit_step(LocalComm(), tmp_path, 3, Metadata(), None, run_id="r", config_hash="c", torch_version="t")
    assert not (tmp_path / "manifest.json").exists()


def test_an_orphan_writes_no_commit_marker(orphaned, tmp_path):
    from ftfleet.contract import CommitMarker
    from ftfleet.trainer.resilience.preemption.marker import publish_marker

    with pytest.raises(Left, match="commit marker of step 5 refused"):
        publish_marker(CommitMarker.now("r", "node-a", 5, "termination", False), fast_root=tmp_path)
    assert not list(tmp_path.rglob("*.json"))


def test_this_process_is_among_its_parents_descendants_and_not_its_own():
    assert os.getpid() in descendants(os.getppid())
    assert os.getpid() not in descendants(os.getpid())


def test_a_death_signal_while_another_thread_leaves_returns_instead_of_waiting_forever():
    """The kernel sends the parent-death signal once per exiting thread of the launcher:
    a handler that waited for the leaving thread would hold the main thread (and any
    lock it was interrupted in) for good; seen as workers that logged their leave line
    and never exited."""
    leaving = sys.modules["ftfleet.trainer.resilience.fencing.leave"]  # the package's `leave` is the function
    assert leaving._leaving.acquire(blocking=False)  # another thread is leaving
    try:
        assert leaving.leave("the launcher is gone", from_signal=True) is None
    finally:
        leaving._leaving.release()


def test_the_death_signal_handler_takes_the_signal_once(monkeypatch):
    import signal

    calls = []
    monkeypatch.setattr(launcher, "_gone", lambda from_signal=False: calls.append(from_signal))
    previous = signal.signal(launcher.DEATH_SIGNAL, launcher._on_death_signal)
    try:
        launcher._on_death_signal(launcher.DEATH_SIGNAL, None)
        assert signal.getsignal(launcher.DEATH_SIGNAL) == signal.SIG_IGN and calls == [True]
    finally:
        signal.signal(launcher.DEATH_SIGNAL, previous)
