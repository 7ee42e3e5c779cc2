"""SIGTERM handling, in fresh processes: signals are process-wide."""

import json
import signal
import subprocess
import sys

import pytest

from ftfleet.contract import EXIT_PREEMPTED
from tests.trainer.resilience.helpers import REPO, run_python, subprocess_env

pytestmark = pytest.mark.integration

CHAINING = """
    import json, os, signal
    from ftfleet.trainer.resilience.notices.watcher import NoticeWatcher

    calls = []
    def previous(signum, frame):
        calls.append(signum)
    signal.signal(signal.SIGTERM, previous)

    watcher = NoticeWatcher("none").start()
    os.kill(os.getpid(), signal.SIGTERM)
    notice = watcher.pending()
    watcher.stop()
    print(json.dumps({
        "kind": notice.kind.value, "source": notice.source.value,
        "budget": notice.deadline - notice.received_at, "terminal": notice.terminal,
        "previous_called": calls == [signal.SIGTERM],
        "restored": signal.getsignal(signal.SIGTERM) is previous,
    }))
"""


def test_sigterm_becomes_a_signal_notice_chains_and_restores_the_previous_handler():
    result = run_python(CHAINING, env=subprocess_env(TORCH_ELASTIC_SHUTDOWN_TIMEOUT="45"))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out == {
        "kind": "signal",
        "source": "signal",
        "budget": 45.0,
        "terminal": True,
        "previous_called": True,
        "restored": True,
    }


TRAINING_LOOP = """
    import sys, time
    from ftfleet.contract import EXIT_PREEMPTED
    from ftfleet.trainer.resilience.notices.watcher import NoticeWatcher

    watcher = NoticeWatcher("none").start()
    print("ready", flush=True)
    step = 0
    while (notice := watcher.pending()) is None:
        step += 1          # a training step
        time.sleep(0.01)
    print(notice.kind.value, round(notice.deadline - notice.received_at), flush=True)
    sys.exit(EXIT_PREEMPTED)
"""


def test_an_external_sigterm_does_not_kill_the_process_but_reaches_the_loop():
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINING_LOOP.replace("\n    ", "\n")],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, err
    assert out.split() == ["signal", "30"]
