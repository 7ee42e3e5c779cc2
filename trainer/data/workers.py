"""The data loader's worker processes: where they come from, and that they go.

Workers run in process groups of their own (and so does their server): torchrun stops
a rank with a signal to the rank's process group, and a worker that died of it made the
rank's loader raise ("DataLoader worker ... killed") instead of the rank taking its
emergency checkpoint. A worker still goes with its rank: on the rank's orderly close,
when its parent dies (torch's worker loop watches it), or through :func:`exit_with`.

Kept free of torch: the trainer starts the workers' server before it imports torch
itself, so that the two imports overlap.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

#: CPython 3.11 before 3.11.10 can deadlock a child forked while another thread holds
#: the runtime's HEAD_LOCK (gh-112275; 3.12 was fixed from its start).
FORK_DEADLOCK_FIXED = (3, 11, 10)


def resolve_start_method(method: str, version: tuple[int, ...] = tuple(sys.version_info[:3])) -> str:
    """``data.start_method``: ``auto`` is ``forkserver`` on an interpreter with the fork
    deadlock, else ``fork`` (PyTorch's default: no extra import, and the dataset need
    not pickle); any other value as it is."""
    if method != "auto":
        return method
    return "forkserver" if version < FORK_DEADLOCK_FIXED else "fork"


def start_for(cfg: Any) -> None:
    """Start the loader workers' server for a trainer config (``data.num_workers`` and
    ``data.start_method``), preloading the module of ``data.factory``, where the
    dataset's class usually lives (its spec, not imported here)."""
    if cfg.data.num_workers:
        factory = cfg.data.factories["factory"]
        module = str(getattr(factory, "target", "") or "").partition(":")[0]
        start_worker_server(cfg.data.start_method, [module] if module else [])


def start_worker_server(method: str, modules: Sequence[str] = ()) -> None:
    """Start the process the loader's workers are forked from (``forkserver``), now,
    importing torch and ``modules`` (where the dataset's class lives) once, so that a
    worker started later forks ready instead of importing them. Idempotent; the server
    outlives an in-process restart and exits with this process. The trainer's entry points
    call it before they import torch, so that the two imports overlap (a warm spare
    while it waits).

    Workers come from a server where forking the trainer itself is not safe: it runs
    threads (the snapshot writer, the uploader, the watchers, torch's own), and on
    CPython 3.11 before 3.11.10 a fork taken while another thread creates or deletes its
    thread state leaves the child deadlocked (gh-112275; seen here as a loader worker
    stuck in ``_PyThreadState_DeleteExcept``, and its rank waiting for it). Python 3.14
    made forkserver the default for fork's hazards in general."""
    if resolve_start_method(method) != "forkserver":
        return
    from multiprocessing import forkserver

    # "__main__": a class defined in the user's script; the server imports the script as
    # multiprocessing's spawn does (its entry point under `if __name__ == "__main__"`).
    # server: first, its own process group; frozen: last.
    preload = ["ftfleet.trainer.data.server", "torch", *(m for m in modules if m), "ftfleet.trainer.data.frozen"]
    forkserver.set_forkserver_preload(list(dict.fromkeys(preload)))
    forkserver.ensure_running()  # returns at once; the server imports in the background


def in_own_group(then: Callable[[int], None] | None = None) -> Callable[[int], None]:
    """A loader's ``worker_init_fn``: the worker leaves its parent's process group for
    one of its own (see the module doc), then ``then(worker_id)``, the loader's own
    init if it has one. Picklable when ``then`` is."""
    return functools.partial(_own_group, then)


def starts_in_own_group(worker_init_fn: Any) -> bool:
    """Whether ``worker_init_fn`` is one of :func:`in_own_group`'s."""
    return isinstance(worker_init_fn, functools.partial) and worker_init_fn.func is _own_group


def _own_group(then: Callable[[int], None] | None, worker_id: int) -> None:
    os.setpgid(0, 0)
    if then is not None:
        then(worker_id)


def exit_with(trainer_pid: int, _worker_id: int = 0) -> None:
    """In a loader worker that is not the trainer's child (forkserver, spawn): exit as
    soon as the trainer does. torch's worker watches its parent, which is the server
    here, and the server lives as long as any worker does: a trainer killed (SIGKILL, a
    hang's watchdog) would leave its workers and their server running for good, holding
    the job's stdout and stderr open. A thread waits on the trainer's pidfd."""
    import select
    import threading

    try:
        fd = os.pidfd_open(trainer_pid)
    except ProcessLookupError:  # gone already
        os._exit(0)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): poll
        fd = None

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])
        else:
            while _alive(trainer_pid):
                time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="ftfleet-trainer-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_inherited_sockets(_worker_id: int = 0) -> None:
    """In a forked loader worker: close the TCP sockets inherited from the trainer (its
    gloo connections, its store client). Otherwise, when the trainer process is killed,
    its workers keep those connections open until they notice their parent is gone
    (seconds), and the other ranks' collectives wait instead of failing at once. The
    worker's own queues are pipes, and fd passing makes its own Unix sockets."""
    import socket
    import stat

    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        family = sock.family
        sock.detach()
        if family in (socket.AF_INET, socket.AF_INET6):
            os.close(fd)
