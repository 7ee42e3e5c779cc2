"""Generations in the run's store, and commits of an older one refused (in-process: a
store served by this process; a torchrun run superseded mid-run is test_superseded.py)."""

from __future__ import annotations

import datetime
import socket

import pytest
import torch.distributed as dist

from ftfleet.contract import CommitMarker
from ftfleet.trainer.checkpoint.comm import LocalComm
from ftfleet.trainer.checkpoint.commit import CommitError, commit_step
from ftfleet.trainer.resilience.fencing import fence
from ftfleet.trainer.resilience.fencing.fence import NEWEST_KEY, Fence, generation_of, register


class Left(Exception):
    """Stands in for the process's exit (leave ends the process with os._exit)."""


@pytest.fixture
def server():
    """The run's store, as torchrun's agent hosts it: it outlives every attempt."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    yield store
    del store


@pytest.fixture
def left(monkeypatch):
    """Leaving raises Left (with its fields) instead of ending the test's process."""

    def leave(why, **fields):
        raise Left(why, fields)

    monkeypatch.setattr(fence, "leave", leave)
    monkeypatch.setattr(fence, "_current", None)


def client(server) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False)


def fence_of(server, token: str, timeout_s: float = 5.0) -> Fence:
    return Fence("127.0.0.1", server.port, token, timeout_s=timeout_s)


def a_step(tmp_path):
    """What DCP leaves in a step directory before the commit: a shard and .metadata."""
    (tmp_path / "__0_0.distcp").write_bytes(b"x" * 10)
    (tmp_path / ".metadata").write_bytes(b"m")

    class Info:
        relative_path, offset, length = "__0_0.distcp", 0, 10

    class Metadata:
        storage_data = {"k": Info()}

    return Metadata()


def commit(tmp_path, metadata, with_fence):
    return commit_step(
        LocalComm(), tmp_path, 3, metadata, None, run_id="r", config_hash="c", torch_version="t", fence=with_fence
    )


def test_each_attempt_registers_the_next_generation_and_only_the_newest_may_commit(server):
    first, second = register(client(server)), register(client(server))
    assert (generation_of(first), generation_of(second)) == (1, 2)
    assert fence_of(server, first).problem() == "generation 1 was superseded by generation 2"
    assert fence_of(server, second).problem() is None


def test_an_older_attempt_registering_late_does_not_displace_the_newer(server):
    client(server).set(NEWEST_KEY, "9.newer")
    late = register(client(server))
    assert generation_of(late) == 1 and client(server).get(NEWEST_KEY) == b"9.newer"
    assert fence_of(server, late).problem() == "generation 1 was superseded by generation 9"


def test_a_superseded_generation_leaves_instead_of_writing_the_manifest(server, left, tmp_path):
    old = fence_of(server, register(client(server)))
    fence.adopt(old)
    register(client(server))  # a newer attempt, e.g. after this node was partitioned away
    with pytest.raises(Left) as exc:
        commit(tmp_path, a_step(tmp_path), old)
    why, fields = exc.value.args
    assert why == "checkpoint step-3 refused: generation 1 was superseded by generation 2"
    assert fields == {"refused": "checkpoint step-3", "generation": 1, "stop_agent": True}
    assert not (tmp_path / "manifest.json").exists()


def test_a_replaced_attempt_of_this_process_has_its_commit_refused_but_the_process_stays(server, left, tmp_path):
    old = fence_of(server, register(client(server)))
    new = fence_of(server, register(client(server)))
    fence.adopt(new)  # an in-process restart: this process belongs to the newest generation
    metadata = a_step(tmp_path)
    with pytest.raises(CommitError, match="superseded by generation 2 .a replaced attempt"):
        commit(tmp_path, metadata, old)
    assert not (tmp_path / "manifest.json").exists()
    assert commit(tmp_path, metadata, new).step == 3  # the newest commits
    assert (tmp_path / "manifest.json").exists()


def test_a_generation_whose_store_is_gone_cannot_tell_and_commits_nothing(left, tmp_path):
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    mine = fence_of(server, register(client(server)), timeout_s=1.0)
    fence.adopt(mine)
    del server  # its host died with the agent that served it
    with pytest.raises(Left, match=r"checkpoint step-3 refused: the run's store at 127.0.0.1:\d+ cannot be reached"):
        commit(tmp_path, a_step(tmp_path), mine)
    assert not (tmp_path / "manifest.json").exists()


def test_a_store_that_never_answers_is_given_up_on_within_the_checks_timeout():
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), answers nothing
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        mine = Fence("127.0.0.1", silent.getsockname()[1], "1.x", timeout_s=1.0)
        t0 = datetime.datetime.now()
        problem = mine.problem()
        took = (datetime.datetime.now() - t0).total_seconds()
    assert problem is not None and "cannot be reached" in problem, problem
    assert took < 5, took


def test_a_superseded_generation_writes_no_commit_marker(server, left, tmp_path):
    from ftfleet.trainer.resilience.preemption.marker import publish_marker

    fence.adopt(fence_of(server, register(client(server))))
    register(client(server))
    with pytest.raises(Left, match="commit marker of step 5 refused: generation 1 was superseded"):
        publish_marker(CommitMarker.now("r", "node-a", 5, "termination", False), fast_root=tmp_path)
    assert not list(tmp_path.rglob("*.json"))


def test_tokens_that_name_no_generation_read_as_older_than_any():
    assert generation_of("12.ab") == 12 and generation_of(b"3.x") == 3
    assert generation_of("") == generation_of("x.1") == generation_of("-1.a") == -1
