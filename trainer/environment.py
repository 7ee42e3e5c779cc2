"""The trainer's one reader of its ``FTFLEET_*`` environment variables.

The fleet passes the contract's variables (:data:`ftfleet.contract.TRAINER_ENV`,
docs/CONTRACT.md) into the container; the in-process launcher passes three of its own to
its workers (:data:`ACTIVE_WORLD_SIZE`, :data:`MIN_ACTIVE_WORLD_SIZE`,
:data:`LAUNCHER_PID`, :data:`INPROCESS_LAYOUT`). Every module of the trainer that needs one asks a
:class:`TrainerEnvironment`; none reads ``os.environ`` for an ``FTFLEET_*`` name itself
(a test keeps it so). Each property
validates its own variable when it is asked for, so a bad value stops only what uses
it, with one line naming the variable and the fix (:class:`~ftfleet.errors.ConfigError`).

Values that set config keys (:data:`CONFIG_OVERRIDES`) are applied by the config
loader, between the file and the command line's ``key=value`` overrides.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ftfleet.contract import CLOUDS, HOST_ALLOCATOR_ENV
from ftfleet.errors import ConfigError

#: Variables of the contract that set config keys: variable -> dotted key.
CONFIG_OVERRIDES = {
    "FTFLEET_RUN_ID": "run_id",
    "FTFLEET_RUN_DIR": "run_dir",
    "FTFLEET_CKPT_DIR": "checkpoint.dir",
    "FTFLEET_CKPT_URI": "checkpoint.uri",
    "FTFLEET_CKPT_REPLICA_URI": "checkpoint.replica_uri",
    "FTFLEET_CKPT_UPLOAD": "checkpoint.upload",
    "FTFLEET_SHM_DIR": "checkpoint.memory_root",
    "FTFLEET_PREEMPTION_NOTICE_S": "resilience.watcher.gcp_preemption_notice_s",
    "FTFLEET_LEASE_URI": "checkpoint.lease_uri",
    "FTFLEET_LEASE_HOLDER": "checkpoint.lease_holder",
}

#: Set by the in-process launcher for its workers: how many of them train (the rest
#: are spares), and how few may train on after a loss without a spare.
ACTIVE_WORLD_SIZE = "FTFLEET_ACTIVE_WORLD_SIZE"
MIN_ACTIVE_WORLD_SIZE = "FTFLEET_MIN_ACTIVE_WORLD_SIZE"
#: Set by the in-process launcher (``--group-size``): a smaller world drops whole blocks
#: of this many consecutive ranks (HSDP's replica groups).
GROUP_SIZE = "FTFLEET_GROUP_SIZE"
#: Set by the in-process launcher for its workers: its own pid, the process whose death
#: ends them (:mod:`ftfleet.trainer.resilience.fencing.launcher`).
LAUNCHER_PID = "FTFLEET_LAUNCHER_PID"
#: Set by the in-process launcher for its workers: the job's nodes and processes,
#: ``training_nodes:spare_nodes:nproc:spares`` (:class:`ftfleet.trainer.inprocess.ranks.Layout`).
INPROCESS_LAYOUT = "FTFLEET_INPROCESS_LAYOUT"
#: Set by the in-process launcher for each worker: a file on the node where the worker
#: notes the rank it trains at each attempt, so that the launcher asks for the same
#: node slot in the next round (:func:`ftfleet.trainer.inprocess.stores.join`).
INPROCESS_RANK_FILE = "FTFLEET_INPROCESS_RANK_FILE"
#: Set by the in-process launcher for a warm process (``--assign-from-stdin``): a file
#: it creates once warm, waiting for its place, so that a node waiting for the next
#: round counts itself only when its processes could take their places at once.
WARM_READY_FILE = "FTFLEET_WARM_READY_FILE"

#: The trainer's cloud values: the contract's clouds, or none (signals only).
CLOUD_CHOICES = (*CLOUDS, "none")
LOG_FORMATS = ("text", "json")


class TrainerEnvironment:
    """Typed views of ``environ`` (default: ``os.environ``), read when asked."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.environ = os.environ if environ is None else environ

    def _get(self, name: str) -> str:
        return self.environ.get(name) or ""

    @property
    def node_id(self) -> str:
        """FTFLEET_NODE_ID: this node's identity ("" when unset)."""
        return self._get("FTFLEET_NODE_ID")

    @property
    def run_id(self) -> str:
        """FTFLEET_RUN_ID ("" when unset)."""
        return self._get("FTFLEET_RUN_ID")

    @property
    def cloud(self) -> str:
        """FTFLEET_CLOUD: ``aws``, ``gcp``, or ``none`` when unset (signals only)."""
        cloud = self._get("FTFLEET_CLOUD") or "none"
        if cloud not in CLOUD_CHOICES:
            raise ConfigError(f"FTFLEET_CLOUD={cloud!r}: use aws or gcp (or leave it unset to watch signals only)")
        return cloud

    @property
    def aws_region(self) -> str | None:
        """The node's region when it runs on AWS (FTFLEET_CLOUD=aws and FTFLEET_REGION
        set), else None: the node-side AWS calls are off."""
        if self._get("FTFLEET_CLOUD") != "aws":
            return None
        return self._get("FTFLEET_REGION") or None

    @property
    def metadata_endpoint(self) -> str | None:
        """FTFLEET_METADATA_ENDPOINT (None: the cloud's default address)."""
        return self._get("FTFLEET_METADATA_ENDPOINT").rstrip("/") or None

    @property
    def group_name(self) -> str | None:
        """FTFLEET_GROUP_NAME: the node's Auto Scaling group (None: read from IMDS)."""
        return self._get("FTFLEET_GROUP_NAME") or None

    @property
    def metrics_port(self) -> int:
        """FTFLEET_METRICS_PORT: local rank r serves metrics on this + r (0: off)."""
        raw = self._get("FTFLEET_METRICS_PORT") or "0"
        if not raw.isdigit() or int(raw) > 65535:
            raise ConfigError(f"FTFLEET_METRICS_PORT={raw!r}: use a port number, or 0 for off")
        return int(raw)

    @property
    def config_file(self) -> str | None:
        """FTFLEET_CONFIG: the trainer's config file (None when unset)."""
        return self._get("FTFLEET_CONFIG") or None

    @property
    def log_format(self) -> str:
        """FTFLEET_LOG_FORMAT: ``text`` (default) or ``json``."""
        value = self._get("FTFLEET_LOG_FORMAT") or "text"
        if value not in LOG_FORMATS:
            raise ConfigError(f"FTFLEET_LOG_FORMAT={value!r}: use text or json")
        return value

    @property
    def host_allocator(self) -> str:
        """FTFLEET_HOST_ALLOCATOR as set ("" when unset; the contract checks its value)."""
        return self._get(HOST_ALLOCATOR_ENV)

    @property
    def active_world_size(self) -> int | None:
        """FTFLEET_ACTIVE_WORLD_SIZE (in-process workers): ranks that train; None when unset."""
        return self._count(ACTIVE_WORLD_SIZE)

    @property
    def min_active_world_size(self) -> int | None:
        """FTFLEET_MIN_ACTIVE_WORLD_SIZE (in-process workers); None when unset."""
        return self._count(MIN_ACTIVE_WORLD_SIZE)

    @property
    def group_size(self) -> int:
        """FTFLEET_GROUP_SIZE (in-process workers); 1 when unset."""
        return self._count(GROUP_SIZE) or 1

    @property
    def launcher_pid(self) -> int | None:
        """FTFLEET_LAUNCHER_PID (in-process workers): the launcher's pid; None when unset."""
        return self._count(LAUNCHER_PID)

    @property
    def inprocess_layout(self) -> Any:
        """FTFLEET_INPROCESS_LAYOUT (in-process workers): the job's
        :class:`~ftfleet.trainer.inprocess.ranks.Layout`; None when unset."""
        raw = self._get(INPROCESS_LAYOUT)
        if not raw:
            return None
        from ftfleet.trainer.inprocess.ranks import Layout

        try:
            return Layout.parse(raw)
        except ValueError as exc:
            why = f"{INPROCESS_LAYOUT}={exc}"
            raise ConfigError(f"{why}: the in-process launcher sets it; start the workers with that launcher") from None

    def config_overrides(self) -> list[tuple[str, str, str]]:
        """(variable, dotted config key, value) of each set :data:`CONFIG_OVERRIDES` variable."""
        return [(var, key, self.environ[var]) for var, key in CONFIG_OVERRIDES.items() if self.environ.get(var)]

    def _count(self, name: str) -> int | None:
        raw = self._get(name)
        if not raw:
            return None
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigError(f"{name}={raw!r}: use a count >= 1 (the in-process launcher sets it)")
        return int(raw)
