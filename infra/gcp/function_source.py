"""FunctionSource: the bucket of the remediation functions' sources, and the storage
drift function's desired-state document.

The bucket holds the functions' source zips (infra/gcp/function_package.py) and
``desired/<stack>.json``: the checkpoint bucket's settings as the stack declares them
(infra/gcp/functions.py, desired_bucket_settings), which the storage-drift function
reads at every event. The stack declares the checkpoint bucket after this document, so
a `pulumi up` that changes a setting updates the document first: by the time the
bucket's audit entry reaches the function, the change is the desired state, and a
change the stack itself makes is never undone as drift.

Declared before the checkpoint bucket (infra/gcp/stack.py); only when some remediation
function is switched on.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_gcp as gcp

from ftfleet.infra.gcp.settings import GcpSettings

#: Label of the functions' source bucket: infra/gcp/policies.py holds checkpoint buckets,
#: not this one, to their dual-region and protection rules.
SOURCE_PURPOSE = {"ftfleet-purpose": "function-source"}
DESIRED_PREFIX = "desired/"


def desired_bucket_settings(s: GcpSettings) -> dict:
    """What the storage-drift function restores: the settings infra/gcp/bucket.py renders."""
    return {
        "versioning": True,
        "uniform_bucket_level_access": True,
        "public_access_prevention": "enforced",
        "soft_delete_seconds": s.buckets.soft_delete_days * 24 * 3600,
    }


class FunctionSource(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        s: GcpSettings,
        provider: gcp.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:gcp:FunctionSource", name, None, opts)
        o = pulumi.ResourceOptions(parent=self, provider=provider)
        self.bucket = gcp.storage.Bucket(
            f"{name}-bucket",
            location=s.region,
            storage_class="STANDARD",
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            versioning=gcp.storage.BucketVersioningArgs(enabled=True),
            soft_delete_policy=gcp.storage.BucketSoftDeletePolicyArgs(retention_duration_seconds=0),
            lifecycle_rules=[
                gcp.storage.BucketLifecycleRuleArgs(
                    action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                    condition=gcp.storage.BucketLifecycleRuleConditionArgs(
                        days_since_noncurrent_time=7, matches_prefixes=["functions/"], with_state="ARCHIVED"
                    ),
                )
            ],
            labels=SOURCE_PURPOSE,
            force_destroy=True,
            opts=o,
        )
        self.desired: gcp.storage.BucketObject | None = None
        self.desired_uri: pulumi.Output[str] | None = None
        if s.remediation.storage_drift:
            key = f"{DESIRED_PREFIX}{s.stack}.json"
            self.desired = gcp.storage.BucketObject(
                f"{name}-desired",
                bucket=self.bucket.name,
                name=key,
                # An asset, not `content` (which the provider keeps secret): the plan shows it.
                source=pulumi.StringAsset(json.dumps(desired_bucket_settings(s), sort_keys=True)),
                content_type="application/json",
                opts=o,
            )
            self.desired_uri = pulumi.Output.concat("gs://", self.bucket.name, "/", key)
        self.register_outputs({"bucket": self.bucket.name})
