"""A Pub/Sub push request into a handler, and the answer that tells Pub/Sub what to do.

The GCP functions are HTTP functions behind a push subscription (not Eventarc triggers):
the stack owns the subscription, so it sets the retry backoff and the dead-letter topic
that an Eventarc-created subscription would not have. Pub/Sub acknowledges a message on
a 2xx answer and redelivers it on anything else, until the subscription's maximum
delivery attempts move it to the dead-letter topic
(https://cloud.google.com/pubsub/docs/push#receive_push).

The body of a push request, ``{"message": {...}, "subscription": "..."}``, is the same
object a Pub/Sub CloudEvent carries as its data, so handlers take ``{"data": body}``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Acknowledged: handled, or dropped because retrying cannot help (logged by the handler).
ACK = ("", 204)


def serve(handler: Callable[[Any], Any], request: Any) -> tuple[str, int]:
    """Run ``handler`` on the push request's body. An exception propagates: the
    framework answers 500 and Pub/Sub redelivers the message with backoff."""
    body = request.get_json(silent=True)
    handler({"data": body})
    return ACK
