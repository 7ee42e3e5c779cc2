"""The node's heartbeat in CloudWatch: ``contract.PROGRESS_METRIC`` (optimizer steps
since the previous data point, 0 when none) and ``contract.GPU_ERRORS_METRIC``, from
local rank 0 of each node, every ``resilience.node_metrics.period_s``.

The unhealthy_node function replaces a node whose sum stays 0 (or that publishes
nothing) for its grace period, once any node of the run has published: so the
publisher runs in the worker process itself (a dead or wedged trainer stops its own
heartbeat), from a daemon thread that the training loop never waits for. The loop only
adds to a counter (:meth:`NodeMetrics.on_step_end`). A failing ``PutMetricData`` is
logged once, and once more when it works again; it never reaches the loop.

Off unless FTFLEET_CLOUD=aws and FTFLEET_REGION is set, and on ranks other than local
rank 0.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ftfleet.contract import GPU_ERRORS_METRIC, METRICS_NAMESPACE, NODE_METRIC_PERIOD_S, PROGRESS_METRIC
from ftfleet.errors import ConfigError
from ftfleet.trainer.callbacks import Callback, StepInfo
from ftfleet.trainer.environment import TrainerEnvironment
from ftfleet.trainer.resilience import aws

if TYPE_CHECKING:
    from ftfleet.trainer.train import Run

log = logging.getLogger("ftfleet.node_metrics")

_KEY = "resilience.node_metrics"
#: A slower heartbeat than this leaves whole minutes empty, which the function's sum
#: over its grace window can mistake for a stall.
MAX_PERIOD_S = 300.0

#: Cumulative count of GPU errors on this node (None: cannot tell).
GpuErrorSource = Callable[[], "int | None"]


@dataclasses.dataclass(kw_only=True, slots=True)
class NodeMetricsConfig:
    """The per-node CloudWatch heartbeat that the unhealthy_node function judges."""

    enabled: bool = True
    """Publish on AWS (FTFLEET_CLOUD=aws with FTFLEET_REGION). Turning it off on some
    nodes of a run whose other nodes publish gets those nodes replaced as stalled."""
    period_s: float = float(NODE_METRIC_PERIOD_S)
    """Seconds between two data points (CloudWatch's standard resolution is 60 s)."""

    def __post_init__(self) -> None:
        if not 0 < self.period_s <= MAX_PERIOD_S:
            raise ConfigError(
                f"{_KEY}.period_s={self.period_s!r}: use more than 0 and at most {MAX_PERIOD_S:.0f} seconds "
                "(the unhealthy_node function reads a slower heartbeat as a stall)"
            )


def nvidia_smi_ecc_errors() -> int | None:
    """Uncorrectable ECC errors of every GPU since the driver loaded, from nvidia-smi;
    None without nvidia-smi or an answer it can read."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # "[N/A]" for a GPU without ECC counts as 0; anything else unreadable is unknown.
    total = 0
    for line in out.split("\n"):
        value = line.strip()
        if not value or value.startswith("[") or value.upper() == "N/A":
            continue
        if not value.isdigit():
            return None
        total += int(value)
    return total


class NodeMetrics(Callback):
    """Counts steps (on the training thread) and publishes them (on its own thread).
    ``client``: a CloudWatch client (default: built in FTFLEET_REGION on first use)."""

    def __init__(
        self,
        cfg: NodeMetricsConfig,
        *,
        run_id: str,
        node_id: str,
        region: str,
        client: Any = None,
        gpu_errors: GpuErrorSource | None = nvidia_smi_ecc_errors,
    ) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self.node_id = node_id
        self.region = region
        self._client = client
        self._gpu_errors = gpu_errors
        self._gpu_seen: int | None = None
        self._steps = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        #: Data points published so far (for tests and the summary).
        self.published = 0

    @classmethod
    def from_env(
        cls, cfg: NodeMetricsConfig, *, local_rank: int, environ: Mapping[str, str] | None = None, **kwargs: Any
    ) -> NodeMetrics | None:
        """The publisher of this process, or None where it is off (not AWS, no region,
        disabled, or not local rank 0)."""
        env = TrainerEnvironment(environ)
        region = env.aws_region
        if not cfg.enabled or region is None or local_rank != 0:
            return None
        run_id, node_id = env.run_id, env.node_id
        if not run_id or not node_id:
            log.warning("node metrics off: FTFLEET_RUN_ID and FTFLEET_NODE_ID name the data points; set both")
            return None
        return cls(cfg, run_id=run_id, node_id=node_id, region=region, **kwargs)

    # -- the training thread -------------------------------------------------------

    def on_step_end(self, run: Run, info: StepInfo) -> None:
        with self._lock:
            self._steps += 1

    # -- the publisher thread ------------------------------------------------------

    def start(self) -> NodeMetrics:
        if self._gpu_errors is not None:
            self._gpu_seen = self._gpu_errors()  # errors before this trainer started are not its to report
        self._thread = threading.Thread(target=self._run, name="node-metrics", daemon=True)
        self._thread.start()
        log.info(
            "publishing %s/%s for node %s every %.0fs",
            METRICS_NAMESPACE,
            PROGRESS_METRIC.name,
            self.node_id,
            self.cfg.period_s,
        )
        return self

    def close(self) -> None:
        """Stop publishing; never waits for a call in flight longer than a moment."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.period_s):
            self.publish_once()

    def publish_once(self) -> bool:
        """One data point of each metric; False (logged once) when the call failed."""
        with self._lock:
            steps, self._steps = self._steps, 0
        data = [self._datum(PROGRESS_METRIC, steps)]
        gpu_seen = self._gpu_seen
        new_errors = self._new_gpu_errors()
        if new_errors is not None:
            data.append(self._datum(GPU_ERRORS_METRIC, new_errors))
        try:
            if self._client is None:
                self._client = aws.client("cloudwatch", self.region)
            self._client.put_metric_data(Namespace=METRICS_NAMESPACE, MetricData=data)
        except Exception as exc:  # noqa: BLE001 - a heartbeat must never end the run
            with self._lock:  # nothing is lost: the next data point carries it
                self._steps += steps
            self._gpu_seen = gpu_seen
            if not self._failing:
                self._failing = True
                log.warning(
                    "node metrics: PutMetricData into %s failed (%s: %s); retrying every %.0fs, logged once",
                    METRICS_NAMESPACE,
                    type(exc).__name__,
                    exc,
                    self.cfg.period_s,
                )
            return False
        if self._failing:
            self._failing = False
            log.info("node metrics: PutMetricData works again")
        self.published += 1
        return True

    def _new_gpu_errors(self) -> int | None:
        if self._gpu_errors is None:
            return None
        total = self._gpu_errors()
        if total is None:
            return None
        # A driver reload resets the counter: count from the new value.
        new = total - self._gpu_seen if self._gpu_seen is not None and total >= self._gpu_seen else total
        self._gpu_seen = total
        return new

    def _datum(self, metric: Any, value: int) -> dict[str, Any]:
        return {
            "MetricName": metric.name,
            "Dimensions": metric.dimensions(self.run_id, self.node_id),
            "Value": float(value),
            "Unit": metric.unit,
        }
