"""GpuFleet: an on-demand coordinator group and a spot-heavy worker group.

The coordinator group holds exactly one on-demand node: it hosts the c10d rendezvous
and publishes its address (infra/aws/userdata.py), so it must not be interrupted by
the spot market. Workers use a mixed-instances policy: an on-demand base, a percentage
of on-demand above it, and spot spread over every configured type with the configured
allocation strategy. Every instance type has its own launch template (its EFA
interfaces follow its network cards), named in the policy's overrides. Capacity
rebalancing starts a replacement when EC2 signals that a spot node is at risk, and a
termination lifecycle hook holds every terminating node (spot reclaim, scale-in,
refresh) long enough for the trainer's emergency checkpoint.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from ftfleet import contract
from ftfleet.infra import catalog
from ftfleet.infra.aws import names
from ftfleet.infra.settings import Settings

ROOT_DEVICE = "/dev/sda1"  # root device name of the Ubuntu-based Deep Learning AMIs
ROOT_IOPS = 6000
ROOT_THROUGHPUT_MIBPS = 500
IMDS_HOP_LIMIT = 1
TERMINATION_HOOK = contract.TERMINATION_HOOK_NAME  # lifecycle_handoff and the node match on it


@dataclass(frozen=True)
class Replacement:
    """How a group replaces nodes (refresh, failed health check), as percentages of
    its desired capacity. AWS accepts min 0-100, max 100-200, at most 100 apart
    (EC2 Auto Scaling API Reference, InstanceMaintenancePolicy)."""

    min_healthy: int
    max_healthy: int


# The one coordinator: launch its successor first, then terminate it (at 50%, a
# one-node group terminates first and the job loses its rendezvous host).
COORDINATOR_REPLACEMENT = Replacement(min_healthy=100, max_healthy=200)
# Workers: never fewer than desired while replacing (every lost node restarts the
# job), a tenth more at a time; a refresh of a small group still moves one node at a time.
WORKER_REPLACEMENT = Replacement(min_healthy=100, max_healthy=110)


def efa_interfaces(spec: catalog.InstanceSpec, security_group_id: pulumi.Input[str]) -> list:
    """One EFA interface per network card: device index 0 on card 0 (the primary,
    EFA with ENA), device index 1 on cards 1..N-1 (Amazon EC2 User Guide, "Maximize
    network bandwidth on accelerated computing instances with EFA",
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html)."""
    return [
        aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            device_index=0 if card == 0 else 1,
            network_card_index=card,
            interface_type="efa",
            security_groups=[security_group_id],
            delete_on_termination="true",
        )
        for card in range(spec.efa_interfaces)
    ]


class GpuFleet(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: Settings,
        subnet_ids: list[pulumi.Input[str]],
        security_group_id: pulumi.Input[str],
        profiles: dict[str, aws.iam.InstanceProfile],
        user_data: dict[str, pulumi.Output[str]],
        provider: aws.Provider,
        image_id: pulumi.Input[str],
        launch: pulumi.Input[bool] = True,
        depends_on: Sequence[pulumi.Resource] = (),
        standby: bool = False,
        closed: bool = False,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """``image_id``: the AMI every node of this deployment boots (resolved once per
        `pulumi up`). ``launch``: false holds both groups at 0 nodes (the trainer image
        is not in the registry yet). ``depends_on``: what a booting node needs to exist
        already (the FSx data repository association, the node role's policies); the
        launch templates wait for it, so no node boots into a half-built stack.
        ``standby``: both groups are created at 0 nodes and their sizes belong to the
        failover from then on (a later `pulumi up` leaves min and desired as they are).
        ``closed``: both groups' maximum is 0, so no size set outside the program can
        boot a node (a standby whose file system is created on failover, before it)."""
        super().__init__("ftfleet:aws:GpuFleet", name, None, opts)
        self._o = pulumi.ResourceOptions(parent=self, provider=provider)
        self._depends_on = list(depends_on)
        self._settings = settings
        self._image_id = image_id
        launch = pulumi.Output.from_input(False if standby else launch)
        group_o = self._o
        if standby:
            group_o = pulumi.ResourceOptions.merge(
                self._o, pulumi.ResourceOptions(ignore_changes=["minSize", "desiredCapacity"])
            )

        def held(size: int) -> pulumi.Output[int]:
            return launch.apply(lambda on: size if on else 0)

        f = settings.fleet
        self.placement_group = None
        if f.placement_group:
            self.placement_group = aws.ec2.PlacementGroup(f"{name}-placement", strategy="cluster", opts=self._o)
            # A cluster placement group lives in one zone: use the first zone's subnet,
            # the same zone as the FSx file system.
            subnet_ids = subnet_ids[:1]

        # One launch template per instance type: each type gets one EFA interface per
        # network card, so the worker group names its templates per type in its overrides.
        self.coordinator_template = self._launch_template(
            f"{name}-coordinator", "coordinator", f.coordinator_instance_type, security_group_id, profiles, user_data
        )
        self.worker_templates = {
            t: self._launch_template(
                f"{name}-worker-{t.replace('.', '-')}", "worker", t, security_group_id, profiles, user_data
            )
            for t in f.worker_instance_types
        }

        coordinator_lt = self.coordinator_template
        self.coordinator = aws.autoscaling.Group(
            f"{name}-coordinator",
            min_size=held(1),
            max_size=0 if closed else 1,
            desired_capacity=held(1),
            vpc_zone_identifiers=subnet_ids,
            placement_group=self.placement_group.id if self.placement_group else None,
            # A plain launch template without market options: on-demand only.
            launch_template=aws.autoscaling.GroupLaunchTemplateArgs(
                id=coordinator_lt.id, version=coordinator_lt.latest_version.apply(str)
            ),
            **self._common(f"{name}-coordinator", "coordinator", COORDINATOR_REPLACEMENT),
            opts=group_o,
        )

        def spec(lt: aws.ec2.LaunchTemplate):
            return aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                launch_template_id=lt.id, version=lt.latest_version.apply(str)
            )

        first = self.worker_templates[f.worker_instance_types[0]]
        self.workers = aws.autoscaling.Group(
            f"{name}-workers",
            min_size=held(f.worker_min_size),
            max_size=0 if closed else f.worker_max_size,
            # spareNodes are extra desired capacity, not a warm pool: PutWarmPool refuses
            # a group with a mixed instances policy or spot ("Warm pools for Amazon EC2
            # Auto Scaling", https://docs.aws.amazon.com/autoscaling/ec2/userguide/
            # ec2-auto-scaling-warm-pools.html; API reference PutWarmPool), and this group
            # has both. A spare is thus an in-service node, booted with the image pulled,
            # billed and priced like the others (infra/estimate.py).
            desired_capacity=held(f.group_desired_size),
            vpc_zone_identifiers=subnet_ids,
            placement_group=self.placement_group.id if self.placement_group else None,
            capacity_rebalance=True,
            mixed_instances_policy=aws.autoscaling.GroupMixedInstancesPolicyArgs(
                instances_distribution=aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                    on_demand_base_capacity=f.on_demand_base_capacity,
                    on_demand_percentage_above_base_capacity=f.on_demand_percent_above_base,
                    # On-demand nodes are the first type, in the order the stack lists them.
                    on_demand_allocation_strategy="prioritized",
                    spot_allocation_strategy=f.spot_allocation_strategy,
                ),
                launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                    launch_template_specification=spec(first),
                    overrides=[
                        aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(
                            instance_type=t, weighted_capacity="1", launch_template_specification=spec(lt)
                        )
                        for t, lt in self.worker_templates.items()
                    ],
                ),
            ),
            **self._common(f"{name}-workers", "worker", WORKER_REPLACEMENT),
            opts=group_o,
        )
        self.hooks = [
            self._termination_hook(f"{name}-coordinator", self.coordinator),
            self._termination_hook(f"{name}-workers", self.workers),
        ]
        self.register_outputs({"coordinator_group": self.coordinator.name, "worker_group": self.workers.name})

    def _launch_template(
        self,
        name: str,
        role: str,
        instance_type: str,
        security_group_id: pulumi.Input[str],
        profiles: dict[str, aws.iam.InstanceProfile],
        user_data: dict[str, pulumi.Output[str]],
    ) -> aws.ec2.LaunchTemplate:
        s = self._settings
        f = s.fleet
        network = dict(vpc_security_group_ids=[security_group_id])
        if f.efa_enabled:
            # With EFA interfaces the security groups move onto the interfaces.
            network = dict(
                network_interfaces=efa_interfaces(catalog.instance(s.cloud, instance_type), security_group_id)
            )
        tags = {**s.all_tags(), "Name": f"{s.name}-{role}", "ftfleet:role": role}
        return aws.ec2.LaunchTemplate(
            name,
            **names.generated("aws:ec2/launchTemplate:LaunchTemplate", name),
            description=f"{s.name} {role} nodes ({instance_type})",
            image_id=self._image_id,
            instance_type=instance_type,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profiles[role].arn),
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",  # IMDSv2 only
                # One hop: the trainer container shares the host's network (--network
                # host), so nothing behind a bridge or a further hop can reach the
                # instance's credentials.
                http_put_response_hop_limit=IMDS_HOP_LIMIT,
                instance_metadata_tags="enabled",
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=ROOT_DEVICE,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=f.root_volume_gib,
                        volume_type="gp3",
                        iops=ROOT_IOPS,
                        throughput=ROOT_THROUGHPUT_MIBPS,
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            user_data=user_data[role].apply(lambda text: base64.b64encode(text.encode()).decode()),
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=tags)
                for kind in ("instance", "volume", "network-interface")
            ],
            update_default_version=True,
            **network,
            opts=pulumi.ResourceOptions.merge(self._o, pulumi.ResourceOptions(depends_on=self._depends_on)),
        )

    def _common(self, name: str, role: str, replacement: Replacement) -> dict:
        s = self._settings
        return dict(
            health_check_type="EC2",
            # GPU spot capacity can take longer than Pulumi's default 10-minute wait; the
            # group keeps trying on its own, so do not fail the deployment over it.
            wait_for_capacity_timeout="0",
            health_check_grace_period=600,
            default_instance_warmup=600,
            # Health-check replacements and refreshes alike launch before they terminate.
            instance_maintenance_policy=aws.autoscaling.GroupInstanceMaintenancePolicyArgs(
                min_healthy_percentage=replacement.min_healthy, max_healthy_percentage=replacement.max_healthy
            ),
            instance_refresh=aws.autoscaling.GroupInstanceRefreshArgs(
                strategy="Rolling",
                preferences=aws.autoscaling.GroupInstanceRefreshPreferencesArgs(
                    min_healthy_percentage=replacement.min_healthy,
                    max_healthy_percentage=replacement.max_healthy,
                    instance_warmup="600",
                    skip_matching=True,
                    auto_rollback=False,
                ),
                triggers=["tag"],
            ),
            tags=[
                aws.autoscaling.GroupTagArgs(key=k, value=v, propagate_at_launch=True)
                for k, v in {**s.all_tags(), "ftfleet:role": role}.items()
            ],
        )

    def _termination_hook(self, name: str, group: aws.autoscaling.Group) -> aws.autoscaling.LifecycleHook:
        # Every termination (spot reclaim, scale-in, refresh) waits for the trainer's
        # commit marker, or for the heartbeat timeout. A standalone hook rather than the
        # group's initial_lifecycle_hooks, which only apply when the group is created.
        return aws.autoscaling.LifecycleHook(
            f"{name}-termination",
            name=TERMINATION_HOOK,
            autoscaling_group_name=group.name,
            lifecycle_transition="autoscaling:EC2_INSTANCE_TERMINATING",
            default_result="CONTINUE",
            heartbeat_timeout=self._settings.fleet.termination_hook_seconds,
            opts=self._o,
        )
