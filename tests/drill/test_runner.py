"""The drill's view of a node from outside: worker groups by pid, and the event log as
it grows."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from drill.runner import EventTail, Node

#: Stands in for torchrun: two workers (RANK in their environment, each in a session of
#: its own, as torch elastic starts them); when one dies it stops the other and starts a
#: second, short-lived group, then exits 0.
FAKE_TORCHRUN = r"""
import os, subprocess, sys, time
def group(seconds):
    return [subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"],
                             env={**os.environ, "RANK": str(r)}, start_new_session=True)
            for r in range(2)]
workers = group(60)
while all(w.poll() is None for w in workers):
    time.sleep(0.02)
for w in workers:
    if w.poll() is None:
        w.kill()
    w.wait()
for w in group(0.5):
    w.wait()
"""


def wait_until(predicate, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.integration
def test_a_killed_worker_ends_its_group_and_the_restarted_group_is_seen(tmp_path):
    node = Node(
        "node-x", [sys.executable, "-c", FAKE_TORCHRUN], dict(os.environ), tmp_path, tmp_path / "node.log"
    ).start()
    try:
        assert wait_until(lambda: node.poll() is None and node.group is not None and len(node.group.pids) == 2), (
            node.log_tail()
        )
        first = node.group
        t_kill = time.time()
        node.kill_worker(1)
        assert wait_until(lambda: node.poll() is not None or len(node.groups) == 2)
        assert first.t_first_exit is not None and first.t_first_exit >= t_kill
        assert first.t_down is not None and first.t_down >= first.t_first_exit
        assert node.wait(20) == 0
        assert len(node.groups) == 2 and set(node.groups[1].pids) == {0, 1}
        assert node.groups[1].t_down is not None
    finally:
        node.kill()


@pytest.mark.integration
def test_killing_a_node_takes_torchrun_and_every_worker(tmp_path):
    node = Node(
        "node-y", [sys.executable, "-c", FAKE_TORCHRUN], dict(os.environ), tmp_path, tmp_path / "node.log"
    ).start()
    assert wait_until(lambda: node.poll() is None and node.group is not None and len(node.group.pids) == 2)
    pids = list(node.group.pids.values())
    node.kill()
    assert node.proc.returncode == -signal.SIGKILL
    assert node.killed and node.group.t_down is not None

    def gone(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"

    assert wait_until(lambda: all(gone(p) for p in pids), 5)


def test_the_event_tail_returns_only_complete_new_lines(tmp_path):
    tail = EventTail(tmp_path)
    assert tail.poll() == []
    path = tmp_path / "events.jsonl"
    with open(path, "w") as f:
        f.write(json.dumps({"event": "start", "t": 1.0}) + "\n" + '{"event": "st')
    assert [e["event"] for e in tail.poll()] == ["start"]
    with open(path, "a") as f:
        f.write('ep", "t": 2.0}\nnot json\n')
    assert [e["event"] for e in tail.poll()] == ["step"]
    assert tail.poll() == []
    assert [e["event"] for e in tail.events] == ["start", "step"]
