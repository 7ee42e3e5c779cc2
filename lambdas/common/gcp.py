"""What the GCP functions share: the Pub/Sub message, Cloud Storage, Cloud Monitoring.

* :func:`message` decodes the Pub/Sub message a function receives (a push request's
  body or a CloudEvent's data: the same object) into its JSON payload, or drops it;
* :func:`storage` is the Cloud Storage client, built on first use (never at import):
  Application Default Credentials in Cloud Functions, the emulator named by
  ``STORAGE_EMULATOR_HOST`` in tests;
* :class:`Checkpoints` lists a run's checkpoints in a bucket;
* :func:`update_json` is a read-modify-write that no concurrent writer can undo
  (generation preconditions), the counterpart of ``aws.update_json``;
* :func:`write_metrics` writes custom metrics through Cloud Monitoring's REST API
  (``projects.timeSeries.create``): the google-cloud-monitoring client would need a
  protobuf release the trainer's pins exclude. ``FTFLEET_MONITORING_ENDPOINT`` names
  another endpoint (tests), reached without credentials. Every metric a function
  writes is a :class:`Metric`, which the stack declares as a metric descriptor before
  the function or any alert policy on it exists.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from ftfleet.lambdas.common import checkpoints
from ftfleet.lambdas.common.events import Dropped, mapping

MONITORING = "https://monitoring.googleapis.com"
METRIC_PREFIX = "custom.googleapis.com/ftfleet/"

_clients: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True, slots=True)
class Metric:
    """A custom metric a function writes: the stack declares its descriptor from this
    (infra/gcp/alerts.py), and :func:`write_metrics` writes points of it, so the two
    cannot disagree on kind, value type or labels."""

    name: str
    """Below ``custom.googleapis.com/ftfleet/``."""
    unit: str
    labels: tuple[str, ...]
    description: str
    resource_type: str = "global"
    """The monitored resource every point is written against."""
    #: Every point is a gauge reading of a double (:func:`write_metrics`).
    KIND: ClassVar[str] = "GAUGE"
    VALUE_TYPE: ClassVar[str] = "DOUBLE"

    @property
    def type(self) -> str:
        return METRIC_PREFIX + self.name


class ConflictLimit(RuntimeError):
    """Conditional writes kept losing to concurrent writers: retried by Pub/Sub."""


def message(event: Any) -> tuple[Any, dict[str, str]]:
    """(payload, attributes) of the Pub/Sub message in ``event`` (``{"data": body}`` or a
    CloudEvent); a malformed one is :class:`Dropped`."""
    data = event.get("data") if isinstance(event, Mapping) else getattr(event, "data", None)
    body = mapping(data, "event.data")
    msg = mapping(body.get("message"), "event.data.message")
    raw = msg.get("data")
    if not isinstance(raw, str) or not raw:
        raise Dropped("malformed event: event.data.message.data is missing or not base64 text")
    try:
        payload = json.loads(base64.b64decode(raw, validate=True))
    except (binascii.Error, ValueError, RecursionError):
        raise Dropped("malformed event: event.data.message.data is not base64-encoded JSON") from None
    attributes = msg.get("attributes") or {}
    return payload, dict(attributes) if isinstance(attributes, Mapping) else {}


def storage() -> Any:
    if "storage" not in _clients:
        from google.cloud import storage as gcs

        _clients["storage"] = gcs.Client()
    return _clients["storage"]


def reset() -> None:
    """Forget clients (tests change the environment between cases)."""
    _clients.clear()


class Checkpoints(checkpoints.CheckpointListing):
    """A run's checkpoints in one Cloud Storage bucket."""

    def __init__(self, name: str, root: str):
        super().__init__(name, root)
        self.bucket = storage().bucket(name)

    def child_prefixes(self, prefix: str) -> list[str]:
        pages = storage().list_blobs(self.name, prefix=prefix, delimiter="/")
        for _ in pages:  # the prefixes are known once the pages are read
            pass
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in pages.prefixes]

    def arrival(self, key: str) -> float | None:
        blob = self.bucket.get_blob(key)
        return blob.time_created.timestamp() if blob is not None and blob.time_created else None

    def read(self, key: str) -> bytes:
        return self.bucket.blob(key).download_as_bytes()

    def sizes(self, prefix: str) -> dict[str, int]:
        return {b.name[len(prefix) :]: int(b.size or 0) for b in storage().list_blobs(self.name, prefix=prefix)}


def read_json(bucket: str, key: str) -> tuple[Any, int]:
    """(document, generation) of a JSON object; (None, 0) when it does not exist, and
    ``"<not JSON>"`` for an object that does not parse."""
    from google.api_core import exceptions

    blob = storage().bucket(bucket).blob(key)
    try:
        data = blob.download_as_bytes()
    except exceptions.NotFound:
        return None, 0
    try:
        return json.loads(data), int(blob.generation or 0)
    except (ValueError, RecursionError):
        return "<not JSON>", int(blob.generation or 0)


def update_json(
    bucket: str, key: str, change: Callable[[Any], tuple[Any, bool]], attempts: int = 8
) -> tuple[Any, bool]:
    """``change(document_or_None) -> (new, changed)``; a changed document is written only
    if the object is still the generation read (0: it must not exist yet), else the whole
    cycle repeats. Returns the final document and whether this call changed it."""
    from google.api_core import exceptions

    for _ in range(attempts):
        current, generation = read_json(bucket, key)
        new, changed = change(current)
        if not changed:
            return new, False
        blob = storage().bucket(bucket).blob(key)
        try:
            blob.upload_from_string(
                json.dumps(new, sort_keys=True),
                content_type="application/json",
                if_generation_match=generation,
                checksum="crc32c",
            )
        except exceptions.PreconditionFailed:
            continue
        return new, True
    raise ConflictLimit(f"gs://{bucket}/{key}: {attempts} conditional writes in a row lost the race")


def _session() -> Any:
    if "monitoring" not in _clients:
        endpoint = os.environ.get("FTFLEET_MONITORING_ENDPOINT", MONITORING).rstrip("/")
        if endpoint == MONITORING:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/monitoring.write"])
            session = AuthorizedSession(credentials)
        else:
            import requests

            session = requests.Session()
        _clients["monitoring"] = (endpoint, session)
    return _clients["monitoring"]


def write_metrics(project: str, points: Iterable[tuple[Metric, float, Mapping[str, str]]]) -> None:
    """One point per ``(metric, value, labels)`` now, on the metric's monitored resource.
    The labels must be exactly the metric's: Cloud Monitoring rejects a point whose
    labels its descriptor does not declare."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    series = []
    for metric, value, labels in points:
        if set(labels) != set(metric.labels):
            raise ValueError(f"{metric.name}: labels {sorted(labels)} are not its declared {sorted(metric.labels)}")
        series.append(
            {
                "metric": {"type": metric.type, "labels": dict(labels)},
                "resource": {"type": metric.resource_type, "labels": {"project_id": project}},
                "metricKind": metric.KIND,
                "valueType": metric.VALUE_TYPE,
                "points": [{"interval": {"endTime": now}, "value": {"doubleValue": float(value)}}],
            }
        )
    endpoint, session = _session()
    for start in range(0, len(series), 200):  # the API takes at most 200 series per call
        response = session.post(
            f"{endpoint}/v3/projects/{project}/timeSeries", json={"timeSeries": series[start : start + 200]}, timeout=30
        )
        response.raise_for_status()
