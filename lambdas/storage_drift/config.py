from __future__ import annotations

import dataclasses
from typing import Any

from ftfleet.lambdas.common.config import DOCUMENT, StackConfig, var


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    buckets: dict[str, Any] = var(
        "FTFLEET_DESIRED_BUCKETS",
        "JSON object: bucket name -> its region and the settings the program rendered (API shapes)",
        DOCUMENT,
    )
    association: dict[str, Any] = var(
        "FTFLEET_DESIRED_ASSOCIATION",
        "JSON object: the FSx data repository association the program rendered",
        DOCUMENT,
    )
