"""ReplicatedBucket: the durable checkpoint tier, one dual-region bucket.

GCP replicates inside one bucket: a dual-region bucket stores every object in both of
its regions and serves it from either, so there is no second bucket and no replication
rule to keep in step (the AWS stack's replica bucket). Turbo replication (RPO
ASYNC_TURBO) targets 15 minutes for a new object to reach the second region. The
bucket is versioned, keeps deleted objects for the soft-delete window, allows uniform
bucket-level access only, enforces public access prevention and, with gcsCmek, uses
the stack's Cloud KMS key. Only checkpointPrefix ages: no lifecycle rule names
pinnedPrefix, so pinned objects are never moved or deleted, current or noncurrent.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from ftfleet import contract
from ftfleet.infra.gcp.settings import GcpSettings
from ftfleet.infra.gcp.storage_settings import GcsBucketSettings

st = gcp.storage
#: Incomplete multipart uploads (the trainer's large shards) are aborted after this.
ABORT_UPLOADS_DAYS = 2
DAY = 24 * 3600


def lifecycle_rules(b: GcsBucketSettings) -> list[st.BucketLifecycleRuleArgs]:
    ckpt = [b.checkpoint_prefix]

    def rule(action: dict, **condition) -> st.BucketLifecycleRuleArgs:
        return st.BucketLifecycleRuleArgs(
            action=st.BucketLifecycleRuleActionArgs(**action),
            condition=st.BucketLifecycleRuleConditionArgs(**condition),
        )

    rules = [rule({"type": "AbortIncompleteMultipartUpload"}, age=ABORT_UPLOADS_DAYS)]
    colder = ((b.nearline_days, "NEARLINE", ["STANDARD"]), (b.coldline_days, "COLDLINE", ["STANDARD", "NEARLINE"]))
    for days, storage_class, source in colder:
        if days:
            rules.append(
                rule(
                    {"type": "SetStorageClass", "storage_class": storage_class},
                    age=days,
                    matches_prefixes=ckpt,
                    matches_storage_classes=source,
                    with_state="ANY",
                )
            )
    rules.append(
        rule(
            {"type": "Delete"},
            days_since_noncurrent_time=b.noncurrent_version_expiry_days,
            matches_prefixes=ckpt,
            with_state="ARCHIVED",
        )
    )
    # The run lease is rewritten every quarter of its TTL: its old versions go after a day.
    rules.append(
        rule(
            {"type": "Delete"},
            days_since_noncurrent_time=1,
            matches_prefixes=[contract.LEASE_PREFIX],
            with_state="ARCHIVED",
        )
    )
    if b.expire_checkpoints_days:
        rules.append(rule({"type": "Delete"}, age=b.expire_checkpoints_days, matches_prefixes=ckpt, with_state="LIVE"))
    return rules


class ReplicatedBucket(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: GcpSettings,
        provider: gcp.Provider,
        kms_key: pulumi.Input[str] | None = None,
        after: list[pulumi.Resource] | None = None,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """``after``: what must exist before the bucket is created or changed (the key's
        grant to the Cloud Storage agent; the drift function's desired state)."""
        super().__init__("ftfleet:gcp:ReplicatedBucket", name, None, opts)
        b = settings.buckets
        o = pulumi.ResourceOptions(parent=self, provider=provider, protect=True, depends_on=list(after or []) or None)
        self.bucket = st.Bucket(
            f"{name}-bucket",
            location=b.location,
            custom_placement_config=(
                st.BucketCustomPlacementConfigArgs(data_locations=list(b.data_locations)) if b.data_locations else None
            ),
            rpo="ASYNC_TURBO" if b.turbo_replication else "DEFAULT",
            storage_class="STANDARD",
            versioning=st.BucketVersioningArgs(enabled=True),
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            soft_delete_policy=st.BucketSoftDeletePolicyArgs(retention_duration_seconds=b.soft_delete_days * DAY),
            encryption=st.BucketEncryptionArgs(default_kms_key_name=kms_key) if kms_key else None,
            lifecycle_rules=lifecycle_rules(b),
            force_destroy=False,
            opts=o,
        )
        self.register_outputs({"bucket": self.bucket.name, "url": self.bucket.url})
