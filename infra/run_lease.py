"""Whether a stack's run trains elsewhere, from the run lease's bytes as a program reads
them at `pulumi up` (infra/aws/run_location.py, infra/gcp/run_location.py)."""

from __future__ import annotations

import base64
import binascii
import json


def other_holder(body_base64: str | None, holder: str, now: float) -> str:
    """The lease's holder when it is not ``holder`` and is current at ``now``; '' when
    the run may train here (no lease, this holder's, run out, released, unreadable)."""
    try:
        doc = json.loads(base64.b64decode(body_base64 or "", validate=True))
        named, expires = str(doc["holder"]), float(doc["expires_at"])
    except (ValueError, TypeError, KeyError, binascii.Error):
        return ""
    return named if named != holder and expires > now else ""


def held_line(elsewhere: str, what: str, stack: str) -> str:
    """A home's ``fleet_status`` while the run trains with ``elsewhere`` (a lease holder,
    ``<stack>/<region>``): ``what`` is held at 0 nodes, and the command that brings the
    run back to ``stack``."""
    other = elsewhere.split("/")[0]
    return (
        f"{what} held at 0 nodes: the run trains with {elsewhere} (its run lease) since a failover; "
        f"`ftfleet failover {other} --to {stack}` brings it back"
    )
