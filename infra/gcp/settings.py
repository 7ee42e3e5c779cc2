"""Typed, validated settings of a GCP stack (`ftfleet:cloud: gcp`).

infra/settings.py reads the keys both clouds share and hands a GCP stack to
:func:`parse`, which returns :class:`GcpSettings` or raises ConfigError with one line
that names the key and the fix. Nothing here imports Pulumi.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import re

from ftfleet.errors import ConfigError
from ftfleet.infra import catalog
from ftfleet.infra.gcp import keys, locations, machines

# _Reader, _err, _prefix and TrainerSettings are the shared parsing helpers of
# infra/settings.py; importing them (not copying) keeps one behaviour for both clouds.
from ftfleet.infra.settings import PROJECT, TrainerSettings, _err, _prefix, _Reader

STORAGE_KINDS = ("managed-lustre", "parallelstore")
#: Managed Lustre performance tiers, MB/s per TiB -> (minimum GiB, maximum GiB, step GiB,
#: (threshold GiB, step above it) or None). "Performance tiers",
#: https://cloud.google.com/managed-lustre/docs/performance-tiers (read 2026-11-22).
LUSTRE_TIERS: dict[int, tuple[int, int, int, tuple[int, int] | None]] = {
    1000: (9_000, 10_008_000, 9_000, (1_530_000, 72_000)),
    500: (18_000, 20_016_000, 18_000, (3_060_000, 144_000)),
    250: (36_000, 40_032_000, 36_000, (6_120_000, 288_000)),
    125: (72_000, 12_240_000, 72_000, None),
}
#: Parallelstore: 12 to 100 TiB in steps of 4 TiB, which the API counts as 12,000 to
#: 100,000 GiB in steps of 4,000 ("Create a Parallelstore instance").
PARALLELSTORE_GIB = (12_000, 100_000, 4_000)
PARALLELSTORE_DEPLOYMENTS = ("SCRATCH", "PERSISTENT")
STRIPE_LEVELS = ("min", "balanced", "max")
PROVISIONING_MODELS = ("SPOT", "STANDARD")
#: ftfleet's cap on the extended preemption notice: the trainer's emergency checkpoint
#: is sized for a notice of about two minutes (AWS's), and Google's documentation we
#: read names no upper bound.
MAX_PREEMPTION_NOTICE_S = 120
#: The subnet and the private services access range are /20 blocks of vpcCidr.
BLOCK_PREFIX = 20
LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GcpNetworkSettings:
    zones: tuple[str, ...]
    """The first zone holds the file system and, with single_zone, every GPU node."""
    subnet_cidr: str
    services_cidr: str
    """Private services access range (VPC peering with the file system's producer)."""
    coordinator_ip: str
    """Reserved internal address the coordinator keeps across replacements."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GcpFleetSettings:
    coordinator_machine_type: str
    worker_machine_types: tuple[str, ...]
    worker_min_size: int
    worker_max_size: int
    worker_desired_size: int
    on_demand_base_capacity: int
    worker_provisioning_model: str
    automatic_restart: bool
    preemption_notice_seconds: int
    single_zone: bool
    guest_gpu_type: str
    """Empty for machine types that come with their GPUs."""
    guest_gpu_count: int
    gpus_per_node: int
    gpu_model: str
    image_project: str
    image_family: str
    boot_disk_gib: int

    @property
    def spot_workers(self) -> int:
        return self.worker_desired_size - self.on_demand_base_capacity if self.spot else 0

    @property
    def on_demand_workers(self) -> int:
        return self.worker_desired_size - self.spot_workers

    @property
    def spot(self) -> bool:
        return self.worker_provisioning_model == "SPOT"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GcpStorageSettings:
    kind: str
    mount_point: str
    lustre_capacity_gib: int
    lustre_throughput_per_tib: int
    parallelstore_capacity_gib: int
    parallelstore_deployment_type: str
    parallelstore_file_stripe_level: str
    parallelstore_directory_stripe_level: str

    @property
    def capacity_gib(self) -> int:
        return self.lustre_capacity_gib if self.kind == "managed-lustre" else self.parallelstore_capacity_gib


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GcsBucketSettings:
    location: str
    data_locations: tuple[str, ...]
    """The two regions of a configurable dual-region; empty for a predefined one."""
    checkpoint_prefix: str
    pinned_prefix: str
    nearline_days: int
    coldline_days: int
    expire_checkpoints_days: int
    noncurrent_version_expiry_days: int
    soft_delete_days: int
    turbo_replication: bool
    cmek: bool


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GcpRemediationSettings:
    spot_interruption: bool
    unhealthy_nodes: bool
    storage_drift: bool
    replication_lag: bool
    replication_lag_alarm_seconds: int
    unhealthy_node_grace_seconds: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class GcpSettings:
    stack: str
    cloud: str
    region: str
    replica_region: str
    """The second region of the checkpoint bucket's dual-region."""
    network: GcpNetworkSettings
    fleet: GcpFleetSettings
    storage: GcpStorageSettings
    buckets: GcsBucketSettings
    remediation: GcpRemediationSettings
    trainer: TrainerSettings
    tags: dict[str, str]
    """Extra labels for every resource, after ftfleet's own."""

    @property
    def name(self) -> str:
        return f"{PROJECT}-{self.stack}"

    def labels(self) -> dict[str, str]:
        """GCP labels allow no colons: ftfleet's AWS tag keys become dashes here."""
        return {"ftfleet-stack": self.stack, "ftfleet-run": self.trainer.run_id, "managed-by": "pulumi", **self.tags}

    def all_tags(self) -> dict[str, str]:
        return self.labels()


def parse(r: _Reader, *, stack: str, region: str | None) -> GcpSettings:
    keys.refuse_on_gcp(r.raw)
    if not region:
        raise ConfigError("gcp:region is required: set it with `pulumi config set gcp:region <region>`")
    _known_region(region, "gcp:region")
    replica = r.str("replicaRegion")
    if not replica:
        raise _err("replicaRegion", "is required: the second region of the checkpoint bucket's dual-region")
    _known_region(replica, f"{PROJECT}:replicaRegion")
    if replica == region:
        raise _err("replicaRegion", f"equals gcp:region ({region}); a dual-region needs two regions")
    dual = locations.dual_region(region, replica)
    if dual is None:
        partners = ", ".join(locations.dual_region_partners(region)) or "none"
        raise _err(
            "replicaRegion",
            f"is {replica}, which forms no Cloud Storage dual-region with {region}; "
            f"regions that pair with {region}: {partners}",
        )
    return GcpSettings(
        stack=stack,
        cloud="gcp",
        region=region,
        replica_region=replica,
        network=_network(r, region),
        fleet=_fleet(r),
        storage=_storage(r),
        buckets=_buckets(r, *dual),
        remediation=GcpRemediationSettings(
            spot_interruption=r.bool("remediationSpotInterruption"),
            unhealthy_nodes=r.bool("remediationUnhealthyNodes"),
            storage_drift=r.bool("remediationStorageDrift"),
            replication_lag=r.bool("remediationReplicationLag"),
            replication_lag_alarm_seconds=r.int("replicationLagAlarmSeconds", minimum=60),
            unhealthy_node_grace_seconds=r.int("unhealthyNodeGraceSeconds", minimum=60),
        ),
        trainer=_trainer(r, stack),
        tags=_labels(r),
    )


def _known_region(region: str, key: str) -> None:
    if region not in locations.REGIONS:
        close = difflib.get_close_matches(region, sorted(locations.REGIONS), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise ConfigError(
            f"{key} is {region!r}, which is not a Compute Engine region; {hint}"
            f"see infra/gcp/locations.py (as of {locations.TABLES_AS_OF})"
        )


def _network(r: _Reader, region: str) -> GcpNetworkSettings:
    zones = r.list("availabilityZones")
    if not zones:
        raise _err("availabilityZones", f"is empty; list at least one zone of {region}, e.g. {region}-a")
    for zone in zones:
        if locations.zone_region(zone) != region:
            raise _err("availabilityZones", f"contains {zone!r}, which is not a zone of {region}")
    if len(set(zones)) != len(zones):
        raise _err("availabilityZones", "lists a zone twice; list each zone once")
    cidr = r.str("vpcCidr")
    try:
        net = ipaddress.IPv4Network(cidr)
    except ValueError:
        raise _err("vpcCidr", f"is {cidr!r}; give an IPv4 CIDR such as 10.40.0.0/16") from None
    if net.prefixlen > BLOCK_PREFIX - 1:
        raise _err("vpcCidr", f"{cidr} is too small for a /{BLOCK_PREFIX} subnet and a /{BLOCK_PREFIX} services range")
    blocks = list(net.subnets(new_prefix=BLOCK_PREFIX))
    subnet = blocks[0]
    return GcpNetworkSettings(
        zones=zones,
        subnet_cidr=str(subnet),
        services_cidr=str(blocks[-1]),
        # The first two addresses of a subnet belong to Google (network and gateway).
        coordinator_ip=str(subnet.network_address + 10),
    )


def _gpu_facts(machine_type: str, key: str, gpu_type: str, gpu_count: int) -> tuple[int, str]:
    """(GPUs per node, GPU model) of one machine type, or the one-line refusal."""
    spec = catalog.instance("gcp", machine_type)
    series = machines.series(machine_type)
    if spec is None or series is None:
        raise _err(
            key,
            f"contains unknown machine type {machine_type!r}; known gcp types: "
            f"{', '.join(catalog.instance_names('gcp'))} (add new ones to infra/catalog.json)",
        )
    if series.builtin_gpus:
        if gpu_type:
            raise _err(
                "gcpGpuType",
                f"is {gpu_type!r}, but {machine_type} comes with its own GPUs ({spec.gpus} x {spec.gpu}) "
                "and takes no guest accelerator; remove gcpGpuType and gcpGpuCount",
            )
        return spec.gpus, spec.gpu
    allowed = machines.N1_GUEST_GPUS
    if not gpu_type:
        raise _err(
            "gcpGpuType",
            f"is required: {machine_type} has no GPUs of its own; set one of {', '.join(sorted(allowed))}",
        )
    if gpu_type not in allowed:
        known = "" if gpu_type in machines.KNOWN_GPU_TYPES else " (not a Compute Engine GPU type)"
        raise _err(
            "gcpGpuType",
            f"is {gpu_type!r}{known}, which {machine_type} cannot take; N1 machine types take "
            f"{', '.join(sorted(allowed))} (L4, A100 and H100 come with g2, a2 and a3 machine types)",
        )
    if gpu_count not in allowed[gpu_type]:
        counts = ", ".join(map(str, allowed[gpu_type]))
        raise _err("gcpGpuCount", f"is {gpu_count}; {gpu_type} attaches to N1 in counts of {counts}")
    return gpu_count, gpu_type


def _fleet(r: _Reader) -> GcpFleetSettings:
    types = r.list("workerInstanceTypes")
    if not types:
        raise _err("workerInstanceTypes", "is empty; list at least one GPU machine type")
    if len(set(types)) != len(types):
        raise _err("workerInstanceTypes", "lists a type twice; list each type once")
    coordinator = r.str("coordinatorInstanceType") or types[0]
    gpu_type = r.str("gcpGpuType")
    gpu_count = r.int("gcpGpuCount", minimum=0)
    facts = {
        name: _gpu_facts(name, key, gpu_type, gpu_count)
        for key, names in (("workerInstanceTypes", types), ("coordinatorInstanceType", (coordinator,)))
        for name in names
    }
    if len({f[1] for f in facts.values()}) != 1 or len({f[0] for f in facts.values()}) != 1:
        shapes = ", ".join(f"{n}: {c} x {m}" for n, (c, m) in facts.items())
        raise _err(
            "workerInstanceTypes",
            f"mixes GPU models or counts ({shapes}); every node of one job needs the same GPUs "
            "(torchrun's --nproc-per-node, and steps paced by the slowest node)",
        )
    gpus, model = facts[types[0]]
    single_zone = r.bool("gcpSingleZone")
    if not single_zone:
        for name in facts:
            if machines.series(name).single_zone:
                raise _err(
                    "gcpSingleZone",
                    f"is false, but {name} reaches its GPU interconnect only within one zone; set it true",
                )
    max_size = r.int("workerMaxSize", minimum=1)
    min_size = r.int("workerMinSize", minimum=0)
    desired = r.int("workerDesiredSize", minimum=0)
    if min_size > max_size:
        raise _err("workerMinSize", f"({min_size}) exceeds workerMaxSize ({max_size})")
    if not min_size <= desired <= max_size:
        raise _err(
            "workerDesiredSize",
            f"({desired}) must lie between workerMinSize ({min_size}) and workerMaxSize ({max_size})",
        )
    base = r.int("onDemandBaseCapacity", minimum=0)
    if base > desired:
        raise _err("onDemandBaseCapacity", f"({base}) exceeds workerDesiredSize ({desired}); lower it")
    model_key = r.str("gcpWorkerProvisioningModel").upper()
    if model_key not in PROVISIONING_MODELS:
        raise _err("gcpWorkerProvisioningModel", f"is {model_key!r}; use SPOT or STANDARD")
    restart = r.bool("gcpAutomaticRestart")
    if restart and model_key == "SPOT":
        raise _err(
            "gcpAutomaticRestart",
            "is true, but the worker template is SPOT and Compute Engine requires automaticRestart=false "
            "for Spot VMs; set it false (or gcpWorkerProvisioningModel: STANDARD)",
        )
    notice = r.int("gcpPreemptionNoticeSeconds", minimum=0, maximum=MAX_PREEMPTION_NOTICE_S)
    if notice and model_key != "SPOT":
        raise _err("gcpPreemptionNoticeSeconds", "applies to Spot workers only; set it 0 for STANDARD workers")
    image_project, image_family = r.str("gcpImageProject"), r.str("gcpImageFamily")
    for key, value in (("gcpImageProject", image_project), ("gcpImageFamily", image_family)):
        if not re.fullmatch(r"[a-z][a-z0-9-]{2,62}", value):
            raise _err(key, f"is {value!r}; give a Compute Engine image project and family (lowercase, dashes)")
    return GcpFleetSettings(
        coordinator_machine_type=coordinator,
        worker_machine_types=types,
        worker_min_size=min_size,
        worker_max_size=max_size,
        worker_desired_size=desired,
        on_demand_base_capacity=base,
        worker_provisioning_model=model_key,
        automatic_restart=restart,
        preemption_notice_seconds=notice,
        single_zone=single_zone,
        guest_gpu_type=gpu_type,
        guest_gpu_count=gpu_count if gpu_type else 0,
        gpus_per_node=gpus,
        gpu_model=model,
        image_project=image_project,
        image_family=image_family,
        boot_disk_gib=r.int("rootVolumeGiB", minimum=50, maximum=65536),
    )


def _lustre_capacity(r: _Reader, throughput: int) -> int:
    capacity = r.int("lustreCapacityGiB", minimum=1)
    low, high, step, coarse = LUSTRE_TIERS[throughput]
    tier = f"the {throughput} MB/s/TiB tier"
    if not low <= capacity <= high:
        raise _err("lustreCapacityGiB", f"is {capacity}; {tier} takes {low:,} to {high:,} GiB")
    if coarse and capacity > coarse[0]:
        if capacity % coarse[1]:
            raise _err(
                "lustreCapacityGiB",
                f"is {capacity}; above {coarse[0]:,} GiB {tier} takes multiples of {coarse[1]:,} GiB",
            )
    elif capacity % step:
        below = max(low, capacity // step * step)
        raise _err(
            "lustreCapacityGiB",
            f"is {capacity}; {tier} takes multiples of {step:,} GiB (nearest: {below:,} or {below + step:,})",
        )
    return capacity


def _storage(r: _Reader) -> GcpStorageSettings:
    kind = r.str("gcpStorageKind").lower()
    if kind not in STORAGE_KINDS:
        raise _err("gcpStorageKind", f"is {kind!r}; use one of: {', '.join(STORAGE_KINDS)}")
    throughput = r.int("lustreThroughputPerTiB")
    if throughput not in LUSTRE_TIERS:
        tiers = ", ".join(map(str, sorted(LUSTRE_TIERS)))
        raise _err("lustreThroughputPerTiB", f"is {throughput}; Managed Lustre tiers are {tiers} MB/s per TiB")
    lustre = _lustre_capacity(r, throughput) if kind == "managed-lustre" else r.int("lustreCapacityGiB")
    ps_low, ps_high, ps_step = PARALLELSTORE_GIB
    ps_capacity = r.int("parallelstoreCapacityGiB", minimum=1)
    if kind == "parallelstore" and (not ps_low <= ps_capacity <= ps_high or ps_capacity % ps_step):
        raise _err(
            "parallelstoreCapacityGiB",
            f"is {ps_capacity}; Parallelstore takes {ps_low:,} to {ps_high:,} GiB (12 to 100 TiB) "
            f"in steps of {ps_step:,} GiB",
        )
    deployment = r.str("parallelstoreDeploymentType").upper()
    if deployment not in PARALLELSTORE_DEPLOYMENTS:
        raise _err("parallelstoreDeploymentType", f"is {deployment!r}; use SCRATCH or PERSISTENT")
    stripes = {}
    for key in ("parallelstoreFileStripeLevel", "parallelstoreDirectoryStripeLevel"):
        stripes[key] = r.str(key).lower()
        if stripes[key] not in STRIPE_LEVELS:
            raise _err(key, f"is {stripes[key]!r}; use min, balanced or max")
    mount = r.str("gcpMountPoint")
    if not re.fullmatch(r"/[A-Za-z0-9/_-]+", mount):
        raise _err("gcpMountPoint", f"is {mount!r}; give an absolute path such as /ckpt")
    return GcpStorageSettings(
        kind=kind,
        mount_point=mount.rstrip("/"),
        lustre_capacity_gib=lustre,
        lustre_throughput_per_tib=throughput,
        parallelstore_capacity_gib=ps_capacity,
        parallelstore_deployment_type=deployment,
        parallelstore_file_stripe_level=stripes["parallelstoreFileStripeLevel"],
        parallelstore_directory_stripe_level=stripes["parallelstoreDirectoryStripeLevel"],
    )


def _buckets(r: _Reader, location: str, data_locations: tuple[str, ...]) -> GcsBucketSettings:
    ckpt, pinned = _prefix(r, "checkpointPrefix"), _prefix(r, "pinnedPrefix")
    if ckpt.startswith(pinned) or pinned.startswith(ckpt):
        raise _err(
            "pinnedPrefix",
            f"({pinned}) overlaps checkpointPrefix ({ckpt}); pinned objects must sit outside "
            "the prefix that lifecycle rules age",
        )
    nearline = r.int("gcsNearlineDays", minimum=0)
    coldline = r.int("gcsColdlineDays", minimum=0)
    expire = r.int("expireCheckpointsDays", minimum=0)
    # Nearline bills at least 30 days of storage, Coldline 90 ("Storage classes").
    if nearline and coldline and coldline < nearline + 30:
        raise _err("gcsColdlineDays", f"is {coldline}; it must be at least gcsNearlineDays + 30 ({nearline + 30}) or 0")
    if expire and expire <= max(nearline, coldline):
        raise _err("expireCheckpointsDays", f"is {expire}; it must exceed the storage class transitions or be 0")
    soft_delete = r.int("gcsSoftDeleteDays", minimum=0, maximum=90)
    if 0 < soft_delete < 7:
        raise _err(
            "gcsSoftDeleteDays", f"is {soft_delete}; Cloud Storage keeps soft-deleted objects 7 to 90 days, or 0"
        )
    cmek = r.bool("gcsCmek")
    if cmek and location not in locations.KMS_LOCATIONS:
        raise _err(
            "gcsCmek",
            f"is true, but ftfleet does not know the Cloud KMS location for a bucket in {location}; set it false, "
            f"or pick a dual-region in {', '.join(sorted(locations.KMS_LOCATIONS))}",
        )
    return GcsBucketSettings(
        location=location,
        data_locations=data_locations,
        checkpoint_prefix=ckpt,
        pinned_prefix=pinned,
        nearline_days=nearline,
        coldline_days=coldline,
        expire_checkpoints_days=expire,
        noncurrent_version_expiry_days=r.int("noncurrentVersionExpiryDays", minimum=1),
        soft_delete_days=soft_delete,
        turbo_replication=r.bool("gcsTurboReplication"),
        cmek=cmek,
    )


def _trainer(r: _Reader, stack: str) -> TrainerSettings:
    run_id = r.str("runId") or stack
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", run_id):
        raise _err("runId", f"is {run_id!r}; use lowercase letters, digits and dashes (max 63)")
    image_tag = r.str("trainerImageTag")
    if not image_tag or image_tag == "latest":
        raise _err("trainerImageTag", "must name an immutable release tag (not empty, not 'latest')")
    config = r.str("trainerConfig")
    if not config.startswith("/"):
        raise _err("trainerConfig", f"is {config!r}; give an absolute path inside the image")
    return TrainerSettings(image_tag=image_tag, config=config, run_id=run_id)


def _labels(r: _Reader) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in r.list("tags"):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not LABEL_KEY.fullmatch(key) or not LABEL_VALUE.fullmatch(value):
            raise _err(
                "tags",
                f"contains {item!r}; GCP labels are key=value in lowercase letters, digits, _ and - "
                "(keys start with a letter)",
            )
        if key.startswith(("ftfleet", "goog")):
            raise _err("tags", f"contains reserved key {key!r}; ftfleet and goog prefixes are reserved")
        labels[key] = value
    return labels
