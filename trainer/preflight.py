"""Checks of the resolved config against this process's environment, before anything
starts: before ``init_process_group``, before a step is trained, before a file is
written. A failure is one :class:`~ftfleet.errors.ConfigError` line (exit 2)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path

from ftfleet.errors import ConfigError
from ftfleet.trainer.config import JobConfig


def preflight(cfg: JobConfig, environ: Mapping[str, str] | None = None) -> None:
    environ = os.environ if environ is None else environ
    world = int(environ.get("WORLD_SIZE") or 1)
    batch = cfg.train.global_batch_size
    if batch % world:
        raise ConfigError(
            f"train.global_batch_size={batch} is not divisible by the world size {world}: "
            f"choose a multiple of {world}, or run on a number of processes that divides {batch}"
        )
    dirs = [("run_dir", cfg.run_dir)]
    if cfg.checkpoint.enabled or cfg.checkpoint.load:
        dirs.append(("checkpoint.dir", cfg.checkpoint.dir))
    for key, path in dirs:
        writable(key, Path(path))


def writable(key: str, path: Path) -> None:
    """Create ``path`` if needed and write a probe file into it (every rank: a rank on
    another node may see another mount). Raises a ConfigError naming ``key``."""
    probe = path / f".ftfleet-probe-{uuid.uuid4().hex}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"{key}={str(path)!r} is not writable ({exc.strerror or exc}): point it at a directory this user can write"
        ) from None
