"""ftfleet's trainer: a checkpoint core and resilience pieces that any PyTorch loop can
use, and a reference training program built on them
(``torchrun ... -m ftfleet.trainer --config FILE``).

The library, for a loop of your own (README, "Your own training loop"; ``examples/own_loop.py``)::

    from ftfleet.trainer import AppState, CheckpointManager, Preemption

* :class:`AppState`: the training state as DCP saves it: model, optimizer, scheduler,
  progress, and any ``Stateful`` extras (shared) or per-rank parts (a data loader);
* :class:`CheckpointManager`: sharded asynchronous saves committed with a manifest,
  uploads to a bucket, restore of the newest valid checkpoint from any tier and world
  size; its own gloo groups;
* :class:`Preemption`: notices (SIGTERM, the cloud's metadata service) agreed across
  ranks, then the emergency save, the commit marker and exit 75;
* :class:`AnomalyDetector`, :class:`Watchdog`, :class:`NoticeWatcher`: the anomaly rule,
  the hang watchdog and the notice sources on their own;
* :class:`Callback`, :func:`train`: the reference loop and its extension point;
* :class:`SeededSamples`, :func:`sample_seed`: a sample's random augmentation as a
  function of the sample (exact at any loader worker count; the reference loop does
  this for every dataset);
* :func:`use_huge_pages`: large CPU tensors on transparent huge pages, not fresh 4 KiB
  pages every step (the reference loop calls it: ``train.huge_pages``).

Importing this package imports nothing heavy: ``ftfleet ckpt`` must start fast and the
fleet code imports nothing from here. Each name is imported on first use.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

# torchdata 0.11 calls a deprecated torch API on every DataLoader it builds (a loop's own
# StatefulDataLoader too): a warning per loader and rank that no user can act on.
warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)

_EXPORTS = {
    "AppState": "ftfleet.trainer.checkpoint.state",
    "TrainProgress": "ftfleet.trainer.checkpoint.state",
    "CheckpointManager": "ftfleet.trainer.checkpoint.manager",
    "CheckpointConfig": "ftfleet.trainer.config",
    "Preemption": "ftfleet.trainer.resilience.preemption.sequence",
    "Interruptions": "ftfleet.trainer.resilience.preemption.boundary",
    "NoticeWatcher": "ftfleet.trainer.resilience.notices.watcher",
    "Notice": "ftfleet.trainer.resilience.notices.notice",
    "AnomalyDetector": "ftfleet.trainer.resilience.anomaly.detector",
    "AnomalyConfig": "ftfleet.trainer.resilience.anomaly.detector",
    "Watchdog": "ftfleet.trainer.resilience.anomaly.watchdog",
    "Callback": "ftfleet.trainer.callbacks",
    "StepInfo": "ftfleet.trainer.callbacks",
    "StopRequest": "ftfleet.trainer.callbacks",
    "JobConfig": "ftfleet.trainer.config",
    "load_config": "ftfleet.trainer.config",
    "train": "ftfleet.trainer.train",
    "use_huge_pages": "ftfleet.trainer.hostmem",
    "SeededSamples": "ftfleet.trainer.data.seeded",
    "sample_seed": "ftfleet.trainer.data.seeded",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
