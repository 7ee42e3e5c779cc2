"""Resilience building blocks of the trainer: interruption notices, their agreement
across ranks, the preemption sequence, anomaly handling, the hang watchdog, the
checkpoint interval, commit markers and metrics. docs/RESILIENCE.md shows how they fit
together; ``reference.py`` wires them into the reference loop.

``agree`` imports torch; it is loaded on first use so that the rest stays light.
"""

from __future__ import annotations

from typing import Any

from ftfleet.trainer.resilience.anomaly import Action, AnomalyConfig, AnomalyDetector, Decision, RepeatedAnomalyError
from ftfleet.trainer.resilience.config import ResilienceConfig
from ftfleet.trainer.resilience.interruptions import AgreedNotice, Interruptions
from ftfleet.trainer.resilience.interval import AdaptiveInterval, IntervalConfig, daly_interval, young_interval
from ftfleet.trainer.resilience.markers import MarkerWrite, publish_marker, read_local_marker, write_local_marker
from ftfleet.trainer.resilience.metrics import JsonFormatter, Metrics, configure_json_logging
from ftfleet.trainer.resilience.notices import Notice, NoticeKind, NoticeSource, most_urgent
from ftfleet.trainer.resilience.preemption import Preemption
from ftfleet.trainer.resilience.watchdog import Watchdog, WatchdogConfig
from ftfleet.trainer.resilience.watcher import NoticeWatcher, WatcherConfig

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
        from ftfleet.trainer.resilience.agreement import agree

        return agree
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
