"""CheckpointStore: the fast checkpoint tier, Managed Lustre (default) or Parallelstore.

Both are zonal and live in the first configured zone, next to the GPU nodes. Neither
exports to Cloud Storage on its own the way an FSx data repository association does:
a checkpoint becomes durable when the trainer uploads it to the bucket
(FTFLEET_CKPT_UPLOAD=trainer), manifest last. The file system is a cache of the last
few checkpoints; losing it loses no committed checkpoint that reached the bucket.

Both reach the VPC through private services access, so they depend on the peering;
they are protected against deletion like every stateful resource of the stack.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from ftfleet.infra.gcp.settings import GcpSettings

#: Lustre file system name (at most 8 characters): the path after `@tcp:/` in a mount.
LUSTRE_FILESYSTEM = "ftfleet"
STRIPES = {
    "min": "FILE_STRIPE_LEVEL_MIN",
    "balanced": "FILE_STRIPE_LEVEL_BALANCED",
    "max": "FILE_STRIPE_LEVEL_MAX",
}


class CheckpointStore(pulumi.ComponentResource):
    mount_source: pulumi.Output[str]
    """Managed Lustre: `IP@tcp:/ftfleet`. Parallelstore: its access points, comma-separated."""

    def __init__(
        self,
        name: str,
        settings: GcpSettings,
        network_id: pulumi.Input[str],
        network_name: pulumi.Input[str],
        services_range: pulumi.Input[str],
        peering: pulumi.Resource,
        provider: gcp.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:gcp:CheckpointStore", name, None, opts)
        st = settings.storage
        zone = settings.network.zones[0]
        o = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[peering], protect=True)
        self.kind = st.kind
        if st.kind == "managed-lustre":
            self.instance = gcp.lustre.Instance(
                f"{name}-lustre",
                instance_id=f"{settings.name}-ckpt",
                location=zone,
                filesystem=LUSTRE_FILESYSTEM,
                # The SDK types capacity and throughput as strings.
                capacity_gib=str(st.lustre_capacity_gib),
                per_unit_storage_throughput=str(st.lustre_throughput_per_tib),
                network=network_id,
                description=f"{settings.name}: fast checkpoint tier",
                opts=o,
            )
            self.mount_source = self.instance.mount_point
        else:
            self.instance = gcp.parallelstore.Instance(
                f"{name}-parallelstore",
                instance_id=f"{settings.name}-ckpt",
                location=zone,
                capacity_gib=str(st.parallelstore_capacity_gib),
                deployment_type=st.parallelstore_deployment_type,
                file_stripe_level=STRIPES[st.parallelstore_file_stripe_level],
                directory_stripe_level=STRIPES[st.parallelstore_directory_stripe_level].replace("FILE_", "DIRECTORY_"),
                # Parallelstore names its network by name, Managed Lustre by path.
                network=network_name,
                reserved_ip_range=services_range,
                description=f"{settings.name}: fast checkpoint tier",
                opts=o,
            )
            self.mount_source = self.instance.access_points.apply(lambda points: ",".join(points or []))
        self.register_outputs({"kind": st.kind, "mount_source": self.mount_source})
