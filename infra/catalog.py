"""Instance facts and list prices shipped with the package (infra/catalog.json).

Validation uses the GPU counts and generations, EFA support, network cards and EFA
groups; `ftfleet plan` uses the prices for an estimate that it labels as one, with the
date the prices were recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

CATALOG_JSON = Path(__file__).with_name("catalog.json")


@dataclasses.dataclass(frozen=True, slots=True)
class InstanceSpec:
    name: str
    gpus: int
    gpu: str
    efa: bool
    on_demand_hourly: float
    spot_hourly: float
    generation: str = ""
    """GPUs that pace a training step alike; one job uses one generation."""
    network_cards: int = 1
    efa_interfaces: int = 0
    """Most EFA interfaces the type takes: one per network card on EFA types."""
    efa_group: str = ""
    """EFA traffic flows only between types of the same group."""


@functools.cache
def _data() -> dict[str, Any]:
    return json.loads(CATALOG_JSON.read_text(encoding="utf-8"))


def instance(cloud: str, name: str) -> InstanceSpec | None:
    spec = _data()["instances"].get(cloud, {}).get(name)
    return None if spec is None else InstanceSpec(name=name, **spec)


def instance_names(cloud: str) -> list[str]:
    return sorted(_data()["instances"].get(cloud, {}))


def storage_prices(cloud: str) -> dict[str, Any]:
    return _data()["storage"].get(cloud, {})


def network_prices(cloud: str) -> dict[str, Any]:
    return _data().get("network", {}).get(cloud, {})


def prices_as_of() -> str:
    return _data()["prices_as_of"]


def price_region(cloud: str) -> str:
    return _data()["price_region"][cloud]


def gcp_image_kernel(image: str) -> str | None:
    """The kernel a GCP node image boots, where the catalog records it."""
    return _data().get("gcp_node_images", {}).get("images", {}).get(image, {}).get("kernel")


def lustre_client_kernels() -> tuple[str, ...]:
    """Kernels Google publishes the Managed Lustre client for (empty: not recorded)."""
    return tuple(_data().get("gcp_node_images", {}).get("lustre_client_kernels", ()))


def spot_interruption_prior(cloud: str) -> dict[str, Any] | None:
    """The dated per-type interruption bands the catalog records for ``cloud`` (``as_of``,
    ``region``, ``ranges``, ``bands``: type -> range index), or None."""
    return _data().get("spot_interruption_prior", {}).get(cloud)
