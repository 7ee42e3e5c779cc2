"""The EventBridge envelope around every AWS event a function receives.

No boto3 here; only the shape of
https://docs.aws.amazon.com/eventbridge/latest/ref/overiew-event-structure.html
(``id``, ``source``, ``detail-type``, ``time``, ``region``, ``account``, ``resources``,
``detail``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ftfleet.lambdas.common import events
from ftfleet.lambdas.common.events import Dropped

INSTANCE_ID = r"i-[0-9a-f]{8,17}"
SCHEDULED = ("aws.events", "Scheduled Event")


@dataclasses.dataclass(frozen=True, slots=True)
class Envelope:
    id: str
    source: str
    detail_type: str
    time: float
    """Epoch seconds of the event."""
    region: str
    account: str
    detail: Mapping[str, Any]


def parse(event: Any, accepted: tuple[tuple[str, str], ...]) -> Envelope:
    """The envelope of ``event``, which must be one of ``accepted`` ``(source,
    detail-type)`` pairs; anything else raises :class:`Dropped`."""
    if not event:
        raise Dropped("malformed event: empty body")
    body = events.mapping(event, "event")
    source = events.text(body, "source", "event")
    detail_type = events.text(body, "detail-type", "event")
    if (source, detail_type) not in accepted:
        raise Dropped(f"unexpected event: {source} / {detail_type!r}", source=source, detail_type=detail_type)
    return Envelope(
        id=events.text(body, "id", "event"),
        source=source,
        detail_type=detail_type,
        time=events.timestamp(body, "time", "event"),
        region=events.text(body, "region", "event"),
        account=events.text(body, "account", "event"),
        detail=events.mapping(body.get("detail", {}), "event.detail"),
    )
