"""The one module that reads Pulumi configuration.

Everything else in infra/ receives a validated :class:`ftfleet.infra.settings.Settings`.
"""

from __future__ import annotations

import pulumi
from pulumi.runtime import config as runtime_config

from ftfleet.infra import settings

_PREFIX = f"{settings.PROJECT}:"


def _all_keys() -> set[str]:
    # Pulumi exposes no public "list config" call; the language host hands the program
    # its config through PULUMI_CONFIG (and mocks through set_all_config), so the union
    # of both is every key the stack sets. Needed to reject unknown (mistyped) keys.
    return set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())


def load() -> settings.Settings:
    """Validated settings of the current stack; raises ConfigError with one line."""
    raw = {key[len(_PREFIX) :]: runtime_config.get_config(key) for key in _all_keys() if key.startswith(_PREFIX)}
    cloud = raw.get("cloud") or "aws"
    region = pulumi.Config(cloud).get("region") if cloud in settings.CLOUDS else None
    return settings.parse(raw, stack=pulumi.get_stack(), region=region)
