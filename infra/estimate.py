"""Cost estimate of a stack from the dated price table in infra/catalog.json."""

from __future__ import annotations

import math

from ftfleet.infra import catalog
from ftfleet.infra.settings import Settings

HOURS_PER_MONTH = 730


def estimate(s: Settings) -> dict:
    if s.cloud == "gcp":
        from ftfleet.infra.gcp.estimate import estimate as estimate_gcp

        return estimate_gcp(s)
    f = s.fleet
    coordinator = catalog.instance(s.cloud, f.coordinator_instance_type)
    workers = [catalog.instance(s.cloud, t) for t in f.worker_instance_types]
    desired = f.worker_desired_size
    # Mixed-instances arithmetic: the base first, then the percentage of the rest.
    od_workers = min(desired, f.on_demand_base_capacity)
    od_workers += math.ceil(max(0, desired - od_workers) * f.on_demand_percent_above_base / 100)
    spot_workers = desired - od_workers
    # Weighted capacity 1 per type and no priorities: assume the fleet spreads evenly.
    od_avg = sum(w.on_demand_hourly for w in workers) / len(workers)
    spot_avg = sum(w.spot_hourly for w in workers) / len(workers)
    all_on_demand = coordinator.on_demand_hourly + desired * od_avg
    mixed = coordinator.on_demand_hourly + od_workers * od_avg + spot_workers * spot_avg
    prices = catalog.storage_prices(s.cloud)
    fsx_rate = prices["fsx_persistent2_gib_month"][str(s.storage.fsx_throughput_per_tib)]
    per_tib = 1024 * (2 * prices["s3_standard_gib_month"])  # primary + replica, before tiering
    return {
        "label": (
            f"ESTIMATE from list prices recorded {catalog.prices_as_of()} for "
            f"{catalog.price_region(s.cloud)}; spot prices vary by zone and hour"
        ),
        "prices_as_of": catalog.prices_as_of(),
        "nodes": {
            "coordinator_on_demand": 1,
            "workers_on_demand": od_workers,
            "workers_spot": spot_workers,
            "gpus": (1 + desired) * f.gpus_per_node,
        },
        "fleet_usd_per_hour": {
            "all_on_demand": round(all_on_demand, 2),
            "with_spot": round(mixed, 2),
            "savings_percent": round(100 * (1 - mixed / all_on_demand), 1),
        },
        "storage_usd_per_month": {
            "fsx": round(s.storage.fsx_storage_capacity_gib * fsx_rate, 2),
            "buckets_per_tib_stored": round(per_tib, 2),
        },
    }
