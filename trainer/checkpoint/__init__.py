"""Sharded, asynchronous, verified checkpoints through storage tiers.

Layout and protocol: docs/CHECKPOINTS.md. The public entry points are imported lazily
so that ``ftfleet ckpt`` (which needs only the manifest code) starts without torch.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "CheckpointManager": "ftfleet.trainer.checkpoint.manager",
    "AppState": "ftfleet.trainer.checkpoint.state",
    "TrainProgress": "ftfleet.trainer.checkpoint.state",
    "Manifest": "ftfleet.trainer.checkpoint.manifest",
    "Restored": "ftfleet.trainer.checkpoint.restore",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
