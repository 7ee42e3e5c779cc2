"""Typed, validated stack settings.

`Pulumi.yaml` declares every project key (type, default, description). This module
turns the raw values of one stack into frozen dataclasses, or raises ConfigError with
one line that names the key and the fix. It imports nothing from Pulumi: the Pulumi
program (through infra/config.py) and `ftfleet plan` both call :func:`parse`.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ftfleet import contract, retention
from ftfleet.errors import ConfigError
from ftfleet.infra import catalog, constraints

if TYPE_CHECKING:
    from ftfleet.infra.gcp.settings import GcpSettings

PROJECT = "ftfleet"
PULUMI_YAML = Path(__file__).resolve().parent.parent / "Pulumi.yaml"

SPOT_STRATEGIES = ("price-capacity-optimized", "capacity-optimized", "capacity-optimized-prioritized", "lowest-price")
FSX_THROUGHPUTS = (125, 250, 500, 1000)
FSX_COMPRESSIONS = ("LZ4", "NONE")
CLOUDS = contract.CLOUDS
CLOUD_TRAIL_MODES = ("create", "existing")
IMAGE_REPLICATION_MODES = ("create", "existing")
STANDBY_FAST_TIERS = ("kept", "on-failover")
#: An AWS stack's name: every physical name derives from it, and S3 and ECR take only
#: lowercase letters, digits and hyphens, CloudTrail no two hyphens in a row. Pulumi
#: allows up to 100 characters; infra/aws/names.py fits each name to its service.
STACK_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
STACK_NAME_MAX = 100


def load_schema(path: Path = PULUMI_YAML) -> dict[str, dict[str, Any]]:
    """The `config:` section of Pulumi.yaml: key -> {type, default?, description}."""
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)["config"]


# ---------------------------------------------------------------------------
# The settings
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class NetworkSettings:
    availability_zones: tuple[str, ...]
    vpc_cidr: str
    existing_vpc_id: str
    """Empty unless the stack adopts an existing VPC."""
    existing_subnet_ids: tuple[str, ...]

    @property
    def adopt(self) -> bool:
        return bool(self.existing_subnet_ids)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FleetSettings:
    coordinator_instance_type: str
    worker_instance_types: tuple[str, ...]
    worker_min_size: int
    worker_max_size: int
    worker_desired_size: int
    on_demand_base_capacity: int
    on_demand_percent_above_base: int
    spot_allocation_strategy: str
    efa_enabled: bool
    placement_group: bool
    image_id: str
    image_ssm_parameter: str
    root_volume_gib: int
    termination_hook_seconds: int
    gpus_per_node: int
    """Derived from the instance catalog; every type in the fleet has this many GPUs."""
    spare_nodes: int = 0
    """Booted worker nodes kept beyond workerDesiredSize (extra desired capacity)."""

    @property
    def group_desired_size(self) -> int:
        """What the worker group runs: the job's nodes and the spares."""
        return self.worker_desired_size + self.spare_nodes


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StorageSettings:
    fsx_storage_capacity_gib: int
    fsx_throughput_per_tib: int
    fsx_compression: str
    fsx_mount_point: str


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BucketSettings:
    checkpoint_prefix: str
    pinned_prefix: str
    transition_to_ia_days: int
    transition_to_glacier_days: int
    expire_checkpoints_days: int
    noncurrent_version_expiry_days: int
    replication_time_control: bool
    object_lock: bool
    object_lock_retention_days: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RemediationSettings:
    spot_interruption: bool
    lifecycle_handoff: bool
    unhealthy_nodes: bool
    storage_drift: bool
    replication_lag: bool
    replication_lag_alarm_seconds: int
    retention_sweep: bool
    checkpoint_retention: tuple[str, ...]
    """The sweep's schedule where no manifest records one."""
    unhealthy_node_grace_seconds: int
    max_replacements_per_hour: int
    cloud_trail: str
    """`create`: the stack creates a trail for storage_drift; `existing`: the account's."""
    capacity_watch: bool = False
    capacity_loss_minutes: int = 20
    alarm_subscriptions: tuple[tuple[str, str], ...] = ()
    """(SNS protocol, endpoint) of each subscriber to the stack's alarm topics."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainerSettings:
    image_tag: str
    config: str
    run_id: str
    launcher: str = contract.LAUNCHERS[0]
    """The image's FTFLEET_LAUNCHER (``trainerLauncher``): ``inprocess`` or ``torchrun``."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StandbySettings:
    """A standby environment: the home stack's replica region is this stack's region,
    the home's region is this stack's replica region, and the home's buckets, keys and
    run lease are shared (docs/FAILOVER.md)."""

    home: str
    """The home stack's name (``standbyOf``)."""
    image_replication: str
    """``create``: this stack owns the home registry's replication configuration."""
    fast_tier: str = "kept"
    """``kept``: the file system exists while standing by; ``on-failover``: only while
    :attr:`active`."""
    active: bool = False
    """The job has moved here (``standbyActive``)."""
    auto_failover: bool = False
    """This stack's capacity_watch moves the run to the region that has capacity
    (``standbyAutoFailover``)."""

    @property
    def has_fast_tier(self) -> bool:
        return self.fast_tier == "kept" or self.active


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    stack: str
    cloud: str
    region: str
    replica_region: str
    network: NetworkSettings
    fleet: FleetSettings
    storage: StorageSettings
    buckets: BucketSettings
    remediation: RemediationSettings
    trainer: TrainerSettings
    tags: dict[str, str]
    """Applied to every taggable resource, after ftfleet's own tags."""
    standby: StandbySettings | None = None
    """Set when this stack stands by for another (``standbyOf``)."""

    @property
    def name(self) -> str:
        """Prefix of physical names: `ftfleet-<stack>`."""
        return f"{PROJECT}-{self.stack}"

    def all_tags(self) -> dict[str, str]:
        return {"ftfleet:stack": self.stack, "ftfleet:run": self.trainer.run_id, "managed-by": "pulumi", **self.tags}


# ---------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------


class _Reader:
    """Typed access to raw config values with schema defaults and one-line errors."""

    def __init__(self, raw: Mapping[str, Any], schema: Mapping[str, Mapping[str, Any]]):
        self.raw = raw
        self.schema = schema

    def _value(self, key: str) -> Any:
        if key in self.raw:
            return self.raw[key]
        spec = self.schema[key]
        if "default" not in spec:
            raise ConfigError(
                f"{PROJECT}:{key} is required: {spec['description']} "
                f"Set it with `pulumi config set {PROJECT}:{key} ...`"
            )
        return spec["default"]

    def str(self, key: str) -> str:
        value = self._value(key)
        if not isinstance(value, str):
            raise ConfigError(f"{PROJECT}:{key} must be a string, got {value!r}")
        return value.strip()

    def bool(self, key: str) -> bool:
        value = self._value(key)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise ConfigError(f"{PROJECT}:{key} must be true or false, got {value!r}")
        return value

    def int(self, key: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self._value(key)
        if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            value = int(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{PROJECT}:{key} must be a whole number, got {value!r}")
        if minimum is not None and value < minimum:
            raise ConfigError(f"{PROJECT}:{key} is {value}; it must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise ConfigError(f"{PROJECT}:{key} is {value}; it must be at most {maximum}")
        return value

    def list(self, key: str) -> tuple[str, ...]:
        value = self._value(key)
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except json.JSONDecodeError:
                raise ConfigError(f"{PROJECT}:{key} must be a list of strings, got {value!r}") from None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{PROJECT}:{key} must be a list of non-empty strings, got {value!r}")
        return tuple(v.strip() for v in value)


def _check_unknown_keys(raw: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    for key in raw:
        if key not in schema:
            hint = difflib.get_close_matches(key, list(schema), n=1)
            fix = f"did you mean {PROJECT}:{hint[0]}?" if hint else "see the config reference in docs/CONFIG.md"
            raise ConfigError(f"unknown config key {PROJECT}:{key}: {fix}")


def _err(key: str, message: str) -> ConfigError:
    return ConfigError(f"{PROJECT}:{key} {message}")


def parse(
    raw: Mapping[str, Any], *, stack: str, region: str | None, schema: Mapping[str, Mapping[str, Any]] | None = None
) -> Settings | GcpSettings:
    """Validate one stack's project config.

    ``raw`` maps project keys without the ``ftfleet:`` namespace to values, either typed
    (YAML from a stack file) or strings (what Pulumi hands a program; lists as JSON).
    ``region`` is the provider's region (`aws:region` or `gcp:region`).
    """
    schema = load_schema() if schema is None else schema
    _check_unknown_keys(raw, schema)
    r = _Reader(raw, schema)

    cloud = r.str("cloud")
    if cloud not in CLOUDS:
        raise _err("cloud", f"is {cloud!r}; use one of: {', '.join(CLOUDS)}")
    # GCP's settings are their own module; an AWS stack may set none of its keys.
    from ftfleet.infra.gcp import keys as gcp_keys
    from ftfleet.infra.gcp import settings as gcp_settings

    if cloud == "gcp":
        return gcp_settings.parse(r, stack=stack, region=region)
    gcp_keys.refuse_on_aws(raw)
    if len(stack) > STACK_NAME_MAX or not STACK_NAME.fullmatch(stack):
        raise ConfigError(
            f"stack name {stack!r}: AWS resources are named after it; use lowercase letters, digits and "
            f"single hyphens, at most {STACK_NAME_MAX} characters (`pulumi stack rename`)"
        )
    if not region:
        raise ConfigError(f"{cloud}:region is required: set it with `pulumi config set {cloud}:region <region>`")
    replica_region = r.str("replicaRegion")
    if not replica_region:
        raise _err("replicaRegion", "is required: the region that holds the checkpoint replica")
    constraints.check_regions(cloud, region, replica_region)
    if replica_region == region:
        raise _err(
            "replicaRegion",
            f"equals the primary region {region}; pick another region so a regional outage cannot take both copies",
        )

    network = _network(r, region)
    fleet = _fleet(r, cloud)
    storage = _storage(r)
    buckets = _buckets(r)
    # On AWS the FSx data repository association is the only writer of the bucket.
    constraints.check_object_lock(cloud, buckets.object_lock, constraints.FSX_EXPORT)
    constraints.check_efa_addresses(
        cloud,
        (fleet.coordinator_instance_type, *fleet.worker_instance_types),
        1 + fleet.worker_max_size,
        fleet.efa_enabled,
        network.vpc_cidr,
        network.adopt,
    )
    remediation = _remediation(r)
    run_id = r.str("runId") or stack
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", run_id):
        raise _err("runId", f"is {run_id!r}; use lowercase letters, digits and dashes (max 63)")
    image_tag = r.str("trainerImageTag")
    if not image_tag or image_tag == "latest":
        raise _err("trainerImageTag", "must name an immutable release tag (not empty, not 'latest')")
    trainer = TrainerSettings(
        image_tag=image_tag, config=r.str("trainerConfig"), run_id=run_id, launcher=trainer_launcher(r)
    )
    if not trainer.config.startswith("/"):
        raise _err("trainerConfig", f"is {trainer.config!r}; give an absolute path inside the image")
    standby = standby_of(r, stack)
    if standby is not None:  # the home stack's storage_drift guards the shared buckets
        remediation = dataclasses.replace(remediation, storage_drift=False)
    return Settings(
        stack=stack,
        cloud=cloud,
        region=region,
        replica_region=replica_region,
        network=network,
        fleet=fleet,
        storage=storage,
        buckets=buckets,
        remediation=remediation,
        trainer=trainer,
        tags=_tags(r),
        standby=standby,
    )


def standby_of(
    r: _Reader, stack: str, bucket_functions: tuple[str, ...] = ("remediationStorageDrift",)
) -> StandbySettings | None:
    """``standbyOf`` and the ``standby*`` keys; None for a stack of its own.
    ``bucket_functions``: the keys of remediation functions that act on the checkpoint
    buckets, which the home's own functions already do; set true, they are refused."""
    home = r.str("standbyOf")
    if not home:
        for key in ("standbyImageReplication", "standbyFastTier", "standbyActive", "standbyAutoFailover"):
            if key in r.raw:
                raise _err(key, "is set on a stack that stands by for none; set standbyOf or remove the key")
        return None
    if len(home) > STACK_NAME_MAX or not STACK_NAME.fullmatch(home):
        raise _err("standbyOf", f"is {home!r}; give the home stack's name (aws-prod)")
    if home == stack:
        raise _err("standbyOf", f"names this stack ({stack}); name the stack this one stands by for")
    for key in bucket_functions:
        if r.raw.get(key) in (True, "true"):
            raise _err(
                key, f"is true on a standby: the buckets are {home}'s, and its functions do this; remove the key"
            )
    mode = r.str("standbyImageReplication")
    if mode not in IMAGE_REPLICATION_MODES:
        raise _err(
            "standbyImageReplication",
            f"is {mode!r}; use create (this stack replicates the home registry here) or existing "
            "(the account already does)",
        )
    fast_tier = r.str("standbyFastTier")
    if fast_tier not in STANDBY_FAST_TIERS:
        raise _err(
            "standbyFastTier",
            f"is {fast_tier!r}; use kept (the file system stands by too) "
            "or on-failover (created when standbyActive is set)",
        )
    active, auto = r.bool("standbyActive"), r.bool("standbyAutoFailover")
    if auto and fast_tier == "on-failover":
        raise _err(
            "standbyAutoFailover",
            "is true with standbyFastTier on-failover: a move cannot create the file system; "
            "set standbyFastTier kept, or move by hand",
        )
    if auto and r.raw.get("remediationCapacityWatch") in (False, "false"):
        raise _err(
            "standbyAutoFailover",
            "is true with remediationCapacityWatch false: the capacity watch moves the run; set it true",
        )
    return StandbySettings(home=home, image_replication=mode, fast_tier=fast_tier, active=active, auto_failover=auto)


def checkpoint_retention(r: _Reader) -> tuple[str, ...]:
    """``checkpointRetention``: the retention sweep's fallback schedule (both clouds)."""
    rules = r.list("checkpointRetention")
    retention.parse_schedule(rules, key=f"{PROJECT}:checkpointRetention")  # a bad rule: one line naming it
    return rules


def _remediation(r: _Reader) -> RemediationSettings:
    trail = r.str("cloudTrail")
    if trail not in CLOUD_TRAIL_MODES:
        raise _err(
            "cloudTrail",
            f"is {trail!r}; use create (a trail for this stack) or existing "
            "(the account already logs management events)",
        )
    return RemediationSettings(
        spot_interruption=r.bool("remediationSpotInterruption"),
        lifecycle_handoff=r.bool("remediationLifecycleHandoff"),
        unhealthy_nodes=r.bool("remediationUnhealthyNodes"),
        storage_drift=r.bool("remediationStorageDrift"),
        replication_lag=r.bool("remediationReplicationLag"),
        replication_lag_alarm_seconds=r.int("replicationLagAlarmSeconds", minimum=60, maximum=86400),
        capacity_watch=r.bool("remediationCapacityWatch"),
        capacity_loss_minutes=r.int("capacityLossMinutes", minimum=5, maximum=1440),
        retention_sweep=r.bool("remediationRetentionSweep"),
        checkpoint_retention=checkpoint_retention(r),
        unhealthy_node_grace_seconds=r.int("unhealthyNodeGraceSeconds", minimum=60, maximum=86400),
        max_replacements_per_hour=r.int("unhealthyNodeMaxReplacementsPerHour", minimum=1, maximum=100),
        cloud_trail=trail,
        alarm_subscriptions=_subscriptions(r),
    )


#: What each SNS protocol's endpoint looks like (Amazon SNS API Reference, "Subscribe",
#: Endpoint): an email address, a URL of the protocol's scheme, an E.164 number, an ARN.
_ENDPOINTS = {
    "email": (r"[^@\s:]+@[^@\s]+\.[^@\s]+", "an email address"),
    "email-json": (r"[^@\s:]+@[^@\s]+\.[^@\s]+", "an email address"),
    "http": (r"http://[^\s]+", "an http:// URL"),
    "https": (r"https://[^\s]+", "an https:// URL"),
    "sms": (r"\+[1-9][0-9]{6,14}", "a phone number in E.164 form (+15555550123)"),
    "sqs": (r"arn:aws[a-z-]*:sqs:[a-z0-9-]+:[0-9]{12}:[A-Za-z0-9_-]{1,80}(\.fifo)?", "an SQS queue ARN"),
    "lambda": (
        r"arn:aws[a-z-]*:lambda:[a-z0-9-]+:[0-9]{12}:function:[A-Za-z0-9_-]{1,64}(:[A-Za-z0-9$_-]+)?",
        "a function ARN",
    ),
}


def _subscriptions(r: _Reader) -> tuple[tuple[str, str], ...]:
    """``alarmSubscriptions``: ``protocol:endpoint`` strings; an http(s) URL is its own
    protocol and endpoint."""
    out = []
    for item in r.list("alarmSubscriptions"):
        protocol, sep, endpoint = item.partition(":")
        if protocol in ("http", "https"):
            endpoint = item
        if not sep or protocol not in _ENDPOINTS:
            raise _err(
                "alarmSubscriptions",
                f"contains {item!r}; write protocol:endpoint with a protocol of {', '.join(_ENDPOINTS)}",
            )
        pattern, what = _ENDPOINTS[protocol]
        if not re.fullmatch(pattern, endpoint):
            raise _err("alarmSubscriptions", f"contains {item!r}; a {protocol} endpoint is {what}")
        out.append((protocol, endpoint))
    if len(set(out)) != len(out):
        raise _err("alarmSubscriptions", "lists a subscriber twice; list each once")
    return tuple(out)


def _network(r: _Reader, region: str) -> NetworkSettings:
    zones = r.list("availabilityZones")
    if not zones:
        raise _err("availabilityZones", "is empty; list at least one zone of the primary region")
    for zone in zones:
        if not zone.startswith(region):
            raise _err("availabilityZones", f"contains {zone!r}, which is not a zone of {region}")
    cidr = r.str("vpcCidr")
    try:
        net = ipaddress.ip_network(cidr)
    except ValueError:
        raise _err("vpcCidr", f"is {cidr!r}; give an IPv4 CIDR such as 10.40.0.0/16") from None
    subnets = r.list("existingSubnetIds")
    vpc_id = r.str("existingVpcId")
    if subnets:
        if not vpc_id:
            raise _err("existingVpcId", "is required when existingSubnetIds adopts subnets")
        if len(subnets) != len(zones):
            raise _err(
                "existingSubnetIds",
                f"has {len(subnets)} ids for {len(zones)} zones; "
                "give one subnet per availability zone, in the same order",
            )
    elif vpc_id:
        raise _err("existingSubnetIds", "is required when existingVpcId is set")
    elif net.prefixlen > 20 - max(0, (len(zones) - 1).bit_length()):
        raise _err("vpcCidr", f"{cidr} is too small for one /20 subnet per zone; use a /16")
    return NetworkSettings(availability_zones=zones, vpc_cidr=cidr, existing_vpc_id=vpc_id, existing_subnet_ids=subnets)


def _fleet(r: _Reader, cloud: str) -> FleetSettings:
    types = r.list("workerInstanceTypes")
    if not types:
        raise _err("workerInstanceTypes", "is empty; list at least one GPU instance type")
    if len(set(types)) != len(types):
        raise _err("workerInstanceTypes", "lists a type twice; list each type once")
    coordinator = r.str("coordinatorInstanceType") or types[0]
    gpus = set()
    for key, names in (("workerInstanceTypes", types), ("coordinatorInstanceType", (coordinator,))):
        for name in names:
            spec = catalog.instance(cloud, name)
            if spec is None:
                raise _err(
                    key,
                    f"contains unknown instance type {name!r}; known {cloud} types: "
                    f"{', '.join(catalog.instance_names(cloud))} (add new ones to infra/catalog.json)",
                )
            gpus.add(spec.gpus)
    if len(gpus) != 1:
        raise _err(
            "workerInstanceTypes",
            "mixes types with different GPU counts; torchrun needs the same --nproc-per-node on every node",
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
    spares = spare_nodes(r, desired, max_size)
    base = r.int("onDemandBaseCapacity", minimum=0)
    if base > max_size:
        raise _err(
            "onDemandBaseCapacity", f"({base}) exceeds workerMaxSize ({max_size}); lower it or raise workerMaxSize"
        )
    strategy = r.str("spotAllocationStrategy")
    if strategy not in SPOT_STRATEGIES:
        raise _err("spotAllocationStrategy", f"is {strategy!r}; use one of: {', '.join(SPOT_STRATEGIES)}")
    efa = r.bool("efaEnabled")
    if efa:
        for name in (coordinator, *types):
            if not catalog.instance(cloud, name).efa:
                raise _err(
                    "efaEnabled", f"is true but {name} does not support EFA; disable EFA or use EFA-capable types"
                )
    constraints.check_fleet_types(cloud, coordinator, types, efa)
    image_id = r.str("imageId")
    if image_id and not re.fullmatch(r"ami-[0-9a-f]{8,17}", image_id):
        raise _err("imageId", f"is {image_id!r}; give an AMI id (ami-...) or leave it empty")
    ssm = r.str("imageSsmParameter")
    if not image_id and not ssm.startswith("/"):
        raise _err("imageSsmParameter", "must be an SSM parameter path starting with / when imageId is empty")
    return FleetSettings(
        coordinator_instance_type=coordinator,
        worker_instance_types=types,
        worker_min_size=min_size,
        worker_max_size=max_size,
        worker_desired_size=desired,
        on_demand_base_capacity=base,
        on_demand_percent_above_base=r.int("onDemandPercentAboveBase", minimum=0, maximum=100),
        spot_allocation_strategy=strategy,
        efa_enabled=efa,
        placement_group=r.bool("placementGroup"),
        image_id=image_id,
        image_ssm_parameter=ssm,
        root_volume_gib=r.int("rootVolumeGiB", minimum=50, maximum=16384),
        termination_hook_seconds=r.int("terminationHookSeconds", minimum=120, maximum=7200),
        gpus_per_node=gpus.pop(),
        spare_nodes=spares,
    )


def spare_nodes(r: _Reader, desired: int, max_size: int) -> int:
    """``spareNodes``, which the worker group runs on top of ``workerDesiredSize``: both
    together must fit under ``workerMaxSize`` (the group's ceiling on AWS, the
    rendezvous' node range on both clouds)."""
    spares = r.int("spareNodes", minimum=0)
    if desired + spares > max_size:
        raise _err(
            "spareNodes",
            f"({spares}) plus workerDesiredSize ({desired}) exceeds workerMaxSize ({max_size}); "
            "raise workerMaxSize or lower spareNodes",
        )
    return spares


def trainer_launcher(r: _Reader) -> str:
    """``trainerLauncher``, which the nodes pass the image as FTFLEET_LAUNCHER."""
    launcher = r.str("trainerLauncher")
    if launcher not in contract.LAUNCHERS:
        raise _err(
            "trainerLauncher",
            f"is {launcher!r}; use inprocess (ftfleet's in-process launcher, the default) or torchrun",
        )
    return launcher


def launcher_env(launcher: str, fleet: FleetSettings | Any) -> dict[str, str]:
    """The job's shape as the nodes pass it to the image (both clouds), for ``launcher``.

    torchrun: the elastic range ``1 + workerMinSize : 1 + workerMaxSize`` (the
    coordinator trains too), which the group's spares fall within. inprocess: the world
    the job trains on, ``1 + workerDesiredSize`` nodes that never shrink (the trajectory
    of an uninterrupted run), and the ``spareNodes`` the group runs beside them, which
    wait warm to take a lost node's ranks; a node beyond both waits for the job's next
    round.
    """
    if launcher == "torchrun":
        return {
            contract.LAUNCHER_ENV: launcher,
            "FTFLEET_NNODES": f"{1 + fleet.worker_min_size}:{1 + fleet.worker_max_size}",
        }
    return {
        contract.LAUNCHER_ENV: launcher,
        "FTFLEET_NNODES": str(1 + fleet.worker_desired_size),
        "FTFLEET_SPARE_NODES": str(fleet.spare_nodes),
    }


def _storage(r: _Reader) -> StorageSettings:
    capacity = r.int("fsxStorageCapacityGiB", minimum=1)
    if capacity != 1200 and capacity % 2400:
        below = max(1200, capacity // 2400 * 2400)
        raise _err(
            "fsxStorageCapacityGiB",
            f"is {capacity}; PERSISTENT_2 SSD takes 1200 or a multiple "
            f"of 2400 GiB (nearest: {below} or {(capacity // 2400 + 1) * 2400})",
        )
    throughput = r.int("fsxThroughputPerTiB")
    if throughput not in FSX_THROUGHPUTS:
        raise _err("fsxThroughputPerTiB", f"is {throughput}; use one of {', '.join(map(str, FSX_THROUGHPUTS))}")
    compression = r.str("fsxCompression").upper()
    if compression not in FSX_COMPRESSIONS:
        raise _err("fsxCompression", f"is {compression!r}; use LZ4 or NONE")
    mount = r.str("fsxMountPoint")
    if not re.fullmatch(r"/[A-Za-z0-9/_-]+", mount):
        raise _err("fsxMountPoint", f"is {mount!r}; give an absolute path such as /fsx")
    return StorageSettings(
        fsx_storage_capacity_gib=capacity,
        fsx_throughput_per_tib=throughput,
        fsx_compression=compression,
        fsx_mount_point=mount.rstrip("/"),
    )


def _prefix(r: _Reader, key: str) -> str:
    value = r.str(key)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)*/", value):
        raise _err(key, f"is {value!r}; give a bucket prefix like 'checkpoints/' (no leading slash, trailing slash)")
    return value


def _buckets(r: _Reader) -> BucketSettings:
    ckpt, pinned = _prefix(r, "checkpointPrefix"), _prefix(r, "pinnedPrefix")
    if ckpt.startswith(pinned) or pinned.startswith(ckpt):
        raise _err(
            "pinnedPrefix",
            f"({pinned}) overlaps checkpointPrefix ({ckpt}); pinned objects "
            "must sit outside the prefix that lifecycle rules expire",
        )
    ia = r.int("transitionToIaDays", minimum=0)
    glacier = r.int("transitionToGlacierDays", minimum=0)
    expire = r.int("expireCheckpointsDays", minimum=0)
    if ia and ia < 30:
        raise _err("transitionToIaDays", f"is {ia}; S3 requires at least 30 days before STANDARD_IA (or 0)")
    if ia and glacier and glacier < ia + 30:
        raise _err(
            "transitionToGlacierDays", f"is {glacier}; it must be at least transitionToIaDays + 30 ({ia + 30}) or 0"
        )
    if expire and expire <= max(ia, glacier):
        raise _err("expireCheckpointsDays", f"is {expire}; it must exceed the transition days or be 0")
    return BucketSettings(
        checkpoint_prefix=ckpt,
        pinned_prefix=pinned,
        transition_to_ia_days=ia,
        transition_to_glacier_days=glacier,
        expire_checkpoints_days=expire,
        noncurrent_version_expiry_days=r.int("noncurrentVersionExpiryDays", minimum=1),
        replication_time_control=r.bool("replicationTimeControl"),
        object_lock=r.bool("objectLock"),
        object_lock_retention_days=r.int("objectLockRetentionDays", minimum=1, maximum=36500),
    )


def _tags(r: _Reader) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in r.list("tags"):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise _err("tags", f"contains {item!r}; write tags as key=value")
        key, value = key.strip(), value.strip()
        if key.lower().startswith(("aws:", "ftfleet:")):
            raise _err("tags", f"contains reserved key {key!r}; aws: and ftfleet: prefixes are reserved")
        # The nodes allow tags in instance metadata, and every tag reaches them.
        if problem := constraints.imds_tag_key_problem(key):
            raise _err("tags", f"contains key {key!r}: {problem}")
        if len(value) > constraints.TAG_VALUE_MAX:
            raise _err("tags", f"contains a value of {len(value)} characters for {key!r}; EC2 allows 256")
        if key in tags:
            raise _err("tags", f"sets {key!r} twice; set each key once")
        tags[key] = value
    return tags
