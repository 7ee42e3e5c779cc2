from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import NAMES, PAIR, SECONDS, StackConfig, var
from ftfleet.lambdas.common.gcp import Metric
from ftfleet.lambdas.common.pair import Pair

LABELS = ("stack", "run")
#: Written at every run of the watch (the stack's silence alert waits for it).
CAPACITY_SHORT_NODES = Metric(
    "capacity_short_nodes",
    "1",
    LABELS,
    "Nodes the stack's managed instance groups are short: target size less instances running with no action pending",
)
#: The stack alerts on it at or above capacityLossMinutes.
CAPACITY_SHORT_SECONDS = Metric(
    "capacity_short_seconds",
    "s",
    LABELS,
    "The longest a managed instance group of the stack has been short for want of zonal resources, 0 when none is",
)
#: Every metric the watch writes, both at every run.
METRICS = (CAPACITY_SHORT_NODES, CAPACITY_SHORT_SECONDS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    project: str = var("FTFLEET_GCP_PROJECT", "the project of the groups, where the capacity metrics are written")
    region: str = var("FTFLEET_GCP_REGION", "the region of the stack's regional managed instance groups")
    groups: tuple[str, ...] = var(
        "FTFLEET_GROUPS", "JSON list of the stack's regional managed instance group names", NAMES
    )
    loss_s: float = var(
        "FTFLEET_CAPACITY_LOSS_S",
        "seconds of unfulfilled capacity after which the run counts as out of capacity",
        SECONDS,
    )
    bucket: str = var("FTFLEET_CKPT_BUCKET", "the checkpoint bucket, which holds the watch's state object")
    state_key: str = var("FTFLEET_STATE_KEY", "object the watch keeps its shortages in")
    failover: Pair | None = var(
        "FTFLEET_FAILOVER",
        "a standby's home, itself and the run lease: the run moves to the region that has capacity (empty: never)",
        PAIR,
        default=None,
    )
