"""The CPU priority of the trainer's background work."""

from __future__ import annotations

import os
import threading


def lower_thread_priority() -> None:
    """Run the calling thread at the lowest CPU priority (nice 19). On Linux a nice value
    is a thread's own, and the threads and processes it starts inherit it.

    For work that must not take the training processes' CPU where cores are few and
    that nothing waits for: a warm spare's imports. Not for a snapshot's or a save's
    background part, which the next snapshot waits for: tried on the 2-core machine
    (docs/BENCHMARKS.md, the 23:35 goodput run), it measured no gain there, and other
    processes on a busy host starve a niced thread while training waits for it."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):  # not Linux, or not permitted: run as is
        pass
