"""Validation of untrusted event payloads.

An event that does not have the shape a function expects is *dropped*: logged with the
reason and acknowledged, never retried (a retry cannot fix it) and never a crash. Every
check raises :class:`Dropped` with one line naming the field.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any


class Dropped(Exception):
    """The event is malformed, foreign or irrelevant: log it and acknowledge it."""

    def __init__(self, reason: str, **fields: Any):
        super().__init__(reason)
        self.reason = reason
        self.fields = fields


def mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise Dropped(f"malformed event: {where} is {type(value).__name__}, not an object")
    return value


def text(obj: Mapping[str, Any], key: str, where: str, pattern: str | None = None) -> str:
    """``obj[key]`` as a non-empty string (matching ``pattern`` if given)."""
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        got = "missing" if value is None else f"{type(value).__name__} {value!r}"[:80]
        raise Dropped(f"malformed event: {where}.{key} is {got}, not a non-empty string")
    if pattern is not None and not re.fullmatch(pattern, value):
        raise Dropped(f"malformed event: {where}.{key}={value[:80]!r} does not look like {pattern}")
    return value


def timestamp(obj: Mapping[str, Any], key: str, where: str) -> float:
    """``obj[key]`` as an ISO 8601 UTC time (``2021-01-13T00:12:37Z``, fractions allowed),
    returned as epoch seconds."""
    raw = text(obj, key, where)
    try:
        parsed = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise Dropped(f"malformed event: {where}.{key}={raw[:40]!r} is not an ISO 8601 time") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


def iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
