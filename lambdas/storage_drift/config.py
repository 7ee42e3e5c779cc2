from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

from ftfleet.lambdas.common.config import FunctionConfigError, StackConfig, var

#: The settings the program rendered travel inside the function's package, next to this
#: module, not in an environment variable: Lambda allows 4 KB of environment in all,
#: and two buckets' policies, lifecycles and replication come close to that alone.
DESIRED_FILE = "desired.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    desired_file: str = var(
        "FTFLEET_DESIRED_FILE",
        "the JSON document of the settings the program rendered, relative to the function's package",
        default=DESIRED_FILE,
    )

    def validate(self) -> None:
        desired(self.desired_file)

    @property
    def buckets(self) -> dict[str, Any]:
        """Bucket name -> its region and settings, in the S3 API's shapes."""
        return desired(self.desired_file)["buckets"]

    @property
    def association(self) -> dict[str, Any]:
        """The FSx data repository association, in the FSx API's shapes."""
        return desired(self.desired_file)["association"]


@functools.cache
def desired(name: str) -> dict[str, Any]:
    path = Path(__file__).with_name(name) if not Path(name).is_absolute() else Path(name)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FunctionConfigError(
            f"FTFLEET_DESIRED_FILE={name!r}: cannot read the rendered settings ({exc}); run `pulumi up`"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("buckets"), dict) or not document["buckets"]:
        raise FunctionConfigError(f"FTFLEET_DESIRED_FILE={name!r}: no `buckets` object in it; run `pulumi up`")
    if not isinstance(document.get("association"), dict):
        raise FunctionConfigError(f"FTFLEET_DESIRED_FILE={name!r}: no `association` object in it; run `pulumi up`")
    return document


def render(buckets: dict[str, Any], association: dict[str, Any]) -> str:
    """The document the program puts into the package."""
    return json.dumps({"buckets": buckets, "association": association}, indent=1, sort_keys=True) + "\n"
