"""AuditTrail: a CloudTrail trail for the stack, when no account trail can be relied on.

EventBridge receives "AWS API Call via CloudTrail" events only while a trail logs the
management events (EventBridge User Guide, "Events from AWS services"), and
storage_drift depends on them. ``cloudTrail: create`` makes one: multi-region (the
replica bucket's calls happen in its own region), write events only, log file
validation on, delivered to a bucket of its own that is guarded like the checkpoint
buckets and encrypted with a key whose policy lets CloudTrail encrypt for this trail
only (CloudTrail User Guide, "Configure AWS KMS key policies for CloudTrail"; bucket
policy from "Amazon S3 bucket policy for CloudTrail"). The bucket and the key hold the
audit record: they are protected, and outlive a switched-off trail until unprotected.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from ftfleet.infra.aws import names
from ftfleet.infra.aws.bucket import SSE_C, tls_only_policy
from ftfleet.infra.settings import Settings

LOG_DAYS = 365
s3 = aws.s3


def trail_arn(region: str, account: str, name: str) -> str:
    return f"arn:aws:cloudtrail:{region}:{account}:trail/{name}"


def key_policy(account: str, trail: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DelegateToAccountIam",
                    "Effect": "Allow",
                    "Principal": {"AWS": f"arn:aws:iam::{account}:root"},
                    "Action": "kms:*",
                    "Resource": "*",
                },
                {
                    "Sid": "CloudTrailEncryptsThisTrail",
                    "Effect": "Allow",
                    "Principal": {"Service": "cloudtrail.amazonaws.com"},
                    "Action": "kms:GenerateDataKey*",
                    "Resource": "*",
                    "Condition": {
                        "StringEquals": {"aws:SourceArn": trail},
                        "StringLike": {
                            "kms:EncryptionContext:aws:cloudtrail:arn": f"arn:aws:cloudtrail:*:{account}:trail/*"
                        },
                    },
                },
                {
                    "Sid": "CloudTrailDescribesKey",
                    "Effect": "Allow",
                    "Principal": {"Service": "cloudtrail.amazonaws.com"},
                    "Action": "kms:DescribeKey",
                    "Resource": "*",
                },
            ],
        }
    )


def bucket_policy(bucket_arn: str, account: str, trail: str) -> str:
    tls = json.loads(tls_only_policy(bucket_arn))["Statement"]
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                *tls,
                {
                    "Sid": "CloudTrailAclCheck",
                    "Effect": "Allow",
                    "Principal": {"Service": "cloudtrail.amazonaws.com"},
                    "Action": "s3:GetBucketAcl",
                    "Resource": bucket_arn,
                    "Condition": {"StringEquals": {"aws:SourceArn": trail}},
                },
                {
                    "Sid": "CloudTrailWrite",
                    "Effect": "Allow",
                    "Principal": {"Service": "cloudtrail.amazonaws.com"},
                    "Action": "s3:PutObject",
                    "Resource": f"{bucket_arn}/AWSLogs/{account}/*",
                    "Condition": {
                        "StringEquals": {"s3:x-amz-acl": "bucket-owner-full-control", "aws:SourceArn": trail}
                    },
                },
            ],
        }
    )


class AuditTrail(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: Settings,
        account_id: pulumi.Input[str],
        provider: aws.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:aws:AuditTrail", name, None, opts)
        o = pulumi.ResourceOptions(parent=self, provider=provider)
        keep = pulumi.ResourceOptions.merge(o, pulumi.ResourceOptions(protect=True))
        trail_name = f"{settings.name}-storage"
        arn = pulumi.Output.from_input(account_id).apply(lambda a: trail_arn(settings.region, a, trail_name))
        self.key = aws.kms.Key(
            f"{name}-key",
            description=f"{settings.name}: CloudTrail logs",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            policy=pulumi.Output.all(account_id, arn).apply(lambda a: key_policy(*a)),
            opts=keep,
        )
        self.bucket = s3.Bucket(
            f"{name}-logs", force_destroy=False, **names.generated("aws:s3/bucket:Bucket", f"{name}-logs"), opts=keep
        )
        s3.BucketVersioning(
            f"{name}-logs-versioning",
            bucket=self.bucket.id,
            versioning_configuration=s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=o,
        )
        s3.BucketServerSideEncryptionConfiguration(
            f"{name}-logs-sse",
            bucket=self.bucket.id,
            rules=[
                s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="aws:kms", kms_master_key_id=self.key.arn
                    ),
                    bucket_key_enabled=True,
                    blocked_encryption_types=[SSE_C],
                )
            ],
            opts=o,
        )
        pab = s3.BucketPublicAccessBlock(
            f"{name}-logs-public-access",
            bucket=self.bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=o,
        )
        s3.BucketOwnershipControls(
            f"{name}-logs-ownership",
            bucket=self.bucket.id,
            rule=s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=o,
        )
        s3.BucketLifecycleConfiguration(
            f"{name}-logs-lifecycle",
            bucket=self.bucket.id,
            rules=[
                s3.BucketLifecycleConfigurationRuleArgs(
                    id="expire-logs",
                    status="Enabled",
                    filter=s3.BucketLifecycleConfigurationRuleFilterArgs(prefix="AWSLogs/"),
                    expiration=s3.BucketLifecycleConfigurationRuleExpirationArgs(days=LOG_DAYS),
                    noncurrent_version_expiration=s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                        noncurrent_days=30
                    ),
                )
            ],
            opts=o,
        )
        policy = s3.BucketPolicy(
            f"{name}-logs-policy",
            bucket=self.bucket.id,
            policy=pulumi.Output.all(self.bucket.arn, account_id, arn).apply(lambda a: bucket_policy(*a)),
            opts=pulumi.ResourceOptions.merge(o, pulumi.ResourceOptions(depends_on=[pab])),
        )
        # CreateTrail checks the bucket policy, so the trail waits for it.
        self.trail = aws.cloudtrail.Trail(
            f"{name}-trail",
            name=trail_name,
            s3_bucket_name=self.bucket.id,
            is_multi_region_trail=True,
            include_global_service_events=True,
            enable_log_file_validation=True,
            kms_key_id=self.key.arn,
            event_selectors=[
                aws.cloudtrail.TrailEventSelectorArgs(read_write_type="WriteOnly", include_management_events=True)
            ],
            opts=pulumi.ResourceOptions.merge(o, pulumi.ResourceOptions(depends_on=[policy])),
        )
        self.register_outputs({"trail": self.trail.arn, "bucket": self.bucket.bucket})
