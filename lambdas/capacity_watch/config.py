from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import NAMES, SECONDS, StackConfig, var


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    groups: tuple[str, ...] = var("FTFLEET_GROUPS", "JSON list of the stack's Auto Scaling group names", NAMES)
    loss_s: float = var(
        "FTFLEET_CAPACITY_LOSS_S",
        "seconds of unfulfilled capacity after which the run counts as out of capacity",
        SECONDS,
    )
