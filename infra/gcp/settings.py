"""Typed, validated settings of a GCP stack (`ftfleet:cloud: gcp`).

infra/settings.py hands a GCP stack to :func:`parse`, which returns
:class:`GcpSettings` or raises ConfigError with one line that names the key and the
fix. The fleet and the storage parts live in fleet_settings.py and storage_settings.py.
Nothing here imports Pulumi.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import re

from ftfleet.errors import ConfigError
from ftfleet.infra import catalog
from ftfleet.infra.gcp import keys, locations
from ftfleet.infra.gcp.fleet_settings import GcpFleetSettings, parse_fleet
from ftfleet.infra.gcp.storage_settings import GcpStorageSettings, GcsBucketSettings, parse_buckets, parse_storage

# _Reader, _err and TrainerSettings are the shared parsing helpers of infra/settings.py;
# importing them (not copying) keeps one behaviour for both clouds.
from ftfleet.infra.settings import (
    PROJECT,
    StandbySettings,
    TrainerSettings,
    _err,
    _Reader,
    checkpoint_retention,
    standby_of,
    trainer_launcher,
)

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
class GcpRemediationSettings:
    spot_interruption: bool
    unhealthy_nodes: bool
    storage_drift: bool
    replication_lag: bool
    replication_lag_alarm_seconds: int
    retention_sweep: bool
    checkpoint_retention: tuple[str, ...]
    """The retention sweep's schedule where no manifest records one."""
    unhealthy_node_grace_seconds: int
    capacity_watch: bool = False
    capacity_loss_minutes: int = 20
    alert_channels: tuple[str, ...] = ()
    """Cloud Monitoring notification channels of the stack's alert policies."""

    @property
    def any_function(self) -> bool:
        """Whether a remediation function is deployed (remediationUnhealthyNodes adds
        none on GCP: the managed instance groups recreate unhealthy nodes)."""
        return (
            self.spot_interruption
            or self.storage_drift
            or self.replication_lag
            or self.retention_sweep
            or self.capacity_watch
        )


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
    standby: StandbySettings | None = None
    """Set when this stack stands by for another (``standbyOf``; infra/gcp/standby.py)."""

    @property
    def name(self) -> str:
        return f"{PROJECT}-{self.stack}"

    def labels(self) -> dict[str, str]:
        """GCP labels allow no colons: ftfleet's AWS tag keys become dashes here."""
        return {"ftfleet-stack": self.stack, "ftfleet-run": self.trainer.run_id, "managed-by": "pulumi", **self.tags}


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
    fleet, storage = parse_fleet(r), parse_storage(r)
    _lustre_client_published(fleet, storage)
    standby = standby_of(r, stack, bucket_functions=GCP_BUCKET_FUNCTIONS)
    if standby is not None and standby.auto_failover and not standby.active:
        # A move never raises a coordinator group (lambdas/common/gcp_fleet.py): the
        # standby's coordinator VM, made by its per-instance config, stands by running.
        raise _err(
            "standbyAutoFailover",
            "is true on a GCP standby without standbyActive: a move needs the standby's coordinator VM "
            "running; set standbyActive true too, or move by hand",
        )
    settings = GcpSettings(
        stack=stack,
        cloud="gcp",
        region=region,
        replica_region=replica,
        network=_network(r, region),
        fleet=fleet,
        storage=storage,
        buckets=parse_buckets(r, *dual),
        remediation=GcpRemediationSettings(
            spot_interruption=r.bool("remediationSpotInterruption"),
            unhealthy_nodes=r.bool("remediationUnhealthyNodes"),
            storage_drift=r.bool("remediationStorageDrift"),
            replication_lag=r.bool("remediationReplicationLag"),
            replication_lag_alarm_seconds=r.int("replicationLagAlarmSeconds", minimum=60),
            retention_sweep=r.bool("remediationRetentionSweep"),
            checkpoint_retention=checkpoint_retention(r),
            unhealthy_node_grace_seconds=r.int("unhealthyNodeGraceSeconds", minimum=60),
            capacity_watch=r.bool("remediationCapacityWatch"),
            capacity_loss_minutes=r.int("capacityLossMinutes", minimum=5, maximum=1440),
            alert_channels=_alert_channels(r),
        ),
        trainer=_trainer(r, stack),
        tags=_labels(r),
        standby=standby,
    )
    if standby is None:
        return settings
    # The bucket is the home's, and the home's functions watch and sweep it already.
    off = {f: False for f in ("storage_drift", "replication_lag", "retention_sweep")}
    return dataclasses.replace(settings, remediation=dataclasses.replace(settings.remediation, **off))


#: Keys of the functions that act on the checkpoint bucket, which a standby shares.
GCP_BUCKET_FUNCTIONS = ("remediationStorageDrift", "remediationReplicationLag", "remediationRetentionSweep")


def _lustre_client_published(fleet: GcpFleetSettings, storage: GcpStorageSettings) -> None:
    """Google builds the Managed Lustre client for specific kernels ("Connect from
    Compute Engine": lustre-client-modules-<kernel>): a node whose kernel has none
    cannot mount the file system. Checked where infra/catalog.json records both the
    image's kernel and the published kernels."""
    kernel, published = catalog.gcp_image_kernel(fleet.image), catalog.lustre_client_kernels()
    if storage.kind != "managed-lustre" or kernel is None or not published or kernel in published:
        return
    raise _err(
        "gcpImage",
        f"is {fleet.image}, which boots kernel {kernel}; Google publishes no Managed Lustre client for it "
        f"(lustre-client-modules-{kernel}); pin an image whose kernel has one (infra/catalog.json lists "
        f"{len(published)}: {', '.join(published[-3:])}{', ...' if len(published) > 3 else ''})",
    )


#: A notification channel's resource name, as `gcloud beta monitoring channels list` prints it.
CHANNEL = re.compile(r"projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/notificationChannels/[0-9]+")


def _alert_channels(r: _Reader) -> tuple[str, ...]:
    channels = r.list("gcpAlertNotificationChannels")
    for channel in channels:
        if not CHANNEL.fullmatch(channel):
            raise _err(
                "gcpAlertNotificationChannels",
                f"holds {channel!r}; use a channel's resource name, projects/<project>/notificationChannels/<id> "
                "(`gcloud beta monitoring channels list`)",
            )
    return channels


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
    return TrainerSettings(image_tag=image_tag, config=config, run_id=run_id, launcher=trainer_launcher(r))


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
