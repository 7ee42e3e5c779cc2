from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import NAMES, PAIR, SECONDS, StackConfig, var
from ftfleet.lambdas.common.pair import Pair


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    groups: tuple[str, ...] = var("FTFLEET_GROUPS", "JSON list of the stack's Auto Scaling group names", NAMES)
    loss_s: float = var(
        "FTFLEET_CAPACITY_LOSS_S",
        "seconds of unfulfilled capacity after which the run counts as out of capacity",
        SECONDS,
    )
    failover: Pair | None = var(
        "FTFLEET_FAILOVER",
        "a standby's home, itself and the run lease: the run moves to the region that has capacity (empty: never)",
        PAIR,
        default=None,
    )
