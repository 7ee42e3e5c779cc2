"""How a process that no longer belongs to its run leaves: at once, saying why once.

:func:`leave` writes one log line (error level, on every rank: each process says why it
went), a ``fenced`` event (rank 0's event log; a no-op elsewhere), stops its torchrun
agent when asked to, SIGKILLs this process's descendants (the data loader's workers
and their server; the in-process wrapper's monitor daemonizes, and exits on its own
once its target is gone), and ends the process with
:data:`~ftfleet.contract.EXIT_FENCED` by ``os._exit``: no interpreter teardown, no
``atexit`` handler, no thread of this process writes anything after the call. Any
thread may call it; the first call wins and a later one waits for the exit, or, from
a signal handler (``from_signal``), returns at once: the handler runs on the main
thread between two bytecodes, perhaps inside a lock the winner needs (a logging
handler's), which a wait there would never release.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn, Protocol

from ftfleet.contract import EXIT_FENCED

log = logging.getLogger("ftfleet.fencing")

_leaving = threading.Lock()


class _Events(Protocol):
    def emit(self, event: str, every_rank: bool = False, **fields: Any) -> None: ...


_events: _Events | None = None


def report_to(events: _Events | None) -> None:
    """Where :func:`leave` records its ``fenced`` event (the run's
    :class:`~ftfleet.trainer.events.EventLog`; None: nowhere)."""
    global _events
    _events = events


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = text.rpartition(")")[2].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out: list[int] = []
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        out.append(child)
        todo.extend(children.get(child, ()))
    return out


def leave(why: str, *, stop_agent: bool = False, from_signal: bool = False, **fields: Any) -> NoReturn:
    """End this process with EXIT_FENCED: one log line saying ``why``, a ``fenced`` event
    with ``fields``, its torchrun agent stopped (``stop_agent``, by whichever local rank
    leaves: an agent alive would restart its workers into the generation they left,
    :func:`ftfleet.trainer.agent.stop_agent`), every descendant SIGKILLed, then
    ``os._exit``."""
    if not _leaving.acquire(blocking=False):
        if from_signal:  # the winner ends the process in a moment
            return
        while True:  # another thread is leaving: this one writes nothing more
            time.sleep(1)
    try:
        log.error("%s: this process leaves without committing anything more (exit %d)", why, EXIT_FENCED)
        if _events is not None:
            # Whichever local rank leaves first stops the agent, which stops the others:
            # the event cannot wait for rank 0.
            _events.emit("fenced", every_rank=True, why=why, **fields)
        if stop_agent:
            from ftfleet.trainer.agent import stop_agent as stop

            stop(EXIT_FENCED, "fenced", any_local_rank=True)
    except Exception:  # noqa: BLE001 - a closed stream or a full disk: the exit matters more
        pass
    finally:
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(EXIT_FENCED)
