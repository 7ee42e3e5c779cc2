"""ReplicatedBucket: the durable checkpoint tier, in two regions.

Both buckets are versioned, SSE-KMS encrypted (the primary with the stack key, the
replica with its replica key) with SSE-C uploads blocked, fully private, owner-enforced and TLS-only, with the
same lifecycle. Replication copies everything, delete markers included, re-encrypts in
the replica region, and (by default) runs under Replication Time Control with metrics,
which the replication-lag alarm watches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from ftfleet import contract
from ftfleet.infra.aws import names
from ftfleet.infra.settings import BucketSettings, Settings

s3 = aws.s3
#: The encryption type every checkpoint bucket refuses for uploads: objects are SSE-KMS
#: with the stack key, and S3 blocks SSE-C on new buckets by default anyway.
SSE_C = "SSE-C"


def tls_only_policy(bucket_arn: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyInsecureTransport",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": [bucket_arn, f"{bucket_arn}/*"],
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                }
            ],
        }
    )


def lifecycle_rules(b: BucketSettings) -> list[s3.BucketLifecycleConfigurationRuleArgs]:
    """Rules for both buckets. Only `checkpoint_prefix` ages; `pinned_prefix` has no rule
    that transitions or expires anything, current or noncurrent; the run leases
    (contract.LEASE_PREFIX) lose their noncurrent versions after a day."""
    ckpt = s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=b.checkpoint_prefix)
    transitions = [
        s3.BucketLifecycleConfigurationRuleTransitionArgs(days=days, storage_class=cls)
        for days, cls in ((b.transition_to_ia_days, "STANDARD_IA"), (b.transition_to_glacier_days, "GLACIER_IR"))
        if days
    ]
    rules = [
        s3.BucketLifecycleConfigurationRuleArgs(
            id="abort-incomplete-multipart-uploads",
            status="Enabled",
            filter=s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
            abort_incomplete_multipart_upload=s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                days_after_initiation=2
            ),
        ),
        s3.BucketLifecycleConfigurationRuleArgs(
            id="checkpoints-age",
            status="Enabled",
            filter=ckpt,
            transitions=transitions or None,
            expiration=(
                s3.BucketLifecycleConfigurationRuleExpirationArgs(days=b.expire_checkpoints_days)
                if b.expire_checkpoints_days
                else None
            ),
            noncurrent_version_expiration=s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                noncurrent_days=b.noncurrent_version_expiry_days
            ),
        ),
    ]
    if not b.expire_checkpoints_days:
        # Without a days-based expiration, remove delete markers left alone once their
        # noncurrent versions are gone (S3 forbids both in one rule).
        rules.append(
            s3.BucketLifecycleConfigurationRuleArgs(
                id="checkpoints-delete-markers",
                status="Enabled",
                filter=ckpt,
                expiration=s3.BucketLifecycleConfigurationRuleExpirationArgs(expired_object_delete_marker=True),
            )
        )
    # The run lease is rewritten every quarter of its TTL: its old versions go after a day.
    rules.append(
        s3.BucketLifecycleConfigurationRuleArgs(
            id="lease-versions",
            status="Enabled",
            filter=s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=contract.LEASE_PREFIX),
            noncurrent_version_expiration=s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                noncurrent_days=1
            ),
        )
    )
    return rules


def replication_policy(src_arn: str, dst_arn: str, src_key: str, dst_key: str, src_region: str, dst_region: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ReadSourceConfig",
                    "Effect": "Allow",
                    "Action": ["s3:GetReplicationConfiguration", "s3:ListBucket"],
                    "Resource": [src_arn],
                },
                {
                    "Sid": "ReadSourceVersions",
                    "Effect": "Allow",
                    "Action": [
                        "s3:GetObjectVersionForReplication",
                        "s3:GetObjectVersionAcl",
                        "s3:GetObjectVersionTagging",
                        # needed to replicate Object Lock retention and legal holds
                        "s3:GetObjectRetention",
                        "s3:GetObjectLegalHold",
                    ],
                    "Resource": [f"{src_arn}/*"],
                },
                {
                    "Sid": "WriteReplica",
                    "Effect": "Allow",
                    "Action": ["s3:ReplicateObject", "s3:ReplicateDelete", "s3:ReplicateTags"],
                    "Resource": [f"{dst_arn}/*"],
                },
                {
                    "Sid": "DecryptSource",
                    "Effect": "Allow",
                    "Action": ["kms:Decrypt"],
                    "Resource": [src_key],
                    "Condition": {"StringLike": {"kms:ViaService": f"s3.{src_region}.amazonaws.com"}},
                },
                {
                    "Sid": "EncryptReplica",
                    "Effect": "Allow",
                    "Action": ["kms:Encrypt", "kms:GenerateDataKey"],
                    "Resource": [dst_key],
                    "Condition": {"StringLike": {"kms:ViaService": f"s3.{dst_region}.amazonaws.com"}},
                },
            ],
        }
    )


def replicate(
    name: str,
    settings: Settings,
    *,
    description: str,
    config_name: str,
    rule_id: str,
    source: tuple[pulumi.Input[str], pulumi.Input[str], pulumi.Input[str], str],
    destination: tuple[pulumi.Input[str], pulumi.Input[str], str],
    opts: pulumi.ResourceOptions,
    after: Sequence[pulumi.Resource] = (),
) -> tuple[aws.iam.RolePolicy, s3.BucketReplicationConfig]:
    """Replication of everything in one bucket to another, delete markers included,
    re-encrypted with the destination's key, with metrics (and Replication Time Control
    when the stack asks for it), under a role of its own that may do only that.
    ``source``: (bucket id, ARN, key ARN, region); ``destination``: (ARN, key ARN,
    region); ``opts``: the parent and a provider of the source's region."""
    source_id, source_arn, source_key, source_region = source
    dest_arn, dest_key, dest_region = destination
    role = aws.iam.Role(
        f"{name}-replication",
        **names.generated("aws:iam/role:Role", f"{name}-replication"),
        description=description,
        assume_role_policy=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {"Effect": "Allow", "Principal": {"Service": "s3.amazonaws.com"}, "Action": "sts:AssumeRole"}
                ],
            }
        ),
        opts=opts,
    )
    policy = aws.iam.RolePolicy(
        f"{name}-replication",
        **names.generated("aws:iam/rolePolicy:RolePolicy", f"{name}-replication"),
        role=role.id,
        policy=pulumi.Output.all(source_arn, dest_arn, source_key, dest_key).apply(
            lambda a: replication_policy(*a, source_region, dest_region)
        ),
        opts=opts,
    )
    target: dict[str, Any] = dict(
        bucket=dest_arn,
        storage_class="STANDARD",
        encryption_configuration=s3.BucketReplicationConfigRuleDestinationEncryptionConfigurationArgs(
            replica_kms_key_id=dest_key
        ),
        metrics=s3.BucketReplicationConfigRuleDestinationMetricsArgs(
            status="Enabled",
            event_threshold=s3.BucketReplicationConfigRuleDestinationMetricsEventThresholdArgs(minutes=15),
        ),
    )
    if settings.buckets.replication_time_control:
        target["replication_time"] = s3.BucketReplicationConfigRuleDestinationReplicationTimeArgs(
            status="Enabled", time=s3.BucketReplicationConfigRuleDestinationReplicationTimeTimeArgs(minutes=15)
        )
    config = s3.BucketReplicationConfig(
        config_name,
        bucket=source_id,
        role=role.arn,
        rules=[
            s3.BucketReplicationConfigRuleArgs(
                id=rule_id,
                status="Enabled",
                priority=1,
                filter=s3.BucketReplicationConfigRuleFilterArgs(prefix=""),
                delete_marker_replication=s3.BucketReplicationConfigRuleDeleteMarkerReplicationArgs(status="Enabled"),
                source_selection_criteria=s3.BucketReplicationConfigRuleSourceSelectionCriteriaArgs(
                    sse_kms_encrypted_objects=s3.BucketReplicationConfigRuleSourceSelectionCriteriaSseKmsEncryptedObjectsArgs(
                        status="Enabled"
                    )
                ),
                destination=s3.BucketReplicationConfigRuleDestinationArgs(**target),
            )
        ],
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[policy, *after])),
    )
    return policy, config


class ReplicatedBucket(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: Settings,
        key: aws.kms.Key,
        replica_key: aws.kms.ReplicaKey,
        primary: aws.Provider,
        replica: aws.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:aws:ReplicatedBucket", name, None, opts)
        b = settings.buckets
        self._versioning: list[s3.BucketVersioning] = []
        self.primary = self._bucket(f"{name}-primary", b, key.arn, primary)
        self.replica = self._bucket(f"{name}-replica", b, replica_key.arn, replica)

        self.replication_policy, self.replication = replicate(
            name,
            settings,
            description=f"{settings.name}: S3 replicates checkpoints to {settings.replica_region}",
            config_name=f"{name}-replication",
            rule_id="everything",
            source=(self.primary.id, self.primary.arn, key.arn, settings.region),
            destination=(self.replica.arn, replica_key.arn, settings.replica_region),
            # IAM is global; the primary provider only brings the default tags.
            opts=pulumi.ResourceOptions(parent=self, provider=primary),
            # S3 rejects replication until both buckets are versioned.
            after=self._versioning,
        )
        self.register_outputs({"primary": self.primary.bucket, "replica": self.replica.bucket})

    def _bucket(self, name: str, b: BucketSettings, key_arn: pulumi.Output[str], provider: aws.Provider) -> s3.Bucket:
        o = pulumi.ResourceOptions(parent=self, provider=provider)
        # force_destroy off: `pulumi destroy` fails on a bucket that still holds checkpoints.
        # Protected: a change that would replace it (object_lock_enabled is set only at
        # creation) stops the update instead of emptying a bucket of checkpoints.
        bucket = s3.Bucket(
            name,
            **names.generated("aws:s3/bucket:Bucket", name),
            object_lock_enabled=b.object_lock or None,
            force_destroy=False,
            opts=pulumi.ResourceOptions.merge(o, pulumi.ResourceOptions(protect=True)),
        )
        versioning = s3.BucketVersioning(
            f"{name}-versioning",
            bucket=bucket.id,
            versioning_configuration=s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=o,
        )
        self._versioning.append(versioning)
        s3.BucketServerSideEncryptionConfiguration(
            f"{name}-sse",
            bucket=bucket.id,
            rules=[
                s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="aws:kms", kms_master_key_id=key_arn
                    ),
                    bucket_key_enabled=True,
                    # Declared, not left to S3's default for new buckets, so that the
                    # stack and storage_drift own it and a repair never unblocks SSE-C.
                    blocked_encryption_types=[SSE_C],
                )
            ],
            opts=o,
        )
        pab = s3.BucketPublicAccessBlock(
            f"{name}-public-access",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=o,
        )
        s3.BucketOwnershipControls(
            f"{name}-ownership",
            bucket=bucket.id,
            rule=s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=o,
        )
        s3.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.id,
            policy=bucket.arn.apply(tls_only_policy),
            opts=pulumi.ResourceOptions.merge(o, pulumi.ResourceOptions(depends_on=[pab])),
        )
        s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle",
            bucket=bucket.id,
            rules=lifecycle_rules(b),
            opts=pulumi.ResourceOptions.merge(o, pulumi.ResourceOptions(depends_on=[versioning])),
        )
        if b.object_lock:
            s3.BucketObjectLockConfiguration(
                f"{name}-object-lock",
                bucket=bucket.id,
                rule=s3.BucketObjectLockConfigurationRuleArgs(
                    default_retention=s3.BucketObjectLockConfigurationRuleDefaultRetentionArgs(
                        mode="GOVERNANCE", days=b.object_lock_retention_days
                    )
                ),
                opts=o,
            )
        return bucket
