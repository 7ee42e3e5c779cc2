"""What storage_drift restores, rendered from the same arguments the program gives the
bucket and association resources, in the API shapes the function writes back."""

from __future__ import annotations

import json
from typing import Any

import pulumi._types as pulumi_types

from ftfleet.infra.aws.bucket import SSE_C, lifecycle_rules, tls_only_policy
from ftfleet.infra.settings import BucketSettings
from ftfleet.lambdas.storage_drift.desired import api_shape

PUBLIC_ACCESS_BLOCKED = {
    "BlockPublicAcls": True,
    "IgnorePublicAcls": True,
    "BlockPublicPolicy": True,
    "RestrictPublicBuckets": True,
}


def plain(value: Any) -> Any:
    """Pulumi input or output types as plain dicts (snake_case keys, None left out)."""
    if pulumi_types.is_input_type(type(value)):
        return {k: plain(v) for k, v in vars(value).items() if v is not None}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def bucket(region: str, bucket_arn: str, key_arn: str, b: BucketSettings) -> dict[str, Any]:
    """The settings of one checkpoint bucket, as infra/aws/bucket.py declares them."""
    return {
        "region": region,
        "versioning": {"Status": "Enabled"},
        "public_access_block": dict(PUBLIC_ACCESS_BLOCKED),
        "encryption": {
            "Rules": [
                {
                    "ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": key_arn},
                    "BucketKeyEnabled": True,
                    "BlockedEncryptionTypes": {"EncryptionType": [SSE_C]},
                }
            ]
        },
        "policy": json.loads(tls_only_policy(bucket_arn)),
        "lifecycle": {"Rules": api_shape(plain(lifecycle_rules(b)))},
    }


def replication(role_arn: str, rules: list[Any]) -> dict[str, Any]:
    """The primary bucket's replication, from the resource's role and rules."""
    shaped = api_shape(plain(list(rules)))
    for rule in shaped:
        # The deprecated rule-level prefix cannot travel with a Filter.
        if "Filter" in rule:
            rule.pop("Prefix", None)
    return {"Role": role_arn, "Rules": shaped}


def association(
    association_id: str, file_system_id: str, file_system_path: str, repository_path: str, batch_import: bool, s3: Any
) -> dict[str, Any]:
    return {
        "id": association_id,
        "file_system_id": file_system_id,
        "file_system_path": file_system_path,
        "data_repository_path": repository_path,
        "batch_import_meta_data_on_create": bool(batch_import),
        "s3": api_shape(plain(s3)),
    }
