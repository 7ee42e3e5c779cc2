"""A function's configuration: environment variables, declared once, checked at cold start.

Each function declares a frozen dataclass whose fields name their variable with
:func:`var`. The Pulumi program builds the same dataclass from the stack's values and
renders it with :meth:`FunctionConfig.to_env`; the function reads it back with
:meth:`FunctionConfig.from_env`, which names the first missing or malformed variable in
one line instead of failing with a ``KeyError`` in the middle of an event.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any, Self

from ftfleet import retention
from ftfleet.errors import ConfigError

_META = "ftfleet.env"


class FunctionConfigError(ConfigError):
    """The function's environment is missing a variable or holds a bad value."""


@dataclasses.dataclass(frozen=True, slots=True)
class Codec:
    """How a value travels through an environment variable."""

    parse: Callable[[str], Any]
    render: Callable[[Any], str]
    what: str


def _text(raw: str) -> str:
    if not raw.strip():
        raise ValueError("empty")
    return raw.strip()


def _names(raw: str) -> tuple[str, ...]:
    value = json.loads(raw)
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ValueError("not a non-empty JSON list of names")
    return tuple(value)


def _seconds(raw: str) -> float:
    value = float(raw)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError("not a positive number of seconds")
    return value


def _count(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError("not a whole number >= 1")
    return value


def _document(raw: str) -> dict[str, Any]:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


TEXT = Codec(_text, str, "a non-empty string")
NAMES = Codec(_names, lambda v: json.dumps(list(v)), "a JSON list of names")
SECONDS = Codec(_seconds, lambda v: f"{v:g}", "a positive number of seconds")


def _pair(raw: str) -> Any:
    from ftfleet.lambdas.common.pair import Pair

    return Pair.of(json.loads(raw))


#: A standby's home and lease (lambdas/common/pair.py); rendered empty (no failover)
#: for every other stack.
PAIR = Codec(
    _pair,
    lambda v: "" if v is None else json.dumps(v.to_json(), sort_keys=True, separators=(",", ":")),
    "a JSON object naming the home, the standby and the run lease",
)
COUNT = Codec(_count, str, "a whole number >= 1")
DOCUMENT = Codec(_document, lambda v: json.dumps(v, sort_keys=True, separators=(",", ":")), "a JSON object")


def _rules(raw: str) -> tuple[str, ...]:
    value = json.loads(raw)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("not a JSON list of strings")
    try:
        retention.parse_schedule(value, key="rule")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    return tuple(value)


#: A schedule (ftfleet/retention.py); an empty list is one (the newest, pinned steps and
#: milestones only), which NAMES would refuse.
RULES = Codec(_rules, lambda v: json.dumps(list(v)), "a JSON list of retention rules")


def var(name: str, doc: str, codec: Codec = TEXT, default: Any = dataclasses.MISSING) -> Any:
    """A config field read from environment variable ``name``."""
    return dataclasses.field(default=default, metadata={_META: (name, doc, codec)})


def _vars(cls: type) -> list[tuple[dataclasses.Field, str, str, Codec]]:
    return [(f, *f.metadata[_META]) for f in dataclasses.fields(cls) if _META in f.metadata]


class FunctionConfig:
    """Base of every function's config dataclass (fields declared with :func:`var`)."""

    @classmethod
    def env_names(cls) -> list[str]:
        return [name for _, name, _, _ in _vars(cls)]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f, name, doc, codec in _vars(cls):
            raw = environ.get(name)
            if raw is None or not raw.strip():
                if f.default is not dataclasses.MISSING:
                    continue
                raise FunctionConfigError(
                    f"{name} is not set: {doc} (the stack's Pulumi program renders it; run `pulumi up`)"
                )
            try:
                values[f.name] = codec.parse(raw)
            except (ValueError, TypeError) as exc:
                raise FunctionConfigError(f"{name}={raw[:80]!r} is not {codec.what} ({exc})") from None
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        """Checks beyond one variable's value (a function overrides it); raises
        FunctionConfigError."""

    def to_env(self) -> dict[str, str]:
        return {name: codec.render(getattr(self, f.name)) for f, name, _, codec in _vars(type(self))}


@dataclasses.dataclass(frozen=True, kw_only=True)
class StackConfig(FunctionConfig):
    """What every function knows about its stack."""

    stack: str = var("FTFLEET_STACK", "the Pulumi stack whose resources this function serves")
    run_id: str = var("FTFLEET_RUN_ID", "the training run of the stack (FTFLEET_RUN_ID of its nodes)")
