"""A heartbeat loop that cannot outlive the wait it belongs to.

aws-node-termination-handler once leaked heartbeat goroutines when a drain failed
(#493, fixed in PR #1173): the loop kept extending lifecycle actions nobody waited for.
Here the loop is a context manager: whatever ends the ``with`` block (the wait is over,
it raised, it was cancelled) sets the stop event and joins the thread before the block
is left. A beat that reports the action gone (:class:`Gone`) also stops the loop, and
the waiter sees ``gone``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Gone(Exception):
    """Raised by a beat when the thing it keeps alive no longer exists."""


class Heartbeat:
    """Calls ``beat()`` every ``interval_s`` seconds while the ``with`` block runs."""

    def __init__(
        self,
        beat: Callable[[], Any],
        interval_s: float,
        on_error: Callable[[Exception], None] | None = None,
        name: str = "ftfleet-heartbeat",
    ):
        self._beat = beat
        self._interval_s = interval_s
        self._on_error = on_error
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.beats = 0
        self.failures = 0
        self.gone = threading.Event()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._beat()
                self.beats += 1
            except Gone:
                self.gone.set()
                return
            except Exception as exc:  # noqa: BLE001 - one failed beat must not end the wait
                self.failures += 1
                if self._on_error is not None:
                    self._on_error(exc)

    def __enter__(self) -> Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()
