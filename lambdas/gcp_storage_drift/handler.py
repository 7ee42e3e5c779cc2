"""Storage drift: someone changed a managed bucket's settings or IAM policy.

The stack's log sink routes the bucket's Admin Activity audit entries
(``storage.buckets.update``, ``storage.setIamPermissions``) to the function's topic.
The function compares the bucket with the stack's declared settings (versioning,
uniform bucket-level access, public access prevention, the soft-delete window), read
at every event from the document at ``FTFLEET_DESIRED_URI``, which the stack writes
before it changes the bucket: a change the stack makes is already desired when its
audit entry arrives, and is never undone as drift. It also holds the bucket's IAM
policy to one rule (no binding names ``allUsers`` or ``allAuthenticatedUsers``),
restores what differs, reads the bucket back to verify, and logs what it found and
what it wrote. An entry that changed nothing it watches is an ``in-sync`` decision:
the function's own repairs come back as audit entries too, and end there. Without a
readable desired state it repairs nothing and fails, so that Pub/Sub redelivers.

It never deletes objects or buckets, never loosens a setting and never touches a bucket
it was not given.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ftfleet.lambdas.common import events, gcp, runtime
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.gcp_storage_drift.config import WATCHED_METHODS, Config

NAME = "gcp_storage_drift"
RESOURCE = re.compile(r"projects/_/buckets/(?P<bucket>[a-z0-9][a-z0-9._-]{1,220})")
PUBLIC = ("allUsers", "allAuthenticatedUsers")


class DriftNotRepaired(RuntimeError):
    """The bucket still differs after the repair: raised so that Pub/Sub redelivers."""


class DesiredStateUnknown(RuntimeError):
    """The desired-state document is missing or malformed: nothing is repaired, and
    Pub/Sub redelivers (a stack mid-update writes it before the bucket changes)."""


SETTINGS = ("versioning", "uniform_bucket_level_access", "public_access_prevention", "soft_delete_seconds")


def desired_state(uri: str) -> dict[str, Any]:
    """The settings the stack declares now, from ``gs://<bucket>/<key>``."""
    bucket, _, key = uri.removeprefix("gs://").partition("/")
    document, _ = gcp.read_json(bucket, key)
    if document is None:
        raise DesiredStateUnknown(f"{uri} does not exist")
    if not isinstance(document, dict) or set(document) - set(SETTINGS) or not document:
        raise DesiredStateUnknown(f"{uri} is not a settings document (keys among {', '.join(SETTINGS)})")
    return document


def handler(cloud_event: Any, context: Any = None) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, cloud_event, context)


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    entry, _ = gcp.message(event)
    entry = events.mapping(entry, "log entry")
    payload = events.mapping(entry.get("protoPayload"), "log entry.protoPayload")
    method = events.text(payload, "methodName", "protoPayload")
    if method not in WATCHED_METHODS:
        raise events.Dropped(f"not a watched call: methodName {method[:80]!r}")
    resource = events.text(payload, "resourceName", "protoPayload")
    found = RESOURCE.fullmatch(resource)
    if not found:
        raise events.Dropped(f"malformed event: protoPayload.resourceName {resource[:120]!r} names no bucket")
    name = found["bucket"]
    if name not in cfg.buckets:
        raise events.Dropped("bucket of another stack", bucket=name)
    auth = payload.get("authenticationInfo")
    caller = auth.get("principalEmail") if isinstance(auth, Mapping) else None

    bucket = gcp.storage().bucket(name)
    bucket.reload()
    # Read after the bucket: the stack writes the document before it changes the bucket,
    # so a bucket state seen here is never newer than the desired state read next.
    desired = desired_state(cfg.desired_uri)
    drift = settings_drift(bucket, desired)
    if drift:
        apply_settings(bucket, desired)
        bucket.patch()
    policy = bucket.get_iam_policy(requested_policy_version=3)
    public = public_members(policy)
    if public:
        remove_members(policy, PUBLIC)
        bucket.set_iam_policy(policy)
    if not drift and not public:
        return log.decision("in-sync", bucket=name, method=method, caller=caller)
    # Read back: a repair that did not take is an error, retried by Pub/Sub.
    check = gcp.storage().bucket(name)
    check.reload()
    still = set(settings_drift(check, desired)) | {
        f"iam:{m}" for m in public_members(check.get_iam_policy(requested_policy_version=3))
    }
    if still:
        raise DriftNotRepaired(f"gs://{name} still differs after the repair: {', '.join(sorted(still))}")
    return log.decision(
        "restored",
        level="WARNING",
        bucket=name,
        method=method,
        caller=caller,
        settings={k: {"found": v, "restored": desired[k]} for k, v in drift.items()},
        removed_members=sorted(public),
    )


def current_settings(bucket: Any) -> dict[str, Any]:
    soft = getattr(bucket, "soft_delete_policy", None)
    return {
        "versioning": bool(bucket.versioning_enabled),
        "uniform_bucket_level_access": bool(bucket.iam_configuration.uniform_bucket_level_access_enabled),
        "public_access_prevention": bucket.iam_configuration.public_access_prevention,
        "soft_delete_seconds": getattr(soft, "retention_duration_seconds", None),
    }


def settings_drift(bucket: Any, desired: dict[str, Any]) -> dict[str, Any]:
    """Setting -> what the bucket has, for each desired setting it does not have."""
    have = current_settings(bucket)
    return {k: have.get(k) for k, want in desired.items() if k in have and have.get(k) != want}


def apply_settings(bucket: Any, desired: dict[str, Any]) -> None:
    if "versioning" in desired:
        bucket.versioning_enabled = bool(desired["versioning"])
    if "uniform_bucket_level_access" in desired:
        bucket.iam_configuration.uniform_bucket_level_access_enabled = bool(desired["uniform_bucket_level_access"])
    if "public_access_prevention" in desired:
        bucket.iam_configuration.public_access_prevention = desired["public_access_prevention"]
    if desired.get("soft_delete_seconds") is not None:
        bucket.soft_delete_policy.retention_duration_seconds = int(desired["soft_delete_seconds"])


def public_members(policy: Any) -> set[str]:
    return {m for b in policy.bindings for m in b.get("members", ()) if m in PUBLIC}


def remove_members(policy: Any, members: tuple[str, ...]) -> None:
    kept = []
    for binding in policy.bindings:
        rest = {m for m in binding.get("members", ()) if m not in members}
        if rest:
            kept.append({**binding, "members": rest})
    policy.bindings = kept


runtime.prime(Config)
