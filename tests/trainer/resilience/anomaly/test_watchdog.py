"""The watchdog ends its process, so each case runs in a fresh one."""

import pytest

from ftfleet.contract import EXIT_HUNG
from ftfleet.trainer.resilience.anomaly.watchdog import WatchdogConfig
from tests.trainer.resilience.helpers import run_python

HUNG = """
    import threading, time
    from ftfleet.trainer.resilience.anomaly.watchdog import Watchdog

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
    from ftfleet.trainer.resilience.anomaly.watchdog import Watchdog

    with Watchdog(2.0) as watchdog:
        for step in range(40):   # 2 s of steps, longer than the timeout
            time.sleep(0.05)
            watchdog.beat(step)
    time.sleep(2.5)              # stopped: silence no longer counts
    print("finished")
"""


@pytest.mark.integration
def test_a_hung_process_dumps_every_threads_stack_and_exits_hung():
    result = run_python(HUNG)
    assert result.returncode == EXIT_HUNG == 76
    assert "hang watchdog: no step progress" in result.stderr
    assert "after step 2" in result.stderr
    assert "stuck_in_a_collective" in result.stderr  # the main thread's stack
    assert "data_loader_worker" in result.stderr  # and the others'


@pytest.mark.integration
def test_a_process_that_keeps_beating_is_left_alone():
    result = run_python(HEALTHY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "finished"


def test_a_zero_timeout_turns_the_watchdog_off():
    assert WatchdogConfig(timeout_s=0).build() is None
    assert WatchdogConfig(timeout_s=30).build().timeout_s == 30.0


LONG_DRAIN = """
    import time
    from ftfleet.trainer.resilience.anomaly.watchdog import Watchdog

    with Watchdog(1.0) as watchdog:
        watchdog.beat(7)
        with watchdog.phase("the end of the run", 4.0):
            time.sleep(2.5)      # a final save and upload longer than a step may take
        watchdog.beat(8)
    print("finished")
"""

HUNG_DRAIN = """
    import threading
    from ftfleet.trainer.resilience.anomaly.watchdog import Watchdog

    watchdog = Watchdog(30.0).start()
    watchdog.beat(7)
    with watchdog.phase("the end of the run", 1.5):
        threading.Event().wait()   # an upload that never returns
"""


@pytest.mark.integration
def test_the_end_of_a_run_has_its_own_allowance():
    result = run_python(LONG_DRAIN)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "finished"


@pytest.mark.integration
def test_a_hang_in_the_end_of_a_run_is_still_caught_and_named():
    result = run_python(HUNG_DRAIN)
    assert result.returncode == EXIT_HUNG
    assert "in the end of the run (limit 1.5s)" in result.stderr
