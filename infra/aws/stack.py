"""The AWS environment: wires the components together and exports what users need."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from ftfleet import contract
from ftfleet.infra import creation, run_lease, standby_source
from ftfleet.infra.aws import run_location, standby, userdata
from ftfleet.infra.aws.bucket import ReplicatedBucket
from ftfleet.infra.aws.checkpoint_store import CheckpointStore
from ftfleet.infra.aws.dns import CoordinatorName
from ftfleet.infra.aws.fleet import GpuFleet
from ftfleet.infra.aws.guard import creation_guard
from ftfleet.infra.aws.iam import NodeGrants, NodeIdentity
from ftfleet.infra.aws.kms import StackKey
from ftfleet.infra.aws.network import Network
from ftfleet.infra.aws.registry import Registry, repository_of
from ftfleet.infra.aws.remediation import Remediation, Targets
from ftfleet.infra.settings import Settings


@dataclass(frozen=True)
class Shared:
    """The checkpoint buckets and keys the nodes use: the stack's own, or for a standby
    its home's (the home's replica bucket is the standby's primary)."""

    primary: aws.s3.Bucket | standby.BucketRef
    replica: aws.s3.Bucket | standby.BucketRef
    key_arn: pulumi.Output[str]
    replica_key_arn: pulumi.Output[str]
    replication: aws.s3.BucketReplicationConfig
    """What replicates ``primary`` into ``replica``."""
    home: pulumi.Output[standby.Home] | None = None
    """A standby's home stack, as it published itself."""


def build(s: Settings) -> None:
    checked = creation_guard(s)
    # Every resource goes through these two providers (IAM too, for the tags), so
    # nothing is created or changed before the guard has passed.
    tags = aws.ProviderDefaultTagsArgs(tags=checked.apply(lambda _: s.all_tags()))
    primary = aws.Provider("primary", region=s.region, default_tags=tags)
    replica = aws.Provider("replica", region=s.replica_region, default_tags=tags)
    identity = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(provider=primary))

    network = Network(f"{s.name}-net", s, primary)
    if s.standby:
        # The repository first: ECR's replication must find it, not create one itself.
        registry = Registry(
            f"{s.name}-registry",
            s,
            primary,
            repository_name=repository_of(f"ftfleet-{s.standby.home}"),
            existing=s.standby.image_replication == "existing",
        )
        # The home stack's buckets and keys, in swapped roles (infra/aws/standby.py).
        links = standby.StandbyLinks(
            f"{s.name}-standby",
            s,
            standby.home_of(s, userdata.checkpoint_root(s)),
            primary,
            replica,
            image_after=[registry.repository] if isinstance(registry.repository, pulumi.Resource) else [],
        )
        shared = Shared(
            links.primary, links.replica, links.key_arn, links.replica_key_arn, links.replication, links.home
        )
    else:
        key = StackKey(f"{s.name}-kms", s, identity.account_id, primary, replica)
        buckets = ReplicatedBucket(f"{s.name}-ckpt", s, key.key, key.replica, primary, replica)
        shared = Shared(buckets.primary, buckets.replica, key.key.arn, key.replica.arn, buckets.replication)
        registry = Registry(f"{s.name}-registry", s, primary)
    store = None
    if s.standby is None or s.standby.has_fast_tier:
        store = CheckpointStore(
            f"{s.name}-fsx",
            s,
            network.subnet_ids[0],
            network.fsx_sg.id,
            shared.key_arn,
            shared.primary.bucket,
            primary,
            security_group_rules=network.fsx_rules,
        )
    # A standby without its file system yet renders its nodes' user data with none:
    # its groups are closed (maximum 0) until the file system exists.
    no_store = pulumi.Output.from_input("")
    fsx_dns_name = store.file_system.dns_name if store else no_store
    fsx_mount_name = store.file_system.mount_name if store else no_store

    coordinator_name = CoordinatorName(f"{s.name}-coordinator-dns", network.zone, primary)
    grants = pulumi.Output.all(
        shared.primary.arn,
        shared.replica.arn,
        shared.key_arn,
        shared.replica_key_arn,
        registry.repository.arn,
        identity.account_id,
    ).apply(
        lambda a: NodeGrants(
            *a[:5],
            checkpoint_prefix=f"{userdata.checkpoint_root(s)}/",
            region=s.region,
            replica_region=s.replica_region,
            replacements_prefix=f"{contract.REPLACEMENTS_PREFIX}{s.trainer.run_id}/",
            group_arn_pattern=f"arn:aws:autoscaling:{s.region}:{a[5]}:autoScalingGroup:*:autoScalingGroupName/{s.name}-*",
            stack=s.stack,
            lease_key=contract.lease_key(s.trainer.run_id),
            lease_in_replica=s.standby is not None,
        )
    )
    nodes = NodeIdentity(f"{s.name}-nodes", s, grants, network.zone.arn, coordinator_name.fqdn, provider=primary)

    # One AMI for the whole deployment: resolved here, once per `pulumi up`, so every
    # node it launches shares the kernel (and so the Lustre client), driver and NCCL.
    if s.fleet.image_id:
        node_image = pulumi.Output.from_input(s.fleet.image_id)
    else:
        node_image = aws.ssm.get_parameter_output(
            name=s.fleet.image_ssm_parameter, opts=pulumi.InvokeOutputOptions(provider=primary)
        ).insecure_value

    def node_user_data(role: str) -> pulumi.Output[str]:
        return pulumi.Output.all(
            registry.image_uri,
            registry.repository.repository_url,
            fsx_dns_name,
            fsx_mount_name,
            shared.primary.bucket,
            shared.replica.bucket,
            network.zone.zone_id,
            network.zone.name,
        ).apply(
            lambda a: userdata.render(
                s,
                userdata.NodeContext(
                    role=role,
                    image_uri=a[0],
                    registry_host=(a[1] or "").split("/")[0],
                    fsx_dns_name=a[2],
                    fsx_mount_name=a[3],
                    primary_bucket=a[4],
                    replica_bucket=a[5],
                    zone_id=a[6],
                    zone_name=a[7],
                ),
            )
        )

    # A home whose run a failover moved to its standby keeps its groups at 0.
    elsewhere = (
        pulumi.Output.from_input("")
        if s.standby
        else run_location.trains_elsewhere(
            shared.primary.bucket,
            contract.lease_key(s.trainer.run_id),
            contract.lease_holder(s.stack, s.region),
            primary,
        )
    )
    fleet = GpuFleet(
        f"{s.name}-fleet",
        s,
        network.subnet_ids,
        network.cluster_sg.id,
        nodes.profiles,
        {role: node_user_data(role) for role in ("coordinator", "worker")},
        primary,
        image_id=node_image,
        launch=pulumi.Output.all(registry.image_pushed, elsewhere).apply(lambda a: bool(a[0]) and not a[1]),
        depends_on=[*([store.association] if store else []), *nodes.policies],
        standby=s.standby is not None,
        closed=store is None,
    )

    remediation = Remediation(
        f"{s.name}-remediation",
        s,
        Targets(
            account_id=identity.account_id,
            groups=[fleet.coordinator, fleet.workers],
            primary_bucket=shared.primary,
            replica_bucket=shared.replica,
            key_arn=shared.key_arn,
            replica_key_arn=shared.replica_key_arn,
            replication=shared.replication,
            file_system=store.file_system if store else None,
            association=store.association if store else None,
            home=shared.home,
        ),
        primary,
        replica,
    )

    pulumi.export(creation.OUTPUT, checked)
    pulumi.export("region", s.region)
    pulumi.export("run_id", s.trainer.run_id)
    pulumi.export(
        "lease_uri",
        pulumi.Output.concat(
            "s3://",
            shared.replica.bucket if s.standby else shared.primary.bucket,
            "/",
            contract.lease_key(s.trainer.run_id),
        ),
    )
    pulumi.export("primary_bucket", shared.primary.bucket)
    pulumi.export("replica_bucket", shared.replica.bucket)
    if s.standby:
        pulumi.export("standby_of", s.standby.home)
    else:
        pulumi.export(
            standby_source.OUTPUT,
            standby_source.publish(
                s,
                userdata.checkpoint_root(s),
                primary_bucket=shared.primary.bucket,
                replica_bucket=shared.replica.bucket,
                key_arn=shared.key_arn,
                replica_key_arn=shared.replica_key_arn,
                repository_name=registry.repository.name,
                coordinator_group=fleet.coordinator.name,
                worker_group=fleet.workers.name,
            ),
        )
    pulumi.export(
        "checkpoint_uri", pulumi.Output.concat("s3://", shared.primary.bucket, "/", userdata.checkpoint_root(s))
    )
    pulumi.export(
        "replica_checkpoint_uri",
        pulumi.Output.concat("s3://", shared.replica.bucket, "/", userdata.checkpoint_root(s)),
    )
    pulumi.export("fsx_dns_name", fsx_dns_name)
    pulumi.export("fsx_mount_name", fsx_mount_name)
    pulumi.export("coordinator_group", fleet.coordinator.name)
    pulumi.export("worker_group", fleet.workers.name)
    pulumi.export("registry_url", registry.repository.repository_url)
    pulumi.export("remediation_functions", {k: d.function.name for k, d in remediation.deployed.items()})
    pulumi.export("dashboard", remediation.dashboard.dashboard_name)
    pulumi.export("alarm_topics", {region: t.arn for region, t in remediation.topics.items()})
    pulumi.export("trainer_image", registry.image_uri)
    pulumi.export("node_image", node_image)
    status = standby_status if s.standby else fleet_status
    pulumi.export("fleet_status", pulumi.Output.all(registry.image_pushed, registry.image_uri, elsewhere).apply(status))
    pulumi.export(
        "coordinator_address",
        pulumi.Output.concat(
            coordinator_name.fqdn,
            f":{contract.RDZV_PORT} (Route 53 private zone ",
            network.zone.zone_id,
            ", record written by the coordinator at boot)",
        ),
    )


def fleet_status(args: list) -> str:
    pushed, image, elsewhere = args
    if elsewhere:
        line = run_lease.held_line(elsewhere, "the groups", pulumi.get_stack())
        pulumi.log.warn(line)
        return line
    if pushed:
        return f"running: nodes pull {image}"
    line = (
        f"held at 0 nodes: {image} is not in the registry yet; push it (README: AWS: first deploy), "
        "then run `pulumi up` again"
    )
    pulumi.log.warn(line)
    return line


def standby_status(args: list) -> str:
    pushed, image, _ = args
    if pushed:
        return f"standing by: 0 nodes until a failover; {image} is in this region's registry"
    # ECR replicates only what is pushed after the replication rule exists (ECR user
    # guide, "Private image replication").
    line = (
        f"standing by: 0 nodes until a failover, and {image} is not in this region's registry yet: "
        "push the release again, or copy it (docs/FAILOVER.md: the image), before a failover"
    )
    pulumi.log.warn(line)
    return line
