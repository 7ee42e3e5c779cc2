"""Prometheus metrics of one trainer process, and JSON log lines.

Every rank serves its own registry on ``FTFLEET_METRICS_PORT + LOCAL_RANK`` (port 0:
no exporter), so that eight ranks on a node do not fight over one port; each series
carries ``node`` and ``rank`` labels.

| metric | type | meaning |
| --- | --- | --- |
| ``ftfleet_steps_total`` | counter | optimizer steps completed |
| ``ftfleet_step_seconds`` | histogram | wall time of one training step |
| ``ftfleet_checkpoint_blocked_seconds`` | histogram | time a save stopped training |
| ``ftfleet_checkpoint_persist_seconds`` | histogram | background time until committed |
| ``ftfleet_last_committed_step`` | gauge | step of the newest committed checkpoint |
| ``ftfleet_checkpoint_interval_steps`` | gauge | interval currently chosen |
| ``ftfleet_notices_total{kind}`` | counter | agreed interruption notices, by kind |
| ``ftfleet_rollbacks_total`` | counter | anomaly rollbacks |
| ``ftfleet_skipped_steps_total`` | counter | steps skipped as anomalous |
| ``ftfleet_restarts`` | gauge | restarts of the worker group (TORCHELASTIC_RESTART_COUNT) |
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import IO, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ftfleet.errors import ConfigError
from ftfleet.trainer.environment import TrainerEnvironment
from ftfleet.trainer.resilience.notices.notice import NoticeKind

_LABELS = ("node", "rank")
_STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, float("inf"))
_SAVE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, float("inf"))


class Metrics:
    """The trainer's metrics, in a registry of their own (tests can build many)."""

    def __init__(self, *, node: str = "", rank: int = 0, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self._values = (node, str(rank))
        r, v = self.registry, self._values
        self.steps = Counter("ftfleet_steps", "Optimizer steps completed.", _LABELS, registry=r).labels(*v)
        self.step_seconds = Histogram(
            "ftfleet_step_seconds", "Wall time of one step.", _LABELS, buckets=_STEP_BUCKETS, registry=r
        ).labels(*v)
        self.checkpoint_blocked_seconds = Histogram(
            "ftfleet_checkpoint_blocked_seconds",
            "Seconds a checkpoint save blocked training.",
            _LABELS,
            buckets=_SAVE_BUCKETS,
            registry=r,
        ).labels(*v)
        self.checkpoint_persist_seconds = Histogram(
            "ftfleet_checkpoint_persist_seconds",
            "Seconds from the end of the blocking part of a save to its commit.",
            _LABELS,
            buckets=_SAVE_BUCKETS,
            registry=r,
        ).labels(*v)
        self.last_committed_step = Gauge(
            "ftfleet_last_committed_step", "Step of the newest committed checkpoint.", _LABELS, registry=r
        ).labels(*v)
        self.checkpoint_interval_steps = Gauge(
            "ftfleet_checkpoint_interval_steps", "Checkpoint interval currently chosen, steps.", _LABELS, registry=r
        ).labels(*v)
        self._notices = Counter(
            "ftfleet_notices", "Agreed interruption notices by kind.", (*_LABELS, "kind"), registry=r
        )
        for kind in NoticeKind:  # every kind is exported from the start, at 0
            self._notices.labels(*v, kind.value)
        self.rollbacks = Counter("ftfleet_rollbacks", "Rollbacks after an anomalous step.", _LABELS, registry=r).labels(
            *v
        )
        self.skipped_steps = Counter(
            "ftfleet_skipped_steps", "Steps skipped as anomalous.", _LABELS, registry=r
        ).labels(*v)
        self.restarts = Gauge("ftfleet_restarts", "Restarts of the worker group so far.", _LABELS, registry=r).labels(
            *v
        )
        self._validation = Gauge(
            "ftfleet_validation",
            "The last evaluation of the validation set, by metric.",
            (*_LABELS, "metric"),
            registry=r,
        )
        self._server: Any = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Metrics:
        """Labels from FTFLEET_NODE_ID and RANK; restarts from TORCHELASTIC_RESTART_COUNT."""
        environ = os.environ if environ is None else environ
        metrics = cls(node=TrainerEnvironment(environ).node_id, rank=int(environ.get("RANK", "0") or 0))
        metrics.restarts.set(int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0))
        return metrics

    # -- recording ---------------------------------------------------------------

    def step(self, seconds: float) -> None:
        self.steps.inc()
        self.step_seconds.observe(seconds)

    def checkpoint_saved(self, blocked_s: float, persist_s: float) -> None:
        self.checkpoint_blocked_seconds.observe(blocked_s)
        self.checkpoint_persist_seconds.observe(persist_s)

    def validated(self, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self._validation.labels(*self._values, name).set(value)

    def notice(self, kind: NoticeKind | str) -> None:
        self._notices.labels(*self._values, NoticeKind(kind).value).inc()

    # -- exporter ----------------------------------------------------------------

    def serve(self, port: int, *, local_rank: int = 0, addr: str = "0.0.0.0") -> int | None:
        """Serve /metrics on ``port + local_rank``; port 0: no exporter. Returns the port."""
        if port == 0:
            return None
        if not 0 < port + local_rank < 65536:
            raise ConfigError(
                f"FTFLEET_METRICS_PORT={port}: use 1 to 65535 (plus the local rank), or 0 to turn the exporter off"
            )
        if self._server is not None:
            raise RuntimeError("metrics exporter already serving")
        self._server, _ = start_http_server(port + local_rank, addr=addr, registry=self.registry)
        return int(self._server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def metrics_port(environ: Mapping[str, str] | None = None) -> int:
    """FTFLEET_METRICS_PORT (default 0: off), validated."""
    return TrainerEnvironment(environ).metrics_port


# ---------------------------------------------------------------------------
# JSON log lines
# ---------------------------------------------------------------------------

_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the ``static`` fields (node,
    rank, run), any ``extra=`` fields of the call, and the exception if any."""

    def __init__(self, static: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.static = dict(static or {})

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **self.static,
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = record.stack_info
        return json.dumps(line, default=str)


def configure_json_logging(
    level: int | str = logging.INFO, *, static: Mapping[str, Any] | None = None, stream: IO[str] | None = None
) -> logging.Handler:
    """Route the root logger to ``stream`` (stderr) as JSON lines; returns the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(static))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
