"""Network: private subnets per zone (or adopted ones) and the security groups.

Nodes have no public addresses. Egress to ECR, SSM and package mirrors goes through one
NAT gateway; checkpoint traffic to S3 goes through a gateway endpoint instead, which is
free and keeps multi-GB checkpoint uploads off the NAT.
"""

from __future__ import annotations

import ipaddress

import pulumi
import pulumi_aws as aws

from ftfleet.infra.aws import names
from ftfleet.infra.settings import Settings

# Ports FSx for Lustre needs between clients and file servers (and among servers).
LUSTRE_PORTS = ((988, 988), (1018, 1023))


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    subnet_ids: list[pulumi.Output[str]]

    def __init__(
        self, name: str, settings: Settings, provider: aws.Provider, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__("ftfleet:aws:Network", name, None, opts)
        self._opts = pulumi.ResourceOptions(parent=self, provider=provider)
        net = settings.network
        if net.adopt:
            self.vpc_id = pulumi.Output.from_input(net.existing_vpc_id)
            self.subnet_ids = [pulumi.Output.from_input(s) for s in net.existing_subnet_ids]
        else:
            self._create_vpc(name, settings)

        self.cluster_sg = aws.ec2.SecurityGroup(
            f"{name}-cluster",
            vpc_id=self.vpc_id,
            description="ftfleet nodes: all traffic among themselves (NCCL, EFA, rendezvous)",
            opts=self._opts,
        )
        # EFA's OS-bypass traffic needs a security group that admits all traffic from
        # itself and sends all traffic to itself (Amazon EC2 User Guide, "Get started with
        # EFA and NCCL": prepare an EFA-enabled security group).
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-cluster-self-in",
            security_group_id=self.cluster_sg.id,
            referenced_security_group_id=self.cluster_sg.id,
            ip_protocol="-1",
            description="all traffic within the cluster",
            opts=self._opts,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-cluster-self-out",
            security_group_id=self.cluster_sg.id,
            referenced_security_group_id=self.cluster_sg.id,
            ip_protocol="-1",
            description="all traffic within the cluster (EFA)",
            opts=self._opts,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-cluster-egress",
            security_group_id=self.cluster_sg.id,
            cidr_ipv4="0.0.0.0/0",
            ip_protocol="-1",
            description="egress (S3 endpoint, NAT, FSx, peers)",
            opts=self._opts,
        )

        self.fsx_sg = aws.ec2.SecurityGroup(
            f"{name}-fsx",
            vpc_id=self.vpc_id,
            description="FSx for Lustre: Lustre ports from the cluster and between file servers",
            opts=self._opts,
        )
        # The file system's ingress rules: CreateFileSystem rejects security groups that
        # do not admit Lustre on 988 at that moment, so the file system waits for them.
        self.fsx_rules: list[aws.vpc.SecurityGroupIngressRule] = []
        for lo, hi in LUSTRE_PORTS:
            for source, label in ((self.cluster_sg, "cluster"), (self.fsx_sg, "self")):
                self.fsx_rules.append(
                    aws.vpc.SecurityGroupIngressRule(
                        f"{name}-fsx-{label}-{lo}",
                        security_group_id=self.fsx_sg.id,
                        referenced_security_group_id=source.id,
                        ip_protocol="tcp",
                        from_port=lo,
                        to_port=hi,
                        description=f"Lustre {lo}-{hi} from {label}",
                        opts=self._opts,
                    )
                )
            # Lustre clients admit the file servers on the same ports (FSx for Lustre
            # guide, "File system access control with Amazon VPC": client rules).
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-cluster-lustre-{lo}",
                security_group_id=self.cluster_sg.id,
                referenced_security_group_id=self.fsx_sg.id,
                ip_protocol="tcp",
                from_port=lo,
                to_port=hi,
                description=f"Lustre {lo}-{hi} from the file servers",
                opts=self._opts,
            )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-fsx-egress",
            security_group_id=self.fsx_sg.id,
            referenced_security_group_id=self.fsx_sg.id,
            ip_protocol="-1",
            description="file servers talk among themselves",
            opts=self._opts,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-fsx-egress-cluster",
            security_group_id=self.fsx_sg.id,
            referenced_security_group_id=self.cluster_sg.id,
            ip_protocol="-1",
            description="replies to clients",
            opts=self._opts,
        )

        # Private DNS zone that holds coordinator.<zone> (see infra/aws/userdata.py).
        self.zone = aws.route53.Zone(
            f"{name}-zone",
            # A DNS label has at most 63 characters (RFC 1035), a stack name up to 100.
            name=f"{names.fit(settings.stack, names.DNS_LABEL)}.ftfleet.internal",
            comment=f"{settings.name}: coordinator discovery",
            vpcs=[aws.route53.ZoneVpcArgs(vpc_id=self.vpc_id, vpc_region=settings.region)],
            # The coordinator writes its own record at boot; Pulumi does not manage it.
            force_destroy=True,
            opts=self._opts,
        )
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "subnet_ids": self.subnet_ids,
                "cluster_sg": self.cluster_sg.id,
                "zone_id": self.zone.zone_id,
            }
        )

    def _create_vpc(self, name: str, settings: Settings) -> None:
        net = settings.network
        o = self._opts
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=net.vpc_cidr,
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags={"Name": f"{settings.name}"},
            opts=o,
        )
        self.vpc_id = vpc.id
        blocks = list(ipaddress.ip_network(net.vpc_cidr).subnets(new_prefix=20))
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, opts=o)
        # The last /20 holds the public subnet of the NAT gateway; nodes never use it.
        public = aws.ec2.Subnet(
            f"{name}-public",
            vpc_id=vpc.id,
            cidr_block=str(blocks[-1]),
            availability_zone=net.availability_zones[0],
            tags={"Name": f"{settings.name}-public"},
            opts=o,
        )
        public_rt = aws.ec2.RouteTable(f"{name}-public-rt", vpc_id=vpc.id, opts=o)
        aws.ec2.Route(
            f"{name}-public-default",
            route_table_id=public_rt.id,
            destination_cidr_block="0.0.0.0/0",
            gateway_id=igw.id,
            opts=o,
        )
        aws.ec2.RouteTableAssociation(f"{name}-public-rta", subnet_id=public.id, route_table_id=public_rt.id, opts=o)
        eip = aws.ec2.Eip(f"{name}-nat-ip", domain="vpc", opts=o)
        nat = aws.ec2.NatGateway(
            f"{name}-nat",
            allocation_id=eip.id,
            subnet_id=public.id,
            opts=pulumi.ResourceOptions.merge(o, pulumi.ResourceOptions(depends_on=[igw])),
        )
        private_rt = aws.ec2.RouteTable(f"{name}-private-rt", vpc_id=vpc.id, opts=o)
        aws.ec2.Route(
            f"{name}-private-default",
            route_table_id=private_rt.id,
            destination_cidr_block="0.0.0.0/0",
            nat_gateway_id=nat.id,
            opts=o,
        )
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{settings.region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[private_rt.id],
            opts=o,
        )
        self.subnet_ids = []
        for i, zone in enumerate(net.availability_zones):
            subnet = aws.ec2.Subnet(
                f"{name}-private-{zone}",
                vpc_id=vpc.id,
                cidr_block=str(blocks[i]),
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={"Name": f"{settings.name}-private-{zone}"},
                opts=o,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{zone}-rta", subnet_id=subnet.id, route_table_id=private_rt.id, opts=o
            )
            self.subnet_ids.append(subnet.id)
