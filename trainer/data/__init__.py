"""The data path: datasets (``synthetic``, ``token_shards`` or the user's), the global
sample order, and the per-rank reader whose state goes into the checkpoint.

* :mod:`.loader`: :class:`GlobalBatches`, a rank's share of each global batch.
* :mod:`.order`: which dataset index each global position reads.
* :mod:`.seeded`: each sample fetched under RNGs seeded for it (exact augmentation).
* :mod:`.shards`: the on-disk token shard format (docs/DATA.md) and its dataset.
* :mod:`.prepare`: ``ftfleet data prepare``.
* :mod:`.synthetic`: the learnable random stream the tests train on.

Importing this package imports neither torch nor numpy.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "Batch": "ftfleet.trainer.data.loader",
    "GlobalBatches": "ftfleet.trainer.data.loader",
    "SyntheticTokens": "ftfleet.trainer.data.synthetic",
    "TokenShards": "ftfleet.trainer.data.shards",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(name)


def register(subparsers: Any) -> None:
    """``ftfleet data`` (ftfleet/cli.py)."""
    from ftfleet.trainer.data.prepare import register as _register

    _register(subparsers)
