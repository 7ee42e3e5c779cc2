"""GpuFleet: instance templates and regional managed instance groups.

* The coordinator: one on-demand (STANDARD) VM in a group of one, in the file
  system's zone. Its group is stateful: a per-instance config pins the reserved
  internal address of the Network component to nic0, so every replacement
  (auto-healing, an update, a host error) comes back with the same address, and the
  workers' rendezvous endpoint never changes. Stateful groups keep instance names, so
  updates RECREATE in place with no surge.
* Spot workers: a group whose template is Spot (provisioning model SPOT, preemptible,
  no automatic restart, TERMINATE on host maintenance) and deletes the VM on
  preemption: a STOPped Spot VM keeps its paid disk and the group would only restart
  it where capacity just ran out, while a deleted one is recreated wherever capacity
  is. Several machine types spread over the instance flexibility policy.
* On-demand workers (onDemandBaseCapacity > 0): the same with a STANDARD template.

GPU nodes stay in the file system's zone when the interconnect needs one zone (A3) or
gcpSingleZone is set; otherwise the Spot group spreads over the listed zones with the
BALANCED shape. Every group auto-heals on an HTTP check of the node health agent
(infra/gcp/boot/node_health.py: GPUs, the file system, the container runtime; never
the trainer). Templates boot one pinned image (gcpImage). Updates are opportunistic:
a new template reaches a VM only when it is recreated anyway (preemption, repair,
resize), so no `pulumi up` rolls a running job's fleet, and the VM is then replaced
rather than restarted (a restarted GPU VM keeps a wedged driver and the old boot
script's state).
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from ftfleet.infra.gcp import boot, machines
from ftfleet.infra.gcp.settings import GcpSettings

c = gcp.compute
#: Time for a new node to install the GPU container toolkit and the file system client
#: and mount before its health check counts (the agent needs neither the image nor
#: the trainer).
INITIAL_DELAY_SECONDS = 1200
NIC = "nic0"


class GpuFleet(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        settings: GcpSettings,
        subnet: pulumi.Input[str],
        node_tag: str,
        coordinator_address: c.Address,
        service_account: pulumi.Input[str],
        image: pulumi.Input[str],
        scripts: dict[str, pulumi.Output[str]],
        provider: gcp.Provider,
        opts: pulumi.ResourceOptions | None = None,
        held: pulumi.Input[str] = "",
    ):
        """``scripts`` maps `startup-<role>-<SPOT|STANDARD>` and `shutdown-<SPOT|STANDARD>`
        to rendered boot scripts (infra/gcp/boot.py). ``held``: the lease holder the run
        trains with when it is another stack's (infra/gcp/run_location.py): the worker
        groups are then held at 0."""
        self._held = held
        super().__init__("ftfleet:gcp:GpuFleet", name, None, opts)
        self._o = pulumi.ResourceOptions(parent=self, provider=provider)
        self._s = settings
        f = settings.fleet
        zones = settings.network.zones
        fleet_zones = [zones[0]] if f.single_zone else list(zones)

        # Health is "this node can run the job" (GPUs, the file system, the container
        # runtime), answered by the node health agent from boot to shutdown; never
        # "a step is running" (the trainer's port is closed in rendezvous, during
        # restarts and after a finished run, and probing it recreated healthy nodes).
        self.health_check = c.RegionHealthCheck(
            f"{name}-node",
            name=f"{settings.name}-node",
            region=settings.region,
            description="the node health agent answers 200 (GPUs, file system, container runtime)",
            http_health_check=c.RegionHealthCheckHttpHealthCheckArgs(
                port=boot.HEALTH_PORT, request_path=boot.HEALTH_PATH
            ),
            check_interval_sec=30,
            timeout_sec=10,
            healthy_threshold=1,
            unhealthy_threshold=4,
            opts=self._o,
        )

        def template(role: str, machine_type: str, model: str) -> c.RegionInstanceTemplate:
            return self._template(
                f"{name}-{role}",
                role,
                machine_type,
                model,
                subnet,
                node_tag,
                service_account,
                image,
                scripts[f"startup-{role.split('-')[0]}-{model}"],
                scripts[f"shutdown-{model}"],
            )

        self.templates = {"coordinator": template("coordinator", f.coordinator_machine_type, "STANDARD")}
        # The per-instance config below creates the one coordinator VM and raises the
        # group's target size to 1 by itself. A group declared with target size 1 would
        # also create a VM of its own, randomly named and without the reserved address
        # (the provider's documented behaviour with per-instance configs): the group
        # is declared at 0 and never resized by an update.
        self.coordinator = self._group(
            f"{name}-coordinator", "coordinator", self.templates["coordinator"], 0, [zones[0]], stateful=True
        )
        # The reserved address, kept on nic0 of the one coordinator VM through every
        # recreation ("Configuring stateful IP addresses in MIGs"). A standby has no
        # coordinator VM until it is active (standbyActive).
        self.coordinator_config = None
        standby = settings.standby
        if standby is not None and not standby.active:
            self._workers(name, template, f, fleet_zones, standby=True)
            return
        self.coordinator_config = c.RegionPerInstanceConfig(
            f"{name}-coordinator-address",
            region=settings.region,
            region_instance_group_manager=self.coordinator.name,
            name=f"{settings.name}-coordinator",
            preserved_state=c.RegionPerInstanceConfigPreservedStateArgs(
                internal_ips=[
                    c.RegionPerInstanceConfigPreservedStateInternalIpArgs(
                        interface_name=NIC,
                        auto_delete="NEVER",
                        ip_address=c.RegionPerInstanceConfigPreservedStateInternalIpIpAddressArgs(
                            address=coordinator_address.self_link
                        ),
                    )
                ]
            ),
            minimal_action="REPLACE",
            remove_instance_on_destroy=True,
            opts=self._o,
        )

        self._workers(name, template, f, fleet_zones, standby=standby is not None)

    def _workers(self, name: str, template, f, fleet_zones: list[str], *, standby: bool) -> None:
        """The worker groups; a standby's at 0, their size the failover's from creation on."""
        self.workers: dict[str, c.RegionInstanceGroupManager] = {}
        # spareNodes: booted workers beyond the job's, in the main group (Spot when it is).
        main = (f.spot_workers if f.spot else f.worker_desired_size) + f.spare_nodes
        groups = [("workers", f.worker_provisioning_model, main)]
        if f.spot and f.on_demand_workers:
            groups.append(("workers-ondemand", "STANDARD", f.on_demand_workers))
        for role, model, size in groups:
            self.templates[role] = template(role, f.worker_machine_types[0], model)
            target = 0 if standby else pulumi.Output.from_input(self._held).apply(lambda h, n=size: 0 if h else n)
            self.workers[role] = self._group(
                f"{name}-{role}", role, self.templates[role], target, fleet_zones, sized_by_hand=standby
            )
        self.register_outputs(
            {
                "coordinator_group": self.coordinator.name,
                "worker_groups": [g.name for g in self.workers.values()],
            }
        )

    def _template(
        self,
        name: str,
        role: str,
        machine_type: str,
        model: str,
        subnet: pulumi.Input[str],
        node_tag: str,
        service_account: pulumi.Input[str],
        image: pulumi.Input[str],
        startup: pulumi.Output[str],
        shutdown: pulumi.Output[str],
    ) -> c.RegionInstanceTemplate:
        s, f = self._s, self._s.fleet
        spot = model == "SPOT"
        series = machines.series(machine_type)
        scheduling = c.RegionInstanceTemplateSchedulingArgs(
            provisioning_model=model,
            preemptible=spot,
            # Spot VMs cannot restart automatically; GPU VMs cannot live-migrate.
            automatic_restart=False if spot else f.automatic_restart,
            on_host_maintenance="TERMINATE",
            instance_termination_action="DELETE" if spot else None,
            preemption_notice_duration=(
                c.RegionInstanceTemplateSchedulingPreemptionNoticeDurationArgs(seconds=f.preemption_notice_seconds)
                if spot and f.preemption_notice_seconds
                else None
            ),
        )
        return c.RegionInstanceTemplate(
            name,
            # Templates are immutable: every change creates a new one before the old
            # one is deleted, which needs a fresh name each time.
            name_prefix=f"{s.name}-{role}-",
            region=s.region,
            description=f"{s.name} {role} nodes ({model})",
            machine_type=machine_type,
            guest_accelerators=(
                [c.RegionInstanceTemplateGuestAcceleratorArgs(type=f.guest_gpu_type, count=f.guest_gpu_count)]
                if not series.builtin_gpus
                else None
            ),
            scheduling=scheduling,
            disks=[
                c.RegionInstanceTemplateDiskArgs(
                    source_image=image,
                    boot=True,
                    auto_delete=True,
                    disk_size_gb=f.boot_disk_gib,
                    disk_type=series.boot_disk_type,
                )
            ],
            network_interfaces=[c.RegionInstanceTemplateNetworkInterfaceArgs(subnetwork=subnet, nic_type="GVNIC")],
            service_account=c.RegionInstanceTemplateServiceAccountArgs(
                email=service_account, scopes=["https://www.googleapis.com/auth/cloud-platform"]
            ),
            # Secure Boot would refuse the unsigned Lustre/DAOS kernel modules.
            shielded_instance_config=c.RegionInstanceTemplateShieldedInstanceConfigArgs(
                enable_secure_boot=False, enable_vtpm=True, enable_integrity_monitoring=True
            ),
            metadata={
                "startup-script": startup,
                "shutdown-script": shutdown,
                "enable-oslogin": "TRUE",
                "block-project-ssh-keys": "TRUE",
            },
            tags=[node_tag],
            labels={"ftfleet-role": role},
            opts=self._o,
        )

    def _group(
        self,
        name: str,
        role: str,
        template: c.RegionInstanceTemplate,
        size: pulumi.Input[int],
        zones: list[str],
        stateful: bool = False,
        sized_by_hand: bool = False,
    ) -> c.RegionInstanceGroupManager:
        s, f = self._s, self._s.fleet
        single = len(zones) == 1 or f.single_zone
        flexible = role == "workers" and len(f.worker_machine_types) > 1
        return c.RegionInstanceGroupManager(
            name,
            name=f"{s.name}-{role}",
            region=s.region,
            base_instance_name=f"{s.name}-{role}",
            description=f"{s.name} {role}",
            versions=[c.RegionInstanceGroupManagerVersionArgs(name=role, instance_template=template.self_link)],
            target_size=size,
            distribution_policy_zones=zones,
            distribution_policy_target_shape="ANY_SINGLE_ZONE" if single else "BALANCED",
            instance_flexibility_policy=(
                c.RegionInstanceGroupManagerInstanceFlexibilityPolicyArgs(
                    instance_selections=[
                        c.RegionInstanceGroupManagerInstanceFlexibilityPolicyInstanceSelectionArgs(
                            name="gpu-types", rank=1, machine_types=list(f.worker_machine_types)
                        )
                    ]
                )
                if flexible
                else None
            ),
            auto_healing_policies=c.RegionInstanceGroupManagerAutoHealingPoliciesArgs(
                health_check=self.health_check.id, initial_delay_sec=INITIAL_DELAY_SECONDS
            ),
            instance_lifecycle_policy=c.RegionInstanceGroupManagerInstanceLifecyclePolicyArgs(
                default_action_on_failure="REPAIR", force_update_on_repair="YES"
            ),
            # A new template (a new image, trainer tag or boot script) reaches VMs as
            # they are recreated for their own reasons (preemption, repair, resize),
            # never by rolling a running job's fleet; roll on purpose with
            # `gcloud compute instance-groups managed rolling-action replace`.
            update_policy=c.RegionInstanceGroupManagerUpdatePolicyArgs(
                type="OPPORTUNISTIC",
                minimal_action="REPLACE",
                most_disruptive_allowed_action="REPLACE",
                # A regional group's fixed surge and unavailability are 0 or at least its
                # number of zones; ANY_SINGLE_ZONE and BALANCED need redistribution off.
                instance_redistribution_type="NONE",
                replacement_method="RECREATE" if stateful else "SUBSTITUTE",
                max_surge_fixed=0 if stateful else len(zones),
                max_unavailable_fixed=len(zones),
            ),
            stateful_internal_ips=(
                [c.RegionInstanceGroupManagerStatefulInternalIpArgs(interface_name=NIC, delete_rule="NEVER")]
                if stateful
                else None
            ),
            # GPU capacity can take longer than any deployment should wait.
            wait_for_instances=False,
            # A stateful group's size is its per-instance configs': an update must not
            # resize it back to the declared 0.
            opts=pulumi.ResourceOptions.merge(self._o, pulumi.ResourceOptions(ignore_changes=["targetSize"]))
            if stateful or sized_by_hand
            else self._o,
        )
