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
* A3 nodes need more than the one NIC ftfleet declares: "Maximize GPU network bandwidth
  with GPUDirect-TCPX and multi-networking" (https://cloud.google.com/compute/docs/gpus/gpudirect)
  gives A3 High four extra NICs and A3 Mega eight, each in its own VPC network, plus a
  receive-datapath manager on the host and the matching NCCL plugin in the container;
  A3 Ultra reaches its GPUs' network over RDMA NICs. Without them NCCL runs over one
  NIC, as P5 without EFA would on AWS. Until ftfleet declares that setup, the settings
  refuse A3 machine types (``Series.gpu_network``).
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

#: NICs an A3 template needs for GPUDirect-TCPX (A3 High) and -TCPXO (A3 Mega): one for
#: the host and 4 or 8 for GPU traffic ("Maximize GPU network bandwidth with GPUDirect").
GPUDIRECT_NICS = {"a3-highgpu-": 5, "a3-megagpu-": 9}

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
    gpu_network: str = ""
    """The multi-NIC GPU networking the series needs and ftfleet does not declare yet;
    empty when one gVNIC carries the job's traffic."""


SERIES: tuple[Series, ...] = (
    Series(
        "a3-ultragpu-",
        builtin_gpus=True,
        single_zone=True,
        boot_disk_type="hyperdisk-balanced",
        gpu_network="GPUDirect-RDMA (RDMA NICs on a RoCE network)",
    ),
    Series(
        "a3-",
        builtin_gpus=True,
        single_zone=True,
        boot_disk_type="pd-ssd",
        gpu_network="GPUDirect-TCPX/TCPXO (extra NICs in their own VPCs, the RxDM service, the NCCL plugin)",
    ),
    Series("a2-", builtin_gpus=True, single_zone=False, boot_disk_type="pd-ssd"),
    Series("g2-", builtin_gpus=True, single_zone=False, boot_disk_type="pd-ssd"),
    Series("n1-", builtin_gpus=False, single_zone=False, boot_disk_type="pd-ssd"),
)


def series(machine_type: str) -> Series | None:
    for s in SERIES:
        if machine_type.startswith(s.prefix):
            return s
    return None
