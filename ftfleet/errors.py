"""Errors that reach a user as one line and an exit code, never as a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input the user can fix. ``str(exc)`` names what to change."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(UserError):
    """A configuration value is invalid; the message names the key and the fix."""


def interrupt_in(exc: BaseException, rank: int | None = None) -> BaseException | None:
    """A BaseException that is not an Exception (KeyboardInterrupt, SystemExit, an
    in-process restart's asynchronous ``RankShouldRestart``) that ``exc`` stands for or
    hid; None if there is none. Such an exception must go on, not be handled as ``exc``:

    * a handler that raised ``exc`` while one was in flight keeps it in ``__context__``;
    * torch.distributed.checkpoint wraps whatever its collective steps raise, a
      BaseException too, into a CheckpointException (``failures``: rank -> (exception,
      traceback)); with ``rank``, this rank's entry is looked into (another rank's
      interrupt is that rank's to handle)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):  # a CheckpointException (itself a BaseException): what it wraps
            own = failures.get(rank) if rank is not None else None
            if isinstance(own, tuple) and own and isinstance(own[0], BaseException):
                todo.append(own[0])
        elif not isinstance(e, Exception):
            return e
        todo += [e.__cause__, e.__context__]
    return None


def require_positive(key: str, value: int) -> None:
    """Raise ConfigError naming ``key`` unless ``value`` is a positive integer."""
    if value <= 0:
        raise ConfigError(f"{key}={value}: use a positive integer")
