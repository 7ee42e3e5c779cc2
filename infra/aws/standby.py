"""A standby environment: what it shares with its home stack, and the two links it adds.

A stack with ``standbyOf: <home>`` runs in the home's replica region. It creates no
bucket and no key: the home's replica bucket, where replication already carries every
checkpoint, is its primary store, and the home's primary bucket is its replica. It
adds what a region of its own needs to train (network, registry, file system, node
groups at 0 nodes) and two links between the regions:

* **replication back**: the home's replica bucket replicates what is written to it
  directly to the home's primary bucket (S3 does not replicate a replica again, so
  the two rules never loop; only the region that holds the run lease writes);
* **the image**: the home region's registry replicates the trainer repository to this
  region (``standbyImageReplication: create``), so a failover pulls from its own region.

The home stack publishes what a standby needs as one output, :data:`OUTPUT`
(:func:`ftfleet.infra.standby_source.publish`); the standby reads it through a StackReference and refuses, with
one line, a home whose regions, run or checkpoint prefix do not match its own
(infra/standby_source.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from ftfleet.infra import standby_source
from ftfleet.infra.aws.bucket import replicate
from ftfleet.infra.settings import Settings

s3 = aws.s3
OUTPUT = standby_source.OUTPUT
#: What :data:`OUTPUT` holds on AWS, each a string.
FIELDS = (
    *standby_source.COMMON,
    "primary_bucket",
    "replica_bucket",
    "key_arn",
    "replica_key_arn",
    "repository_name",
    "coordinator_group",
    "worker_group",
)


@dataclass(frozen=True)
class Home:
    """The home stack's :data:`OUTPUT`, checked against this standby's settings
    (:func:`ftfleet.infra.standby_source.checked`)."""

    stack: str
    region: str
    replica_region: str
    run_id: str
    checkpoint_root: str
    primary_bucket: str
    replica_bucket: str
    key_arn: str
    replica_key_arn: str
    repository_name: str
    coordinator_group: str
    worker_group: str
    """The home's Auto Scaling groups: a standby's capacity_watch measures and moves them."""


@dataclass(frozen=True)
class BucketRef:
    """A bucket another stack owns, by name: what the components read of a bucket."""

    bucket: pulumi.Output[str]
    arn: pulumi.Output[str]
    id: pulumi.Output[str]

    @classmethod
    def of(cls, name: pulumi.Output[str]) -> BucketRef:
        return cls(bucket=name, arn=name.apply(lambda n: f"arn:aws:s3:::{n}"), id=name)


def home_of(s: Settings, checkpoint_root: str) -> pulumi.Output[Home]:
    """The home stack's :data:`OUTPUT`, read through a StackReference and checked."""
    return standby_source.read(s, checkpoint_root, FIELDS).apply(lambda got: Home(**got))


class StandbyLinks(pulumi.ComponentResource):
    """The shared buckets as resources this stack reads (not owns), replication back to
    the home region, and (``create``) the home registry's replication to this region.

    ``here``: a provider in this stack's region (the home's replica region); ``home``:
    one in the home's region. ``image_after``: the repository here, which the registry's
    replication must find rather than create (ECR creates a missing destination
    repository with its own settings)."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        home: pulumi.Output[Home],
        here: aws.Provider,
        there: aws.Provider,
        image_after: Sequence[pulumi.Resource] = (),
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:aws:StandbyLinks", name, None, opts)
        assert settings.standby is not None
        o_here = pulumi.ResourceOptions(parent=self, provider=here)
        self.home = home
        # Named, neither owned nor read: `pulumi destroy` of the standby leaves both
        # buckets alone, and the home stack's policies judge them.
        self.primary = BucketRef.of(home.apply(lambda h: h.replica_bucket))
        self.replica = BucketRef.of(home.apply(lambda h: h.primary_bucket))
        self.key_arn = home.apply(lambda h: h.replica_key_arn)
        self.replica_key_arn = home.apply(lambda h: h.key_arn)

        # The home's rule copies everything, delete markers included, under RTC when the
        # home asks for it; the way back does the same for what the standby writes. The
        # home's storage_drift leaves this configuration alone (it restores the replica
        # bucket's settings but never its replication).
        _, self.replication = replicate(
            name,
            settings,
            description=f"{settings.name}: S3 replicates checkpoints back to {settings.replica_region}",
            config_name=f"{name}-replication-back",
            rule_id="back-to-home",
            source=(self.primary.id, self.primary.arn, self.key_arn, settings.region),
            destination=(self.replica.arn, self.replica_key_arn, settings.replica_region),
            opts=o_here,
        )

        self.image_replication = None
        if settings.standby.image_replication == "create":
            identity = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(provider=there))
            # One replication configuration per registry and region (ECR API Reference,
            # PutReplicationConfiguration): this one replaces whatever the home region's
            # registry had, which is why `existing` exists.
            self.image_replication = aws.ecr.ReplicationConfiguration(
                f"{name}-image",
                replication_configuration=aws.ecr.ReplicationConfigurationReplicationConfigurationArgs(
                    rules=[
                        aws.ecr.ReplicationConfigurationReplicationConfigurationRuleArgs(
                            destinations=[
                                aws.ecr.ReplicationConfigurationReplicationConfigurationRuleDestinationArgs(
                                    region=settings.region, registry_id=identity.account_id
                                )
                            ],
                            repository_filters=[
                                aws.ecr.ReplicationConfigurationReplicationConfigurationRuleRepositoryFilterArgs(
                                    filter=home.apply(lambda h: h.repository_name), filter_type="PREFIX_MATCH"
                                )
                            ],
                        )
                    ]
                ),
                opts=pulumi.ResourceOptions(parent=self, provider=there, depends_on=list(image_after)),
            )
        self.register_outputs({"primary": self.primary.bucket, "replica": self.replica.bucket})
