"""Cost estimate of a stack from the dated price table in infra/catalog.json.

What the fleet declares decides the arithmetic: on-demand workers are the first listed
type (the `prioritized` on-demand strategy launches it first), spot spreads over every
type, and each node runs with its gp3 root volume. Checkpoints written to the primary
bucket are replicated to the other region: inter-region transfer, plus the RTC fee when
Replication Time Control is on, per TiB written. The trainer picks its checkpoint
interval at run time (Daly's optimum from the measured save cost), so the volume
written per month is not known here; the plan shows the cost per TiB written.
"""

from __future__ import annotations

import math
from typing import Any

from ftfleet.infra import catalog
from ftfleet.infra.aws.fleet import ROOT_IOPS, ROOT_THROUGHPUT_MIBPS
from ftfleet.infra.settings import Settings

HOURS_PER_MONTH = 730
GIB_PER_TIB = 1024


def root_volume_monthly(s: Settings) -> float:
    """One node's gp3 root volume: GiB-month plus the IOPS and throughput provisioned
    above gp3's free baseline."""
    p = catalog.storage_prices(s.cloud)
    if "ebs_gp3_gib_month" not in p:
        return 0.0
    return (
        s.fleet.root_volume_gib * p["ebs_gp3_gib_month"]
        + max(0, ROOT_IOPS - p["ebs_gp3_free_iops"]) * p["ebs_gp3_iops_month"]
        + max(0, ROOT_THROUGHPUT_MIBPS - p["ebs_gp3_free_mibps"]) * p["ebs_gp3_mibps_month"]
    )


def replication_per_tib(s: Settings) -> dict:
    p = catalog.storage_prices(s.cloud)
    transfer = GIB_PER_TIB * p.get("s3_inter_region_transfer_gib", 0.0)
    rtc = GIB_PER_TIB * p.get("s3_replication_rtc_gib", 0.0) if s.buckets.replication_time_control else 0.0
    return {
        "inter_region_transfer": round(transfer, 2),
        "replication_time_control": round(rtc, 2),
        "total": round(transfer + rtc, 2),
    }


def standby_estimate(
    s: Any, file_system_usd_month: float, always_usd_month: float, fleet_usd_hour: float
) -> dict | None:
    """A standby's costs (None for a stack of its own): its groups are at 0 until a
    failover, so standing by costs the file system when ``kept`` and what runs anyway
    (``always_usd_month``); the checkpoints are the home's, priced in its plan."""
    if not s.standby:
        return None
    kept = s.standby.fast_tier == "kept"
    return {
        "home": s.standby.home,
        "fast_tier": s.standby.fast_tier,
        "active": s.standby.active,
        "standing_by_usd_per_month": round((file_system_usd_month if kept else 0.0) + always_usd_month, 2),
        "fleet_after_failover_usd_per_hour": round(fleet_usd_hour, 2),
    }


def standby_lines(sb: dict | None, file_system: str, always: str = "") -> list[str]:
    """The plan's line for :func:`standby_estimate` (none without a standby)."""
    if not sb:
        return []
    also = f" and {always}" if always else ""
    if sb["fast_tier"] == "kept":
        what = f"{file_system} kept{also}"
    else:
        what = f"{always + '; ' if always else ''}{file_system} comes with a failover"
    return [
        f"  standby of {sb['home']}: node groups at 0 until a failover (the fleet line is what runs after one, "
        f"${sb['fleet_after_failover_usd_per_hour']:,.2f}/hour); standing by costs "
        f"${sb['standing_by_usd_per_month']:,.2f}/month ({what}); "
        f"the checkpoints are {sb['home']}'s, priced in its plan"
    ]


def estimate(s: Settings) -> dict:
    if s.cloud == "gcp":
        from ftfleet.infra.gcp.estimate import estimate as estimate_gcp

        return estimate_gcp(s)
    f = s.fleet
    coordinator = catalog.instance(s.cloud, f.coordinator_instance_type)
    workers = [catalog.instance(s.cloud, t) for t in f.worker_instance_types]
    od_price = workers[0].on_demand_hourly  # prioritized: the first listed type
    spot_avg = sum(w.spot_hourly for w in workers) / len(workers)  # spread over every type
    node_volume = root_volume_monthly(s) / HOURS_PER_MONTH

    def fleet_at(size: int) -> tuple[int, int, float, float]:
        """(on-demand workers, spot workers, $/h with spot, $/h all on-demand) of a
        worker group running ``size`` nodes, the coordinator and root volumes included.
        Mixed-instances arithmetic: the base first, then the percentage of the rest."""
        od = min(size, f.on_demand_base_capacity)
        od += math.ceil(max(0, size - od) * f.on_demand_percent_above_base / 100)
        volumes = (1 + size) * node_volume
        mixed = coordinator.on_demand_hourly + od * od_price + (size - od) * spot_avg + volumes
        return od, size - od, mixed, coordinator.on_demand_hourly + size * od_price + volumes

    # The spares run in the same group: its distribution applies to them too, and what
    # they cost is the difference they make.
    od_workers, spot_workers, mixed, all_on_demand = fleet_at(f.group_desired_size)
    without_spares = fleet_at(f.worker_desired_size)
    volumes = round((1 + f.group_desired_size) * node_volume, 2)
    prices = catalog.storage_prices(s.cloud)
    fsx_rate = prices["fsx_persistent2_gib_month"][str(s.storage.fsx_throughput_per_tib)]
    per_tib = GIB_PER_TIB * (2 * prices["s3_standard_gib_month"])  # primary + replica, before tiering
    net = catalog.network_prices(s.cloud)
    nat = 0.0 if s.network.adopt else net.get("nat_gateway_hourly", 0.0) * HOURS_PER_MONTH
    fsx = round(s.storage.fsx_storage_capacity_gib * fsx_rate, 2)
    standby = standby_estimate(s, fsx, nat, mixed)
    if standby:
        per_tib = 0.0  # the buckets are the home's
    return {
        "label": (
            f"ESTIMATE from list prices recorded {catalog.prices_as_of()} for "
            f"{catalog.price_region(s.cloud)}; spot prices vary by zone and hour"
        ),
        "prices_as_of": catalog.prices_as_of(),
        "assumptions": [
            f"on-demand workers are {workers[0].name} (prioritized: the first listed type)",
            "spot workers spread evenly over every listed type",
            f"every node has a {f.root_volume_gib} GiB gp3 root volume ({ROOT_IOPS} IOPS, "
            f"{ROOT_THROUGHPUT_MIBPS} MiB/s)",
            "the checkpoint interval adapts at run time, so replication is priced per TiB written",
            f"{f.spare_nodes} spare node(s) run in the worker group beside the job's {f.worker_desired_size} "
            "(spareNodes), counted in the workers above",
        ],
        "nodes": {
            "coordinator_on_demand": 1,
            "workers_on_demand": od_workers,
            "workers_spot": spot_workers,
            "workers_spare": f.spare_nodes,
            "gpus": (1 + f.group_desired_size) * f.gpus_per_node,
        },
        "fleet_usd_per_hour": {
            "all_on_demand": round(all_on_demand, 2),
            "with_spot": round(mixed, 2),
            "savings_percent": round(100 * (1 - mixed / all_on_demand), 1),
            "root_volumes": volumes,
            "spare_nodes": round(mixed - without_spares[2], 2),
        },
        "standby": standby,
        "storage_usd_per_month": {
            "fsx": fsx,
            "buckets_per_tib_stored": round(per_tib, 2),
        },
        "replication_usd_per_tib_written": replication_per_tib(s),
        "network_usd_per_month": {
            "nat_gateway": round(nat, 2),
            "nat_per_gib_processed": 0.0 if s.network.adopt else net.get("nat_gateway_gib", 0.0),
        },
    }
