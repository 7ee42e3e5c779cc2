"""Resilience of the trainer, one folder per concern:

* ``notices/``: where interruption notices come from (signals, the clouds' metadata
  services);
* ``preemption/``: what happens on a notice, one module per step (agreement at the
  step boundary, emergency checkpoint, commit marker, release of the node, exit);
* ``anomaly/``: bad losses and gradients (skip or roll back), and hangs (the watchdog);
* ``interval/``: how often to checkpoint (Daly's optimum, the fleet's prior, the
  save schedule);
* ``observability/``: metrics, the node's heartbeat, the step monitor.

``config.py`` is the ``resilience:`` block of the trainer config; ``reference.py``
wires the pieces into the reference loop. docs/RESILIENCE.md shows how they fit
together. ``agree`` imports torch; it is loaded on first use so that the rest stays
light.
"""

from __future__ import annotations

from typing import Any

from ftfleet.trainer.resilience.anomaly.detector import (
    Action,
    AnomalyConfig,
    AnomalyDetector,
    Decision,
    RepeatedAnomalyError,
)
from ftfleet.trainer.resilience.anomaly.watchdog import Watchdog, WatchdogConfig
from ftfleet.trainer.resilience.config import ResilienceConfig
from ftfleet.trainer.resilience.interval.adaptive import AdaptiveInterval, IntervalConfig, daly_interval, young_interval
from ftfleet.trainer.resilience.notices.notice import Notice, NoticeKind, NoticeSource, most_urgent
from ftfleet.trainer.resilience.notices.watcher import NoticeWatcher, WatcherConfig
from ftfleet.trainer.resilience.observability.metrics import JsonFormatter, Metrics, configure_json_logging
from ftfleet.trainer.resilience.preemption.boundary import AgreedNotice, Interruptions
from ftfleet.trainer.resilience.preemption.marker import (
    MarkerWrite,
    publish_marker,
    read_local_marker,
    write_local_marker,
)
from ftfleet.trainer.resilience.preemption.sequence import Preemption

__all__ = [
    "Action",
    "AdaptiveInterval",
    "AgreedNotice",
    "AnomalyConfig",
    "AnomalyDetector",
    "Decision",
    "IntervalConfig",
    "Interruptions",
    "JsonFormatter",
    "MarkerWrite",
    "Metrics",
    "Notice",
    "NoticeKind",
    "NoticeSource",
    "NoticeWatcher",
    "Preemption",
    "RepeatedAnomalyError",
    "ResilienceConfig",
    "Watchdog",
    "WatchdogConfig",
    "WatcherConfig",
    "agree",
    "configure_json_logging",
    "daly_interval",
    "most_urgent",
    "publish_marker",
    "read_local_marker",
    "write_local_marker",
    "young_interval",
]


def __getattr__(name: str) -> Any:
    if name == "agree":
        from ftfleet.trainer.resilience.preemption.agreement import agree

        return agree
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
