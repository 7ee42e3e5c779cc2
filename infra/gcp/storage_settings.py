"""The checkpoint storage part of a GCP stack's settings: the file system and the bucket."""

from __future__ import annotations

import dataclasses
import re

from ftfleet.infra.gcp import locations
from ftfleet.infra.settings import _err, _prefix, _Reader

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


def parse_storage(r: _Reader) -> GcpStorageSettings:
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


def parse_buckets(r: _Reader, location: str, data_locations: tuple[str, ...]) -> GcsBucketSettings:
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
