"""The GCP environment: wires the components together and exports what users need."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from ftfleet import contract
from ftfleet.infra import run_lease, standby_source
from ftfleet.infra.gcp import boot, run_location, standby
from ftfleet.infra.gcp.bucket import ReplicatedBucket
from ftfleet.infra.gcp.checkpoint_store import CheckpointStore
from ftfleet.infra.gcp.fleet import GpuFleet
from ftfleet.infra.gcp.function_source import FunctionSource
from ftfleet.infra.gcp.functions import RemediationFunctions
from ftfleet.infra.gcp.iam import NodeIdentity
from ftfleet.infra.gcp.kms import BucketKey
from ftfleet.infra.gcp.network import Network
from ftfleet.infra.gcp.registry import Registry
from ftfleet.infra.gcp.settings import GcpSettings


def build(s: GcpSettings) -> dict[str, pulumi.ComponentResource]:
    """Declares the environment; returns its components by name, for the remediation
    functions of a later phase to plug into."""
    # One explicit provider carries the project, the region and every resource's labels.
    # gcp:project is the provider's own setting (`pulumi config set gcp:project ...`);
    # pulumi_gcp.config reads it exactly as the default provider would.
    provider = gcp.Provider("gcp", project=gcp.config.project, region=s.region, default_labels=s.labels())

    network = Network(f"{s.name}-net", s, boot.HEALTH_PORT, provider)
    r = s.remediation
    source = FunctionSource(f"{s.name}-remediation-source", s, provider) if r.any_function else None
    root = boot.checkpoint_root(s)
    key = None
    if s.standby:
        # The home's dual-region bucket and its images (infra/gcp/standby.py).
        home = standby.home_of(s, root, gcp.config.project or provider.project)
        bucket: gcp.storage.Bucket | standby.BucketRef = standby.BucketRef(home.apply(lambda h: h.bucket))
        registry = Registry(f"{s.name}-registry", s, provider, upstream=home.apply(lambda h: h.repository))
    else:
        key = BucketKey(f"{s.name}-key", s, provider) if s.buckets.cmek else None
        # The bucket waits for the drift function's desired state: a change the stack makes
        # to the bucket is desired before the bucket's audit entry reaches the function.
        buckets = ReplicatedBucket(
            f"{s.name}-ckpt",
            s,
            provider,
            kms_key=key.key.id if key else None,
            after=[x for x in (key.grant if key else None, source.desired if source else None) if x is not None],
        )
        bucket = buckets.bucket
        registry = Registry(f"{s.name}-registry", s, provider)
    store = None
    if s.standby is None or s.standby.has_fast_tier:
        store = CheckpointStore(
            f"{s.name}-fs",
            s,
            network.vpc.id,
            network.vpc.name,
            network.services_range.name,
            network.peering,
            provider,
        )
    nodes = NodeIdentity(f"{s.name}-nodes", s, bucket.name, registry.repository, provider)
    # Pinned by name, never resolved from a family: every node of every deployment boots
    # the same image (kernel, driver, Lustre client) until the stack names another, and
    # a `pulumi up` never replaces the templates for an image nobody chose.
    image = f"projects/{s.fleet.image_project}/global/images/{s.fleet.image}"

    fleet = None
    elsewhere: pulumi.Input[str] = ""
    if store is not None:
        # Without its file system (standbyFastTier: on-failover, not active) a standby
        # has no node groups: nothing could boot a node that cannot mount it.
        # A home whose run a failover moved to its standby keeps its workers at 0.
        elsewhere = (
            ""
            if s.standby
            else run_location.trains_elsewhere(
                bucket.name,
                contract.lease_key(s.trainer.run_id),
                contract.lease_holder(s.stack, s.region),
                provider,
            )
        )
        fleet = _fleet(s, store, bucket, registry, network, nodes, image, provider, elsewhere)

    # Managed instance groups already recreate preempted and unhealthy VMs; no function
    # duplicates that (infra/gcp/functions.py).
    groups = (
        pulumi.Output.all(fleet.coordinator.name, *[g.name for g in fleet.workers.values()]).apply(list)
        if fleet is not None
        else None
    )
    functions = RemediationFunctions(
        f"{s.name}-remediation", s, bucket, source, provider, groups=groups, home=home if s.standby else None
    )

    pulumi.export("region", s.region)
    pulumi.export("project", provider.project.apply(lambda p: p or ""))
    pulumi.export("run_id", s.trainer.run_id)
    pulumi.export("checkpoint_bucket", bucket.name)
    pulumi.export("checkpoint_uri", pulumi.Output.concat("gs://", bucket.name, "/", root))
    # The lease of the run, in the home's bucket, which a standby shares.
    pulumi.export("lease_uri", pulumi.Output.concat("gs://", bucket.name, "/", contract.lease_key(s.trainer.run_id)))
    if s.standby:
        pulumi.export("standby_of", s.standby.home)
        pulumi.export("fleet_status", standby_status(s, fleet))
    else:
        pulumi.export(
            standby_source.OUTPUT,
            standby_source.publish(
                s,
                root,
                project=provider.project.apply(lambda p: p or ""),
                bucket=bucket.name,
                repository=registry.repository.id,
                coordinator_group=fleet.coordinator.name,
                worker_groups=pulumi.Output.all(*[g.name for g in fleet.workers.values()]).apply(",".join),
            ),
        )
        pulumi.export("fleet_status", pulumi.Output.from_input(elsewhere).apply(home_status))
        pulumi.export(
            "bucket_location",
            f"{s.buckets.location} ({'+'.join(s.buckets.data_locations) or 'predefined dual-region'}), "
            f"RPO {'ASYNC_TURBO' if s.buckets.turbo_replication else 'DEFAULT'}",
        )
    fs = f"{s.storage.kind} in {s.network.zones[0]}, {s.storage.capacity_gib} GiB"
    pulumi.export("file_system", fs if store else f"none until standbyActive (then {fs})")
    pulumi.export("file_system_mount", store.mount_source if store else "")
    pulumi.export("checkpoint_dir", f"{s.storage.mount_point}/{root}")
    pulumi.export("coordinator_group", fleet.coordinator.name if fleet else "")
    pulumi.export("worker_group", fleet.workers["workers"].name if fleet else "")
    pulumi.export("worker_groups", [g.name for g in fleet.workers.values()] if fleet else [])
    pulumi.export("node_image", image)
    pulumi.export("registry_url", registry.registry_uri)
    pulumi.export("trainer_image", registry.image_uri)
    pulumi.export("node_service_account", nodes.email)
    pulumi.export("remediation_functions", {k: f.name for k, f in functions.functions.items()})
    pulumi.export(
        "coordinator_address",
        pulumi.Output.concat(
            network.coordinator_address.address,
            f":{boot.RDZV_PORT} (reserved internal address, kept by the coordinator group's per-instance config)",
        ),
    )
    return {
        "network": network,
        **({"buckets": buckets} if not s.standby else {}),
        "registry": registry,
        "store": store,
        "nodes": nodes,
        "fleet": fleet,
        "functions": functions,
        **({"key": key} if key else {}),
    }


def _fleet(
    s: GcpSettings,
    store: CheckpointStore,
    bucket: gcp.storage.Bucket | standby.BucketRef,
    registry: Registry,
    network: Network,
    nodes: NodeIdentity,
    image: str,
    provider: gcp.Provider,
    elsewhere: pulumi.Input[str] = "",
) -> GpuFleet:
    """The node groups, with their boot scripts rendered for this stack; ``elsewhere``:
    the run lease's holder when the run trains with another stack."""
    context = pulumi.Output.all(
        registry.image_uri, store.mount_source, bucket.name, network.coordinator_address.address
    ).apply(
        lambda a: boot.NodeContext(
            image_uri=a[0],
            registry_host=registry.registry_host,
            mount_source=a[1],
            bucket=a[2],
            coordinator_ip=a[3],
        )
    )
    scripts = {
        f"shutdown-{model}": pulumi.Output.from_input(boot.shutdown_script(model)) for model in boot.STOP_SECONDS
    }
    for role, script_role in (("coordinator", "coordinator"), ("workers", "worker")):
        for model in boot.STOP_SECONDS:
            scripts[f"startup-{role}-{model}"] = context.apply(
                lambda ctx, r=script_role, m=model: boot.startup_script(s, ctx, r, m)
            )
    return GpuFleet(
        f"{s.name}-fleet",
        s,
        network.subnet.id,
        network.node_tag,
        network.coordinator_address,
        nodes.email,
        image,
        scripts,
        provider,
        held=elsewhere,
    )


def home_status(elsewhere: str) -> str:
    if not elsewhere:
        return "running: the worker groups take their configured sizes"
    line = run_lease.held_line(elsewhere, "the worker groups", pulumi.get_stack())
    pulumi.log.warn(line)
    return line


def standby_status(s: GcpSettings, fleet: GpuFleet | None) -> str:
    if fleet is None:
        return "standing by: no node groups and no file system until standbyActive (standbyFastTier: on-failover)"
    if s.standby and s.standby.active:
        return "active: the coordinator group holds its VM; size the worker groups to the job"
    return "standing by: worker groups at 0 and no coordinator VM until a failover (standbyActive)"
