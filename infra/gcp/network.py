"""Network: a VPC with one subnet in the primary region, firewalls, Cloud NAT, private
services access for the file system, and the coordinator's reserved address.

Nodes have no external addresses. Google APIs (Artifact Registry, Cloud Storage) are
reached through Private Google Access on the subnet; package mirrors through Cloud
NAT. Ingress is allowed only among the nodes (by network tag), from Google's health
checkers to the trainer's port, and from the file system's private services range to
the client ports its documentation names. Nothing is open to 0.0.0.0/0.
"""

from __future__ import annotations

import ipaddress

import pulumi
import pulumi_gcp as gcp

from ftfleet.infra.gcp.settings import GcpSettings

#: "Managed Lustre: Configure a VPC network" recommends MTU 8896 (about 10% faster).
MTU = 8896
#: Source ranges of Google's health checkers ("Health checks overview: firewall rules").
HEALTH_CHECK_RANGES = ("35.191.0.0/16", "130.211.0.0/22")
#: Client ports the file system's servers reach: Managed Lustre's LNet port 988 (its
#: VPC guide opens tcp:988 and tcp:6988, the latter for GKE-enabled instances only);
#: Parallelstore's VPC guide opens all TCP from its range.
FS_PORTS = {"managed-lustre": ["988"], "parallelstore": None}


class Network(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: GcpSettings,
        health_port: int,
        provider: gcp.Provider,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:gcp:Network", name, None, opts)
        o = pulumi.ResourceOptions(parent=self, provider=provider)
        s, net = settings, settings.network
        #: Every node carries this network tag; the firewall rules select by it.
        self.node_tag = f"{s.name}-node"
        self.vpc = gcp.compute.Network(
            f"{name}-vpc",
            name=s.name,
            description=f"{s.name}: GPU fleet and checkpoint file system",
            auto_create_subnetworks=False,
            routing_mode="REGIONAL",
            mtu=MTU,
            opts=o,
        )
        self.subnet = gcp.compute.Subnetwork(
            f"{name}-subnet",
            name=f"{s.name}-{s.region}",
            network=self.vpc.id,
            region=s.region,
            ip_cidr_range=net.subnet_cidr,
            private_ip_google_access=True,
            opts=o,
        )
        router = gcp.compute.Router(
            f"{name}-router", name=f"{s.name}-nat", network=self.vpc.id, region=s.region, opts=o
        )
        gcp.compute.RouterNat(
            f"{name}-nat",
            name=f"{s.name}-nat",
            router=router.name,
            region=s.region,
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="LIST_OF_SUBNETWORKS",
            subnetworks=[
                gcp.compute.RouterNatSubnetworkArgs(name=self.subnet.id, source_ip_ranges_to_nats=["ALL_IP_RANGES"])
            ],
            log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
            opts=o,
        )

        # Private services access: the file system's producer network peers with this
        # VPC and takes its addresses from this range (a /23 or larger per Managed Lustre
        # instance, a /24 or larger for Parallelstore; this is a /20).
        services = ipaddress.IPv4Network(net.services_cidr)
        self.services_range = gcp.compute.GlobalAddress(
            f"{name}-services",
            name=f"{s.name}-services",
            purpose="VPC_PEERING",
            address_type="INTERNAL",
            address=str(services.network_address),
            prefix_length=services.prefixlen,
            network=self.vpc.id,
            opts=o,
        )
        self.peering = gcp.servicenetworking.Connection(
            f"{name}-peering",
            network=self.vpc.id,
            service="servicenetworking.googleapis.com",
            reserved_peering_ranges=[self.services_range.name],
            # Removing the peering fails while the producer still holds addresses; the
            # file system is deleted first, and the peering is left for the VPC's deletion.
            deletion_policy="ABANDON",
            opts=o,
        )

        def ingress(rule: str, description: str, allows: list, **sources) -> gcp.compute.Firewall:
            return gcp.compute.Firewall(
                f"{name}-{rule}",
                name=f"{s.name}-{rule}",
                network=self.vpc.id,
                direction="INGRESS",
                description=description,
                allows=allows,
                target_tags=[self.node_tag],
                log_config=gcp.compute.FirewallLogConfigArgs(metadata="EXCLUDE_ALL_METADATA"),
                opts=o,
                **sources,
            )

        self.firewalls = [
            ingress(
                "intra-cluster",
                "all traffic among the nodes (NCCL, rendezvous)",
                [gcp.compute.FirewallAllowArgs(protocol="all")],
                source_tags=[self.node_tag],
            ),
            ingress(
                "health-checks",
                "Google health checkers to the node health agent (auto-healing)",
                [gcp.compute.FirewallAllowArgs(protocol="tcp", ports=[str(health_port)])],
                source_ranges=list(HEALTH_CHECK_RANGES),
            ),
            ingress(
                "file-system",
                f"{s.storage.kind} servers to their clients",
                [gcp.compute.FirewallAllowArgs(protocol="tcp", ports=FS_PORTS[s.storage.kind])],
                source_ranges=[net.services_cidr],
            ),
        ]

        # The coordinator's address: reserved here, kept by the coordinator group's
        # per-instance config across every replacement (infra/gcp/fleet.py).
        self.coordinator_address = gcp.compute.Address(
            f"{name}-coordinator",
            name=f"{s.name}-coordinator",
            description=f"{s.name}: the coordinator's internal address (c10d rendezvous)",
            address_type="INTERNAL",
            purpose="GCE_ENDPOINT",
            subnetwork=self.subnet.id,
            address=net.coordinator_ip,
            region=s.region,
            opts=o,
        )
        self.register_outputs(
            {
                "network": self.vpc.id,
                "subnet": self.subnet.id,
                "coordinator_address": self.coordinator_address.address,
                "services_range": net.services_cidr,
            }
        )
