"""The settings storage_drift restores, in the shapes of the S3 and FSx APIs.

Shared by the Pulumi program, which renders them from the very arguments it gives the
bucket and association resources (:func:`api_shape` turns a resource's camelCase
inputs into the API's PascalCase), and by the function, which compares what it reads
back with :func:`normalized`. No boto3 and no pulumi here.
"""

from __future__ import annotations

import json
from typing import Any

#: Bucket settings, in the order they are checked; each names its API calls.
ASPECTS = ("versioning", "public_access_block", "encryption", "policy", "lifecycle", "replication")

#: camelCase keys whose API spelling is not the plain capitalisation.
_SPELLING = {
    "id": "ID",
    "sseAlgorithm": "SSEAlgorithm",
    "kmsMasterKeyId": "KMSMasterKeyID",
    "replicaKmsKeyId": "ReplicaKmsKeyID",
}


def api_shape(value: Any) -> Any:
    """A Pulumi resource's camelCase inputs in the S3/FSx API's PascalCase."""
    if isinstance(value, dict):
        return {_SPELLING.get(k, k[:1].upper() + k[1:]): api_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [api_shape(v) for v in value]
    return value


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == {} or value == []


def normalized(value: Any) -> Any:
    """``value`` without the empty defaults AWS adds or drops (``Filter: {"Prefix": ""}``,
    absent lists), with rule lists sorted by ID and string lists sorted, so that what
    was written and what is read back compare equal."""
    if isinstance(value, dict):
        out = {k: normalized(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if not _empty(v)}
    if isinstance(value, list):
        items = [normalized(v) for v in value]
        items = [v for v in items if not _empty(v)]
        if items and all(isinstance(v, dict) and "ID" in v for v in items):
            return sorted(items, key=lambda v: str(v["ID"]))
        if all(isinstance(v, str) for v in items):
            return sorted(items)
        return items
    return value


def policy_normalized(policy: Any) -> Any:
    """A bucket policy compared as data: JSON parsed, single values as lists."""
    if isinstance(policy, str):
        policy = json.loads(policy)
    if not isinstance(policy, dict):
        return policy
    statements = policy.get("Statement", [])
    statements = statements if isinstance(statements, list) else [statements]
    fixed = []
    for s in statements:
        s = dict(s)
        for key in ("Action", "NotAction", "Resource", "NotResource"):
            if isinstance(s.get(key), str):
                s[key] = [s[key]]
        fixed.append(s)
    return normalized({**policy, "Statement": fixed})
