"""The resilience block of the trainer config: one field per building block, so that
the trainer config nests it as ``resilience:`` and each part stays next to its code.
Loading and type checking are trainer/config.py's; each block validates itself."""

from __future__ import annotations

import dataclasses

from ftfleet.trainer.resilience.anomaly.detector import AnomalyConfig
from ftfleet.trainer.resilience.anomaly.watchdog import WatchdogConfig
from ftfleet.trainer.resilience.interval.adaptive import IntervalConfig
from ftfleet.trainer.resilience.notices.watcher import WatcherConfig
from ftfleet.trainer.resilience.observability.node_metrics import NodeMetricsConfig


@dataclasses.dataclass(kw_only=True, slots=True)
class ResilienceConfig:
    """Notices, anomalies, the hang watchdog, the checkpoint interval and the node's heartbeat."""

    watcher: WatcherConfig = dataclasses.field(default_factory=WatcherConfig)
    """How interruption notices are watched (poll intervals, deadlines, signals)."""
    anomaly: AnomalyConfig = dataclasses.field(default_factory=AnomalyConfig)
    """What counts as an anomalous step, and skip or rollback."""
    watchdog: WatchdogConfig = dataclasses.field(default_factory=WatchdogConfig)
    """When a rank counts as hung."""
    interval: IntervalConfig = dataclasses.field(default_factory=IntervalConfig)
    """How often to checkpoint (Daly's optimum or a fixed interval)."""
    node_metrics: NodeMetricsConfig = dataclasses.field(default_factory=NodeMetricsConfig)
    """The per-node CloudWatch heartbeat (AWS) that the unhealthy_node function judges."""
