"""The GPU fleet part of a GCP stack's settings: machine types, GPUs, provisioning."""

from __future__ import annotations

import dataclasses
import re

from ftfleet.infra import catalog
from ftfleet.infra.gcp import machines
from ftfleet.infra.settings import _err, _Reader, spare_nodes

PROVISIONING_MODELS = ("SPOT", "STANDARD")
#: ftfleet's cap on the extended preemption notice: the trainer's emergency checkpoint
#: is sized for a notice of about two minutes (AWS's), and Google's documentation we
#: read names no upper bound.
MAX_PREEMPTION_NOTICE_S = 120


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
    image: str
    """The node image's name in image_project: pinned, never a family."""
    boot_disk_gib: int
    spare_nodes: int = 0
    """Booted workers kept beyond workerDesiredSize, in the main worker MIG."""

    @property
    def spot_workers(self) -> int:
        return self.worker_desired_size - self.on_demand_base_capacity if self.spot else 0

    @property
    def on_demand_workers(self) -> int:
        return self.worker_desired_size - self.spot_workers

    @property
    def spot(self) -> bool:
        return self.worker_provisioning_model == "SPOT"


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
    if series.gpu_network:
        raise _err(
            key,
            f"contains {machine_type}, which needs {series.gpu_network} for NCCL to use its network, and ftfleet "
            "does not declare that yet; use a2-ultragpu-8g or a2-highgpu-8g",
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


def parse_fleet(r: _Reader) -> GcpFleetSettings:
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
    spares = spare_nodes(r, desired, max_size)
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
    image_project, image = r.str("gcpImageProject"), r.str("gcpImage")
    if not re.fullmatch(r"[a-z][a-z0-9-]{4,28}[a-z0-9]", image_project):
        raise _err("gcpImageProject", f"is {image_project!r}; give the project id that holds the node image")
    if not image:
        raise _err(
            "gcpImage",
            "is required: pin the node image by name, e.g. the newest of a family from `gcloud compute images "
            f"describe-from-family <family> --project {image_project} --format='value(name)'`",
        )
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", image):
        raise _err(
            "gcpImage",
            f"is {image!r}; give one image's name (lowercase, digits, dashes; no path and no family), "
            "so that every pulumi up boots the same image",
        )
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
        image=image,
        boot_disk_gib=r.int("rootVolumeGiB", minimum=50, maximum=65536),
        spare_nodes=spares,
    )
