"""Storage drift: someone changed a managed bucket's settings or IAM policy.

The stack's log sink routes the bucket's Admin Activity audit entries
(``storage.buckets.update``, ``storage.setIamPermissions``) to the function's topic.
The function compares the bucket with what the program rendered (``FTFLEET_DESIRED``:
versioning, uniform bucket-level access, public access prevention, the soft-delete
window) and with one rule for its IAM policy (no binding names ``allUsers`` or
``allAuthenticatedUsers``), restores what differs, reads the bucket back to verify,
and logs what it found and what it wrote. An entry that changed nothing it watches is
an ``in-sync`` decision: the function's own repairs come back as audit entries too,
and end there.

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
    drift = settings_drift(bucket, cfg.desired)
    if drift:
        apply_settings(bucket, cfg.desired)
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
    still = set(settings_drift(check, cfg.desired)) | {
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
        settings={k: {"found": v, "restored": cfg.desired[k]} for k, v in drift.items()},
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
