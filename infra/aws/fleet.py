"""GpuFleet: an on-demand coordinator group and a spot-heavy worker group.

The coordinator group holds exactly one on-demand node: it hosts the c10d rendezvous
and publishes its address (infra/aws/userdata.py), so it must not be interrupted by
the spot market. Workers use a mixed-instances policy: an on-demand base, a percentage
of on-demand above it, and spot spread over every configured type with the configured
allocation strategy. Capacity rebalancing starts a replacement when EC2 signals that
a spot node is at risk, and a termination lifecycle hook holds every terminating node
(spot reclaim, scale-in, refresh) long enough for the trainer's emergency checkpoint.
"""

from __future__ import annotations

import base64

import pulumi
import pulumi_aws as aws

from ftfleet import contract
from ftfleet.infra.settings import Settings

ROOT_DEVICE = "/dev/sda1"  # root device name of the Ubuntu-based Deep Learning AMIs
TERMINATION_HOOK = contract.TERMINATION_HOOK_NAME  # lifecycle_handoff and the node match on it


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
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("ftfleet:aws:GpuFleet", name, None, opts)
        self._o = pulumi.ResourceOptions(parent=self, provider=provider)
        self._settings = settings
        f = settings.fleet
        self.placement_group = None
        if f.placement_group:
            self.placement_group = aws.ec2.PlacementGroup(f"{name}-placement", strategy="cluster", opts=self._o)
            # A cluster placement group lives in one zone: use the first zone's subnet,
            # the same zone as the FSx file system.
            subnet_ids = subnet_ids[:1]

        templates = {
            role: self._launch_template(
                f"{name}-{role}",
                role,
                f.coordinator_instance_type if role == "coordinator" else f.worker_instance_types[0],
                security_group_id,
                profiles[role],
                user_data[role],
            )
            for role in ("coordinator", "worker")
        }

        coordinator_lt = templates["coordinator"]
        self.coordinator = aws.autoscaling.Group(
            f"{name}-coordinator",
            min_size=1,
            max_size=1,
            desired_capacity=1,
            vpc_zone_identifiers=subnet_ids,
            placement_group=self.placement_group.id if self.placement_group else None,
            # A plain launch template without market options: on-demand only.
            launch_template=aws.autoscaling.GroupLaunchTemplateArgs(
                id=coordinator_lt.id, version=coordinator_lt.latest_version.apply(str)
            ),
            **self._common(f"{name}-coordinator", "coordinator"),
            opts=self._o,
        )

        worker_lt = templates["worker"]
        self.workers = aws.autoscaling.Group(
            f"{name}-workers",
            min_size=f.worker_min_size,
            max_size=f.worker_max_size,
            desired_capacity=f.worker_desired_size,
            vpc_zone_identifiers=subnet_ids,
            placement_group=self.placement_group.id if self.placement_group else None,
            capacity_rebalance=True,
            mixed_instances_policy=aws.autoscaling.GroupMixedInstancesPolicyArgs(
                instances_distribution=aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                    on_demand_base_capacity=f.on_demand_base_capacity,
                    on_demand_percentage_above_base_capacity=f.on_demand_percent_above_base,
                    on_demand_allocation_strategy="prioritized",
                    spot_allocation_strategy=f.spot_allocation_strategy,
                ),
                launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                    launch_template_specification=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                        launch_template_id=worker_lt.id, version=worker_lt.latest_version.apply(str)
                    ),
                    overrides=[
                        aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(
                            instance_type=t, weighted_capacity="1"
                        )
                        for t in f.worker_instance_types
                    ],
                ),
            ),
            **self._common(f"{name}-workers", "worker"),
            opts=self._o,
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
        profile: aws.iam.InstanceProfile,
        user_data: pulumi.Output[str],
    ) -> aws.ec2.LaunchTemplate:
        s = self._settings
        f = s.fleet
        network = dict(vpc_security_group_ids=[security_group_id])
        if f.efa_enabled:
            # With an EFA interface the security groups move onto the interface. One EFA
            # on network card 0 carries NCCL; more cards need more interfaces.
            network = dict(
                network_interfaces=[
                    aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                        device_index=0,
                        network_card_index=0,
                        interface_type="efa",
                        security_groups=[security_group_id],
                        delete_on_termination="true",
                    )
                ]
            )
        tags = {**s.all_tags(), "Name": f"{s.name}-{role}", "ftfleet:role": role}
        return aws.ec2.LaunchTemplate(
            name,
            description=f"{s.name} {role} nodes",
            image_id=f.image,
            instance_type=instance_type,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profile.arn),
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",  # IMDSv2 only
                # 2 hops: the trainer container reads spot notices through docker's bridge.
                http_put_response_hop_limit=2,
                instance_metadata_tags="enabled",
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=ROOT_DEVICE,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=f.root_volume_gib,
                        volume_type="gp3",
                        iops=6000,
                        throughput=500,
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            user_data=user_data.apply(lambda text: base64.b64encode(text.encode()).decode()),
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=tags)
                for kind in ("instance", "volume", "network-interface")
            ],
            update_default_version=True,
            **network,
            opts=self._o,
        )

    def _common(self, name: str, role: str) -> dict:
        s = self._settings
        return dict(
            health_check_type="EC2",
            # GPU spot capacity can take longer than Pulumi's default 10-minute wait; the
            # group keeps trying on its own, so do not fail the deployment over it.
            wait_for_capacity_timeout="0",
            health_check_grace_period=600,
            default_instance_warmup=600,
            instance_refresh=aws.autoscaling.GroupInstanceRefreshArgs(
                strategy="Rolling",
                preferences=aws.autoscaling.GroupInstanceRefreshPreferencesArgs(
                    min_healthy_percentage=50, instance_warmup="600", skip_matching=True, auto_rollback=False
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
