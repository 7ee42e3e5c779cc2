"""Sharded, asynchronous, verified checkpoints through storage tiers.

Layout and protocol: docs/CHECKPOINTS.md. The public entry points are imported lazily
so that ``ftfleet ckpt`` (which needs only the manifest code) starts without torch.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "CheckpointManager": "trainer.checkpoint.manager",
    "AppState": "trainer.checkpoint.state",
    "TrainProgress": "trainer.checkpoint.state",
    "Manifest": "trainer.checkpoint.manifest",
    "Restored": "trainer.checkpoint.restore",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)
