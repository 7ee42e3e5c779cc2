"""Hang watchdog: no step progress for too long -> dump every thread's stack, exit.

A rank stuck in a collective, a dead file system or a deadlock makes no progress and
raises nothing. The watchdog is a daemon thread that expects :meth:`Watchdog.beat`
at least every ``timeout_s``; when a beat is late it writes one line and every
thread's stack (``faulthandler``) to the log stream, then ends the process with
``os._exit(EXIT_HUNG)``: no cleanup that could hang in turn. torchrun sees a failed
worker and restarts the group.

The dump goes straight to the stream's file descriptor, not through ``logging``: a
hung thread may hold the logging lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO

from ftfleet.contract import EXIT_HUNG
from ftfleet.errors import ConfigError

#: Where the trainer config nests this block (ResilienceConfig), for error messages.
_KEY = "resilience.watchdog"


@dataclasses.dataclass(kw_only=True, slots=True)
class WatchdogConfig:
    """When a rank counts as hung."""

    timeout_s: float = 600.0
    """Seconds without a beat after which the process is declared hung. 0: off."""
    first_step_timeout_s: float | None = None
    """Allowance for the first step (compilation, data loader warm-up, restore). None: same
    as timeout_s."""
    drain_timeout_s: float = 1800.0
    """Allowance for the end of a run: the final (or emergency) save, the wait for the
    durable uploads and the commit marker. The upload wait gives up shortly before it
    (the checkpoint stays on the fast tier and the next start uploads it), so the
    watchdog fires only on a real hang."""

    def __post_init__(self) -> None:
        if self.timeout_s < 0:
            raise ConfigError(f"{_KEY}.timeout_s={self.timeout_s}: use seconds > 0, or 0 to turn the watchdog off")
        if self.first_step_timeout_s is not None and self.first_step_timeout_s <= 0:
            raise ConfigError(
                f"{_KEY}.first_step_timeout_s={self.first_step_timeout_s}: "
                "use seconds > 0, or leave it unset to use timeout_s"
            )
        if not self.drain_timeout_s > 0:
            raise ConfigError(f"{_KEY}.drain_timeout_s={self.drain_timeout_s}: use seconds > 0")

    def build(self) -> Watchdog | None:
        """The configured watchdog, or None when it is off."""
        if not self.timeout_s:
            return None
        return Watchdog(self.timeout_s, first_step_timeout_s=self.first_step_timeout_s)


class Watchdog:
    def __init__(
        self,
        timeout_s: float,
        *,
        first_step_timeout_s: float | None = None,
        stream: IO[str] | None = None,
        exit_code: int = EXIT_HUNG,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r}: use a positive number of seconds")
        self.timeout_s = float(timeout_s)
        self.first_step_timeout_s = float(first_step_timeout_s or timeout_s)
        self.exit_code = exit_code
        self._stream = stream
        self._last_beat = time.monotonic()
        self._step: int | None = None
        self._phase: tuple[str, float] | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watchdog:
        if self._thread is not None:
            raise RuntimeError("Watchdog.start() called twice")
        self._stop.clear()
        self._last_beat = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="hang-watchdog", daemon=True)
        self._thread.start()
        return self

    def beat(self, step: int) -> None:
        """Progress: ``step`` finished. Cheap enough to call every step."""
        self._step = step
        self._last_beat = time.monotonic()

    @contextlib.contextmanager
    def phase(self, what: str, timeout_s: float) -> Iterator[None]:
        """A stretch without step beats that may take up to ``timeout_s`` (the end of
        the run): the watchdog still ends the process if it takes longer, naming it."""
        self._phase = (what, float(timeout_s))
        self._last_beat = time.monotonic()
        self._wake.set()  # a shorter allowance takes effect now, not at the next wake-up
        try:
            yield
        finally:
            self._phase = None
            self._last_beat = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        self._thread = None

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _limit(self) -> float:
        if self._phase is not None:
            return self._phase[1]
        return self.timeout_s if self._step is not None else self.first_step_timeout_s

    def _run(self) -> None:
        while True:
            # Sleep until the current beat would expire (re-checked after each wake-up,
            # since beats move the expiry forward).
            remaining = self._last_beat + self._limit() - time.monotonic()
            if remaining <= 0:
                self._fire(time.monotonic() - self._last_beat)
                return
            self._wake.wait(min(remaining, 5.0) + 0.01)
            self._wake.clear()
            if self._stop.is_set():
                return

    def _fire(self, silent_s: float) -> None:
        stream = self._stream or sys.stderr
        where = f"after step {self._step}" if self._step is not None else "before the first step"
        if self._phase is not None:
            where = f"in {self._phase[0]}"
        message = (
            f"hang watchdog: no step progress for {silent_s:.1f}s {where} "
            f"(limit {self._limit():g}s); dumping all threads' stacks and "
            f"exiting with {self.exit_code} so that torchrun restarts the group\n"
        )
        try:
            stream.flush()
            fd = stream.fileno()
            os.write(fd, message.encode())
            faulthandler.dump_traceback(file=fd, all_threads=True)
        except (OSError, ValueError, AttributeError):
            # No usable stream: still exit, the exit code says why.
            pass
        os._exit(self.exit_code)
