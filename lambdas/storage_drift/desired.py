"""The settings storage_drift restores, in the shapes of the S3 and FSx APIs.

Shared by the Pulumi program, which renders them from the very arguments it gives the
bucket and association resources (:func:`api_shape` turns a resource's arguments into
the API's PascalCase), and by the function, which compares what it reads
back with :func:`normalized`. No boto3 and no pulumi here.
"""

from __future__ import annotations

import json
from typing import Any

#: The events it accepts, ``(source, detail-type)``; the stack's rules match these.
S3_CALL = ("aws.s3", "AWS API Call via CloudTrail")
FSX_CALL = ("aws.fsx", "AWS API Call via CloudTrail")

#: CloudTrail event names of the calls that change a managed bucket setting. CloudTrail
#: records PutBucketLifecycleConfiguration as PutBucketLifecycle and PutPublicAccessBlock
#: as PutBucketPublicAccessBlock; both spellings are listed.
BUCKET_CALLS = {
    "PutBucketVersioning": "versioning",
    "PutBucketPublicAccessBlock": "public_access_block",
    "DeleteBucketPublicAccessBlock": "public_access_block",
    "PutPublicAccessBlock": "public_access_block",
    "DeletePublicAccessBlock": "public_access_block",
    "PutBucketPolicy": "policy",
    "DeleteBucketPolicy": "policy",
    "PutBucketEncryption": "encryption",
    "DeleteBucketEncryption": "encryption",
    "PutBucketLifecycle": "lifecycle",
    "PutBucketLifecycleConfiguration": "lifecycle",
    "DeleteBucketLifecycle": "lifecycle",
    "PutBucketReplication": "replication",
    "DeleteBucketReplication": "replication",
}
ASSOCIATION_CALLS = ("UpdateDataRepositoryAssociation", "DeleteDataRepositoryAssociation")

#: Bucket settings, in the order they are checked; each names its API calls.
ASPECTS = ("versioning", "public_access_block", "encryption", "policy", "lifecycle", "replication")

#: Keys whose API spelling is not the plain capitalisation of their parts.
_SPELLING = {
    "Id": "ID",
    "SseAlgorithm": "SSEAlgorithm",
    "KmsMasterKeyId": "KMSMasterKeyID",
    "ReplicaKmsKeyId": "ReplicaKmsKeyID",
}


#: Lists the provider takes flat that the API wraps in an object of one key.
_WRAPPED = {"BlockedEncryptionTypes": "EncryptionType"}


def _api_key(key: str) -> str:
    pascal = "".join(part[:1].upper() + part[1:] for part in key.split("_"))
    return _SPELLING.get(pascal, pascal)


def api_shape(value: Any) -> Any:
    """A Pulumi resource's arguments (camelCase inputs or snake_case outputs) in the S3/FSx
    API's PascalCase; None values are left out, as the API leaves them out."""
    if isinstance(value, dict):
        shaped = {_api_key(k): api_shape(v) for k, v in value.items() if v is not None}
        return {k: {_WRAPPED[k]: v} if k in _WRAPPED and isinstance(v, list) else v for k, v in shaped.items()}
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


def owned(got: Any, want: Any) -> Any:
    """``got`` reduced to what ``want`` declares: an object to ``want``'s keys (keys the
    stack does not declare, like the ``BlockedEncryptionTypes`` S3 reports on every new
    bucket or ``MFADelete``, are not the stack's), recursively; a list item by item
    (rules by ``ID``, others by position); anything else as it is."""
    if isinstance(want, dict) and isinstance(got, dict):
        return {k: owned(got.get(k), v) for k, v in want.items()}
    if isinstance(want, list) and isinstance(got, list):
        if want and all(isinstance(w, dict) and "ID" in w for w in want):
            by_id = {g.get("ID"): g for g in got if isinstance(g, dict)}
            extra = [g for g in got if not isinstance(g, dict) or g.get("ID") not in {w["ID"] for w in want}]
            return [owned(by_id.get(w["ID"]), w) for w in want] + extra
        return [owned(g, w) for g, w in zip(got, want, strict=False)] + got[len(want) :]
    return got


def merged(got: Any, want: Any) -> Any:
    """What to write: ``want``, keeping what ``got`` holds that ``want`` does not declare
    (so a repair never drops a setting it does not own, a block among them); lists are
    ``want``'s items, each merged with ``got``'s item of the same ``ID`` or position."""
    if isinstance(want, dict):
        base = dict(got) if isinstance(got, dict) else {}
        return {**base, **{k: merged(base.get(k), v) for k, v in want.items()}}
    if isinstance(want, list):
        olds = got if isinstance(got, list) else []
        if want and all(isinstance(w, dict) and "ID" in w for w in want):
            by_id = {g.get("ID"): g for g in olds if isinstance(g, dict)}
            return [merged(by_id.get(w["ID"]), w) for w in want]
        return [merged(olds[i] if i < len(olds) else None, w) for i, w in enumerate(want)]
    return want


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
