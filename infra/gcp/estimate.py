"""Cost estimate of a GCP stack from the dated price table in infra/catalog.json."""

from __future__ import annotations

from ftfleet.infra import catalog
from ftfleet.infra.estimate import standby_estimate
from ftfleet.infra.gcp.settings import GcpSettings

GIB_PER_TIB = 1024


def _node_hourly(s: GcpSettings, machine_type: str, spot: bool) -> float:
    spec = catalog.instance("gcp", machine_type)
    hourly = spec.spot_hourly if spot else spec.on_demand_hourly
    if s.fleet.guest_gpu_type:
        gpu = catalog.storage_prices("gcp")["guest_gpu_hourly"][s.fleet.guest_gpu_type]
        hourly += s.fleet.guest_gpu_count * gpu["spot" if spot else "on_demand"]
    return hourly


def estimate(s: GcpSettings) -> dict:
    f, st, b = s.fleet, s.storage, s.buckets
    prices = catalog.storage_prices("gcp")
    coordinator = _node_hourly(s, f.coordinator_machine_type, spot=False)
    # The worker templates name the first type; the flexibility policy may pick others.
    worker_type = f.worker_machine_types[0]
    on_demand, spot = _node_hourly(s, worker_type, spot=False), _node_hourly(s, worker_type, spot=True)
    # spareNodes run in the main worker group: Spot when it is.
    spares = f.spare_nodes * (spot if f.spot else on_demand)
    all_on_demand = coordinator + (f.worker_desired_size + f.spare_nodes) * on_demand
    mixed = coordinator + f.on_demand_workers * on_demand + f.spot_workers * spot + spares
    if st.kind == "managed-lustre":
        fs_rate = prices["managed_lustre_gib_month"][str(st.lustre_throughput_per_tib)]
        fs_label = f"Managed Lustre ({st.lustre_capacity_gib:,} GiB at {st.lustre_throughput_per_tib} MB/s/TiB)"
    else:
        fs_rate = prices["parallelstore_gib_month"]
        fs_label = f"Parallelstore ({st.parallelstore_capacity_gib:,} GiB {st.parallelstore_deployment_type})"
    replication = prices["gcs_replication_gib"]["turbo" if b.turbo_replication else "default"]
    fs = round(st.capacity_gib * fs_rate, 2)
    standby = standby_estimate(s, fs, 0.0, mixed)
    return {
        "cloud": "gcp",
        "label": (
            f"ESTIMATE from list prices recorded {catalog.prices_as_of()} for "
            f"{catalog.price_region('gcp')}; Spot prices vary by zone and over time"
        ),
        "prices_as_of": catalog.prices_as_of(),
        "nodes": {
            "coordinator_on_demand": 1,
            "workers_on_demand": f.on_demand_workers,
            "workers_spot": f.spot_workers + (f.spare_nodes if f.spot else 0),
            "workers_spare": f.spare_nodes,
            "gpus": (1 + f.worker_desired_size + f.spare_nodes) * f.gpus_per_node,
        },
        "fleet_usd_per_hour": {
            "all_on_demand": round(all_on_demand, 2),
            "with_spot": round(mixed, 2),
            "savings_percent": round(100 * (1 - mixed / all_on_demand), 1),
            "spare_nodes": round(spares, 2),
        },
        "standby": standby,
        "storage_usd_per_month": {
            "file_system": fs,
            "file_system_label": fs_label,
            # A dual-region bucket bills storage in both regions: no replica bucket.
            "buckets_per_tib_stored": round(GIB_PER_TIB * prices["gcs_dual_region_standard_gib_month"], 2),
        },
        "replication_usd_per_tib_written": round(GIB_PER_TIB * replication, 2),
    }
