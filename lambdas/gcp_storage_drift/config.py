from __future__ import annotations

import dataclasses

from ftfleet.lambdas.common.config import NAMES, StackConfig, var

#: Audit-log methods that can weaken a managed bucket; the stack's log sink routes these.
WATCHED_METHODS = ("storage.setIamPermissions", "storage.buckets.update")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config(StackConfig):
    project: str = var("FTFLEET_GCP_PROJECT", "the project of the managed buckets")
    buckets: tuple[str, ...] = var("FTFLEET_BUCKETS", "JSON list of the bucket names this stack manages", NAMES)
    desired_uri: str = var(
        "FTFLEET_DESIRED_URI",
        "gs://<bucket>/<key> of the JSON object the stack writes before it changes a managed bucket: the "
        "settings it declares (versioning, uniform_bucket_level_access, public_access_prevention, "
        "soft_delete_seconds), read at every event",
    )
