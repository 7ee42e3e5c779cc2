"""The CPU priority of the trainer's background work."""

from __future__ import annotations

import os
import threading


def lower_thread_priority() -> None:
    """Run the calling thread at the lowest CPU priority (nice 19). On Linux a nice value
    is a thread's own, and the threads and processes it starts inherit it.

    For the work that must not take the training threads' CPU where cores are few: a
    snapshot's checksum and peer copy, a durable save written from a snapshot, a warm
    spare's imports. On a host with idle cores it changes nothing; on the 2-core
    benchmark machine the background work then runs when training waits (its
    collectives) instead of beside its compute. Nothing on the training thread may call
    it: a blocking save or a copy training waits for would only get slower."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):  # not Linux, or not permitted: run as is
        pass
