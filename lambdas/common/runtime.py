"""The shape of every handler: configuration once per cold start, one decision per
event, malformed and foreign events dropped with a log line.

``run`` is what each function's ``handler(event, context)`` calls. The configuration is
read from the environment once per process (a cold start) and a missing variable fails
every invocation with the same one-line error, before the event is looked at. A
:class:`~ftfleet.lambdas.common.events.Dropped` becomes a ``dropped`` decision and a
normal return (retrying cannot fix it); any other exception is logged as ``error`` and
re-raised, so that the platform retries the event and finally parks it in the
function's dead-letter queue.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from ftfleet.lambdas.common.config import FunctionConfig
from ftfleet.lambdas.common.events import Dropped
from ftfleet.lambdas.common.log import DecisionLog

C = TypeVar("C", bound=FunctionConfig)
Decide = Callable[[Any, C, DecisionLog, Any], dict[str, Any]]

_configs: dict[type, FunctionConfig] = {}


def config(cls: type[C]) -> C:
    """The function's configuration, read once per process."""
    if cls not in _configs:
        _configs[cls] = cls.from_env()
    return _configs[cls]  # type: ignore[return-value]


def reset() -> None:
    """Forget cached configurations (tests change the environment between cases)."""
    _configs.clear()


def in_function_runtime() -> bool:
    """True inside AWS Lambda or Cloud Functions, where a module's import is the cold start."""
    return bool(os.environ.get("AWS_LAMBDA_FUNCTION_NAME") or os.environ.get("K_SERVICE"))


def prime(cls: type[FunctionConfig]) -> None:
    """Called at import by each handler module: inside a function runtime, a missing
    variable fails the cold start itself."""
    if in_function_runtime():
        config(cls)


def run(function: str, cls: type[C], decide: Decide, event: Any, context: Any) -> dict[str, Any]:
    cfg = config(cls)
    log = DecisionLog(
        function=function,
        stack=getattr(cfg, "stack", None),
        request_id=getattr(context, "aws_request_id", None),
    )
    try:
        return decide(event, cfg, log, context)
    except Dropped as dropped:
        return log.decision("dropped", level="WARNING", reason=dropped.reason, **dropped.fields)
    except Exception as exc:
        log.decision(
            "error",
            level="ERROR",
            error=f"{type(exc).__name__}: {exc}",
            trace=traceback.format_exc(limit=5),
        )
        raise


def remaining_s(context: Any, default: float = 900.0) -> float:
    """Seconds left in this invocation (Lambda's context), or ``default`` without one."""
    getter = getattr(context, "get_remaining_time_in_millis", None)
    return getter() / 1000.0 if callable(getter) else default


class Clock:
    """Wall time and sleep; tests substitute one that does not wait."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
