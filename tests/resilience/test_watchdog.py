"""The watchdog ends its process, so each case runs in a fresh one."""

from ftfleet.contract import EXIT_HUNG
from ftfleet.trainer.resilience.watchdog import WatchdogConfig

from .helpers import run_python

HUNG = """
    import threading, time
    from ftfleet.trainer.resilience.watchdog import Watchdog

    def stuck_in_a_collective():
        threading.Event().wait()

    def data_loader_worker():
        threading.Event().wait()

    threading.Thread(target=data_loader_worker, daemon=True).start()
    watchdog = Watchdog(2.0).start()
    for step in range(3):
        watchdog.beat(step)
        time.sleep(0.01)
    stuck_in_a_collective()
"""

HEALTHY = """
    import time
    from ftfleet.trainer.resilience.watchdog import Watchdog

    with Watchdog(2.0) as watchdog:
        for step in range(40):   # 2 s of steps, longer than the timeout
            time.sleep(0.05)
            watchdog.beat(step)
    time.sleep(2.5)              # stopped: silence no longer counts
    print("finished")
"""


def test_a_hung_process_dumps_every_threads_stack_and_exits_hung():
    result = run_python(HUNG)
    assert result.returncode == EXIT_HUNG == 76
    assert "hang watchdog: no step progress" in result.stderr
    assert "after step 2" in result.stderr
    assert "stuck_in_a_collective" in result.stderr  # the main thread's stack
    assert "data_loader_worker" in result.stderr  # and the others'


def test_a_process_that_keeps_beating_is_left_alone():
    result = run_python(HEALTHY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "finished"


def test_a_zero_timeout_turns_the_watchdog_off():
    assert WatchdogConfig(timeout_s=0).build() is None
    assert WatchdogConfig(timeout_s=30).build().timeout_s == 30.0
