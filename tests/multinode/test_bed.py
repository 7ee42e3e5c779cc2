"""The multi-node bed itself: what it makes it removes, and its links can be cut."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.multinode.bed import Bed
from tests.trainer.conftest import wait_for

pytestmark = pytest.mark.integration

REPLY = "import socket;s=socket.socket();s.bind(('{a}',5555));s.listen();c,_=s.accept();c.sendall(b'hi')"
ASK = "import socket;print(socket.create_connection(('{a}',5555),timeout=2).recv(2).decode())"


def _names(prefix: str) -> str:
    listed = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    listed += subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return "\n".join(line for line in listed.splitlines() if prefix in line)


@pytest.mark.timeout(60)
def test_nodes_reach_each_other_until_partitioned_and_teardown_removes_everything():
    with Bed(2) as bed:
        if not bed.isolated:
            pytest.skip(f"no network namespaces here ({bed.why_not_isolated}): nothing to partition")
        a, b = bed[0], bed[1]
        assert _names(bed.prefix)
        b.popen([sys.executable, "-c", REPLY.format(a=b.addr)])
        ask = [*a.prefix(), sys.executable, "-c", ASK.format(a=b.addr)]
        for _ in range(50):  # the server binds in a moment
            done = subprocess.run(ask, capture_output=True, text=True)
            if done.returncode == 0:
                break
        assert done.stdout.strip() == "hi", done.stderr
        bed.partition(1)
        assert subprocess.run(ask, capture_output=True, text=True).returncode != 0
        sleeper = b.popen(["sleep", "60"])
        # `ip netns exec` enters the namespace, then execs: under load, a moment later.
        wait_for(lambda: sleeper.pid in b.pids(), 10, 0.02, what=f"pid {sleeper.pid} in the node's namespace")
        assert b.shm.is_dir() and sleeper.pid in b.pids()
        bed.lose(1)
        assert not b.shm.exists() and not b.pids()
    assert _names(bed.prefix) == ""
