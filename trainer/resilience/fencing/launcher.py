"""A trainer process ends within a second of its launcher's death.

torchrun starts its workers in sessions of their own, and the in-process launcher's
workers are plain children: when the launcher alone dies (the OOM killer, a scheduler
that signals one pid, a crash), nothing stops them. They go on training as orphans,
and a relaunch then runs two generations of the job against one run directory.

:func:`bind_to_launcher`, called early in every trainer process a launcher starts (the
entry points, and :func:`~ftfleet.trainer.distributed.init_distributed` for a loop of
one's own), ties the process to its launcher:

* the launcher is this process's parent: under torchrun (``TORCHELASTIC_RUN_ID`` set)
  the agent; under the in-process launcher the pid it passes
  (``FTFLEET_LAUNCHER_PID``). A process started by neither (``python -m
  ftfleet.trainer`` from a shell) is tied to nothing: a shell's exit must not end a
  ``nohup``'d run;
* the kernel sends :data:`DEATH_SIGNAL` when the parent dies (``PR_SET_PDEATHSIG``),
  and a handler leaves (:func:`~.leave.leave`); then the parent is checked again, in
  case it died before the kernel was told;
* a daemon thread waits on the launcher's pidfd (or, without pidfds, checks the parent
  pid twice a second) and leaves too: a signal handler runs only when the main thread
  is between two bytecodes, and a rank blocked in a collective with a dead peer may
  wait there for minutes.

Leaving is exit :data:`~ftfleet.contract.EXIT_FENCED` with one log line naming the
launcher, and this process's descendants (the loader's workers) go with it. Nobody
waits for an orphan's exit status; the code and the line are for the log and the
node's reaper. Between the launcher's death and the exit, no commit happens: every
commit asks :func:`launcher_alive` right before it writes
(:func:`~ftfleet.trainer.resilience.fencing.fence.check`).

The parent-death signal follows the thread that started the process: both launchers
start their workers from their main thread, which lives as long as they do.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Mapping

from ftfleet.trainer.environment import TrainerEnvironment
from ftfleet.trainer.resilience.fencing.leave import leave

log = logging.getLogger("ftfleet.fencing")

#: Sent by the kernel to a bound process when its launcher dies. A real-time signal
#: nothing else in the trainer uses (``resilience.watcher.signals`` names notices).
DEATH_SIGNAL = signal.SIGRTMIN + 1
_PR_SET_PDEATHSIG = 1
#: Seconds between two looks at the parent pid where there is no pidfd.
POLL_S = 0.5

_bound: int | None = None
_what = ""
_lock = threading.Lock()


def launcher_of(environ: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """The pid of the launcher this process must not outlive and what it is, or None
    when no launcher started it."""
    environ = os.environ if environ is None else environ
    pid = TrainerEnvironment(environ).launcher_pid
    if pid is not None:
        return pid, "the in-process launcher"
    if "TORCHELASTIC_RUN_ID" in environ:
        return os.getppid(), "the torchrun agent"
    return None


def bound_launcher() -> int | None:
    """The launcher's pid once :func:`bind_to_launcher` tied this process to it."""
    return _bound


def launcher_alive() -> bool:
    """False once the launcher this process is bound to is gone (True when unbound)."""
    return _bound is None or os.getppid() == _bound


def bind_to_launcher(environ: Mapping[str, str] | None = None) -> int | None:
    """Tie this process to its launcher (see the module). Idempotent; returns the
    launcher's pid, or None when no launcher started this process. Leaves at once
    (exit EXIT_FENCED) when the launcher is already gone."""
    global _bound, _what
    with _lock:
        if _bound is not None:
            return _bound
        found = launcher_of(environ)
        if found is None:
            return None
        pid, what = found
        if os.getppid() != pid:
            if _alive(pid):  # an inherited variable: the launcher is not this process's parent
                log.warning("the launcher (pid %d) is not this process's parent: not tied to it", pid)
                return None
            leave(f"{what} (pid {pid}) is gone", launcher_pid=pid)
        _bound, _what = pid, what
        if threading.current_thread() is threading.main_thread():
            signal.signal(DEATH_SIGNAL, _on_death_signal)
            _set_parent_death_signal(DEATH_SIGNAL)
        if os.getppid() != pid:  # it died before the kernel was told
            _gone()
        threading.Thread(target=_watch, args=(pid,), name="ftfleet-launcher-watch", daemon=True).start()
        log.debug("tied to %s (pid %d): this process ends when it does", what, pid)
        return pid


def _gone(from_signal: bool = False) -> None:
    leave(f"{_what} (pid {_bound}) is gone", launcher_pid=_bound, from_signal=from_signal)


def _on_death_signal(_signum: int, _frame: object) -> None:
    # Once: the kernel sends the signal again for each thread of the launcher that exits
    # (the parent is the thread that started this process, and its siblings inherit it),
    # and a handler entered again inside the first would never let it finish.
    signal.signal(DEATH_SIGNAL, signal.SIG_IGN)
    _gone(from_signal=True)


def _set_parent_death_signal(signum: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    except (OSError, AttributeError) as exc:  # not Linux: the watch thread alone
        log.warning("no parent-death signal (%s): the launcher is watched by a thread alone", exc)


def _watch(pid: int) -> None:
    """Leave when the launcher exits: its pidfd turns readable (at once), or the parent
    pid changes (every :data:`POLL_S`)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None and os.getppid() == pid:  # the pidfd is of the launcher, not of a reused pid
        select.select([fd], [], [])
    else:
        while os.getppid() == pid:
            time.sleep(POLL_S)
    _gone()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
