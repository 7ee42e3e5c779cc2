"""What a Compute Engine machine type brings: its GPUs, what it can attach, its network.

The GPU counts and prices are in infra/catalog.json (shared with the estimate); this
module adds the facts only GCP has, per machine series, from Google's "GPU machine
types" page (https://cloud.google.com/compute/docs/gpus) and "Create an A3, A2 or G2
VM" guides:

* A3, A2 and G2 machine types come with their GPUs attached: the instance template
  names no guest accelerators.
* N1 machine types have no GPUs of their own; they take guest accelerators of the
  models and counts below, and only those.
* A3 nodes reach their interconnect bandwidth (GPUDirect-TCPX/TCPXO) only within one
  zone, so a fleet of them stays in one zone.
* A3 Ultra boots from Hyperdisk; the other series boot from pd-ssd (the Vertex AI
  DiskSpec reference documents the same defaults).
"""

from __future__ import annotations

import dataclasses

#: Guest accelerators an N1 VM can take, with the counts Compute Engine accepts.
N1_GUEST_GPUS: dict[str, tuple[int, ...]] = {
    "nvidia-tesla-t4": (1, 2, 4),
    "nvidia-tesla-v100": (1, 2, 4, 8),
    "nvidia-tesla-p100": (1, 2, 4),
    "nvidia-tesla-p4": (1, 2, 4),
}

#: Every accelerator type name Compute Engine uses, built-in or guest; a name outside
#: this set is most likely a typo.
KNOWN_GPU_TYPES = frozenset(
    set(N1_GUEST_GPUS)
    | {
        "nvidia-l4",
        "nvidia-tesla-a100",
        "nvidia-a100-80gb",
        "nvidia-h100-80gb",
        "nvidia-h100-mega-80gb",
        "nvidia-h200-141gb",
    }
)


@dataclasses.dataclass(frozen=True, slots=True)
class Series:
    prefix: str
    builtin_gpus: bool
    """True when the machine type comes with its GPUs (A3, A2, G2)."""
    single_zone: bool
    """True when the GPU interconnect only works among nodes of one zone."""
    boot_disk_type: str


SERIES: tuple[Series, ...] = (
    Series("a3-ultragpu-", builtin_gpus=True, single_zone=True, boot_disk_type="hyperdisk-balanced"),
    Series("a3-", builtin_gpus=True, single_zone=True, boot_disk_type="pd-ssd"),
    Series("a2-", builtin_gpus=True, single_zone=False, boot_disk_type="pd-ssd"),
    Series("g2-", builtin_gpus=True, single_zone=False, boot_disk_type="pd-ssd"),
    Series("n1-", builtin_gpus=False, single_zone=False, boot_disk_type="pd-ssd"),
)


def series(machine_type: str) -> Series | None:
    for s in SERIES:
        if machine_type.startswith(s.prefix):
            return s
    return None
