from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import DOCUMENT, NAMES, StackConfig, var
from ftfleet.lambdas.common.gcp import Metric

#: The audit-log method of a preemption; the stack's log sink routes exactly these.
PREEMPTED_METHOD = "compute.instances.preempted"
#: The decision logged once per preemption, which the stack's log-based metric counts,
#: with the fields of that line it counts by.
COUNTED = "recorded"
COUNT_LABELS = ("zone", "machine_type")
#: It writes no time series itself (handler.py).
METRICS: tuple[Metric, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    project: str = var("FTFLEET_GCP_PROJECT", "the project that runs the stack's instances")
    prefixes: tuple[str, ...] = var(
        "FTFLEET_INSTANCE_PREFIXES",
        "JSON list of the base instance names of the stack's managed instance groups (instances are <base>-<suffix>)",
        NAMES,
    )
    machine_types: dict = var(
        "FTFLEET_MACHINE_TYPES",
        "JSON object: base instance name -> machine type (a preempted VM is deleted, so it cannot be looked up)",
        DOCUMENT,
    )
    bucket: str = var("FTFLEET_CKPT_BUCKET", "the checkpoint bucket, which holds the interruption prior")
    root: str = var("FTFLEET_CKPT_ROOT", "object prefix of the run's checkpoints in that bucket (no trailing slash)")
