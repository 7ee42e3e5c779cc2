"""The neutral view of a declared resource that the policies read, and their helpers.

The tests build it from a recording under mocks (infra/offline.py), the CrossGuard
pack from what `pulumi preview` hands it (infra/crossguard.py). Values unknown at
preview time (not yet a str/number) are skipped by every policy, never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

WORLD = ("0.0.0.0/0", "::/0")
FSX_THROUGHPUTS = (125, 250, 500, 1000)


@dataclass
class Res:
    type: str
    name: str
    urn: str
    props: dict[str, Any]
    region: str | None = None
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)
    """Top-level property -> URNs of the resources its value came from."""
    dependencies: list[str] = field(default_factory=list)
    """URNs of everything the resource waits for (depends_on and its inputs)."""
    protect: bool = False
    id: str | None = None
    """The provider's id where known (a recording; not at preview)."""
    ignore_changes: list[str] = field(default_factory=list)
    """Properties an update leaves as they are (the `ignore_changes` option)."""

    def deps(self, prop: str) -> list[str]:
        return self.property_dependencies.get(prop, [])


@dataclass(frozen=True)
class Policy:
    name: str
    description: str
    check: Callable
    stack: bool = False
    """Stack policies see every resource; resource policies one at a time."""
    advisory: bool = False


def statements(doc: Any) -> list[dict]:
    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except json.JSONDecodeError:
            return []
    if not isinstance(doc, dict):
        return []
    st = doc.get("Statement", [])
    return [s for s in (st if isinstance(st, list) else [st]) if isinstance(s, dict)]


def as_list(v: Any) -> list:
    return v if isinstance(v, list) else [v]


def role(r: Res) -> str | None:
    for tag in r.props.get("tags") or []:
        if isinstance(tag, dict) and tag.get("key") == "ftfleet:role":
            return tag.get("value")
    return None


def of_type(resources: Iterable[Res], *types: str) -> list[Res]:
    return [r for r in resources if r.type in types]


def linked(r: Res, prop: str, by_urn: dict[str, Res], *types: str) -> list[Res]:
    """The resources of the given types that the value of ``prop`` came from."""
    return [by_urn[u] for u in r.deps(prop) if u in by_urn and by_urn[u].type in types]
