"""One generation of a run commits: fencing by a generation number in the run's store.

Every attempt of a run is a generation: a torchrun start, each restart of its workers
and each new rendezvous round, each in-process restart. The ranks of an attempt share
a store that outlives it (torchrun's agent store, the in-process launcher's store:
``MASTER_ADDR:MASTER_PORT``). When the ranks agree on the attempt
(:func:`~ftfleet.trainer.distributed.agree_on_attempt`), rank 0 registers it there
(:func:`register`): the next number of the counter :data:`COUNTER_KEY`, and a token
(that number and a fresh name) installed under :data:`NEWEST_KEY` unless a newer
generation's is there already; every rank adopts the attempt's :class:`Fence`.
(``TORCHELASTIC_RESTART_COUNT`` cannot number
generations: each agent counts only its own restarts, and a rendezvous round is
not visible to the workers.)

Right before each commit (the manifest of a disk checkpoint, of its copy in the
durable tier, of an in-memory snapshot, the commit marker) the committing process
checks (:meth:`Fence.check`) that its launcher is alive and that :data:`NEWEST_KEY`
still holds its own generation's token, over a connection of its own to the store,
within :data:`CHECK_TIMEOUT_S`. When a newer generation registered, or the store
cannot be reached to tell (its host is gone or partitioned away), the commit is
refused: the process leaves (:func:`~.leave.leave`: one log line, a ``fenced`` event,
its torchrun agent stopped so that it does not restart the old generation, exit
:data:`~ftfleet.contract.EXIT_FENCED`), and the node's next start joins the newest
generation. A fence that is not this process's newest (a thread left over from an
attempt an in-process restart replaced; the restart retires the old one (:func:`retire`)
before any rank registers the next) raises :class:`Fenced` instead: the process
itself belongs to the newest generation.

The check and the write are two steps: a generation that registers between them does
not stop that one write. It stops every later one, and a generation registers only
after the previous one's ranks have left the group it trained in.
"""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import uuid
from typing import Any, NoReturn

from ftfleet.trainer.resilience.fencing import lease
from ftfleet.trainer.resilience.fencing.launcher import bound_launcher, launcher_alive
from ftfleet.trainer.resilience.fencing.leave import leave

log = logging.getLogger("ftfleet.fencing")

#: Keys in the run's store (outside every attempt's prefix).
COUNTER_KEY = "ftfleet/generation/counter"
NEWEST_KEY = "ftfleet/generation/newest"
#: A check that has no answer from the store within this long refuses the commit.
CHECK_TIMEOUT_S = 30.0


class Fenced(RuntimeError):
    """A commit refused because its generation is no longer the newest, in a process
    that belongs to the newest one (a leftover of a replaced in-process attempt)."""


def generation_of(token: str | bytes) -> int:
    """The generation number of a token (``<number>.<name>``); -1 for anything else."""
    text = token.decode(errors="replace") if isinstance(token, bytes) else token
    number, _, _ = text.partition(".")
    return int(number) if number.isdigit() else -1


def register(store: Any) -> str:
    """On rank 0 of a new attempt: draw the next generation from ``store``, install it
    as the newest unless a newer one is there, and return its token (every rank of
    the attempt gets it as the attempt's name)."""
    number = int(store.add(COUNTER_KEY, 1))
    token = f"{number}.{uuid.uuid4().hex}"
    seen = ""
    while True:
        now = store.compare_set(NEWEST_KEY, seen, token)
        now = now.decode() if isinstance(now, bytes) else str(now)
        if now == token:
            return token
        if generation_of(now) > number:  # a newer attempt registered first: this one is stale already
            log.warning("generation %d registered after %d: its commits will be refused", number, generation_of(now))
            return token
        seen = now


class Fence:
    """This process's view of its generation: ``token`` (:func:`register`), checked in
    the store at ``host:port``."""

    def __init__(self, host: str, port: int, token: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
        self.host, self.port, self.token = host, port, token
        self.generation = generation_of(token)
        self.timeout_s = timeout_s
        self._client: Any = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Fence(generation {self.generation} at {self.host}:{self.port})"

    def problem(self) -> str | None:
        """Why this generation may not commit now, or None when it may."""
        if not launcher_alive():
            return f"the launcher (pid {bound_launcher()}) is gone"
        try:
            newest = self._newest()
        except Exception as exc:  # noqa: BLE001 - any failure to read is "cannot tell"
            return (
                f"the run's store at {self.host}:{self.port} cannot be reached to check generation "
                f"{self.generation} ({type(exc).__name__}: {exc})"
            )
        if newest != self.token:
            return f"generation {self.generation} was superseded by generation {generation_of(newest)}"
        return None

    def check(self, what: str) -> None:
        """Right before committing ``what``: return when this generation may, else refuse
        (:meth:`refuse`)."""
        problem = self.problem()
        if problem is not None:
            self.refuse(what, problem)

    def refuse(self, what: str, problem: str) -> NoReturn:
        """Refuse the commit of ``what``: leave the process when this is its newest fence,
        else raise :class:`Fenced`."""
        refuse(self, what, problem)

    def _newest(self) -> str:
        """The newest generation's token, read on a thread of its own: a store whose host
        vanished without a reset can hold a read for the connection's whole timeout."""
        answer: queue.Queue[tuple[bool, Any]] = queue.Queue(1)

        def ask() -> None:
            try:
                with self._lock:
                    if self._client is None:
                        import torch.distributed as dist

                        timeout = datetime.timedelta(seconds=self.timeout_s)
                        self._client = dist.TCPStore(
                            self.host, self.port, is_master=False, timeout=timeout, wait_for_workers=False
                        )
                    answer.put((True, self._client.get(NEWEST_KEY)))
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                answer.put((False, exc))

        threading.Thread(target=ask, name="ftfleet-fence-check", daemon=True).start()
        try:
            ok, value = answer.get(timeout=self.timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no answer in {self.timeout_s:.0f} s") from None
        if not ok:
            raise value
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


_current: Fence | None = None


def current() -> Fence | None:
    """This process's newest fence (None: not registered in any store, e.g. one process
    without a launcher)."""
    return _current


def adopt(fence: Fence | None) -> None:
    """Make ``fence`` this process's newest (each attempt, when its ranks agreed)."""
    global _current
    _current = fence


def retire() -> None:
    """This process's attempt is over and a new one will start in it (an in-process
    restart begins): from now on a commit still made with the old attempt's fence (a
    leftover thread) is refused without the process leaving, until the next attempt
    adopts its own."""
    adopt(None)


def problem_of(fence: Fence | None) -> str | None:
    """Why a process holding ``fence`` may not commit now (None: it may): its run lease
    (:mod:`.lease`, where it holds one), then its generation; without a fence, only its
    launcher is asked."""
    held = lease.problem()
    if held is not None:
        return held
    if fence is not None:
        return fence.problem()
    return None if launcher_alive() else f"the launcher (pid {bound_launcher()}) is gone"


def refuse(fence: Fence | None, what: str, problem: str) -> NoReturn:
    """Refuse the commit of ``what`` for ``problem``: leave the process, unless ``fence``
    is an older one of this process's (then :class:`Fenced`)."""
    if fence is not None and fence is not _current:
        raise Fenced(f"{what} refused: {problem} (a replaced attempt of this process)")
    leave(
        f"{what} refused: {problem}",
        refused=what,
        generation=None if fence is None else fence.generation,
        stop_agent=fence is not None and launcher_alive(),
    )


def check(fence: Fence | None, what: str) -> None:
    """Right before committing ``what`` with ``fence`` (see :func:`problem_of`)."""
    problem = problem_of(fence)
    if problem is not None:
        refuse(fence, what, problem)
