"""The node's CloudWatch heartbeat (contract.PROGRESS_METRIC, GPU_ERRORS_METRIC), against moto."""

from __future__ import annotations

import datetime
import logging
import os
import stat
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from ftfleet import contract
from ftfleet.errors import ConfigError
from ftfleet.trainer.resilience.observability.node_metrics import NodeMetrics, NodeMetricsConfig, nvidia_smi_ecc_errors

AWS_ENV = {"FTFLEET_CLOUD": "aws", "FTFLEET_REGION": "us-east-1", "FTFLEET_RUN_ID": "run-a", "FTFLEET_NODE_ID": "i-1"}


@pytest.fixture
def cloudwatch(monkeypatch):
    for k, v in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield boto3.client("cloudwatch", region_name="us-east-1")


def _sum(cw, metric, node_id="i-1", run_id="run-a") -> float | None:
    now = datetime.datetime.now(datetime.UTC)
    points = cw.get_metric_statistics(
        Namespace=contract.METRICS_NAMESPACE,
        MetricName=metric.name,
        Dimensions=metric.dimensions(run_id, node_id),
        StartTime=now - datetime.timedelta(minutes=5),
        EndTime=now + datetime.timedelta(minutes=1),
        Period=60,
        Statistics=["Sum"],
    )["Datapoints"]
    return sum(p["Sum"] for p in points) if points else None


def _steps(publisher: NodeMetrics, n: int) -> None:
    for _ in range(n):
        publisher.on_step_end(None, None)  # type: ignore[arg-type]


def test_steps_land_in_the_contract_namespace_with_run_and_node_dimensions(cloudwatch):
    publisher = NodeMetrics.from_env(NodeMetricsConfig(), local_rank=0, environ=AWS_ENV, gpu_errors=lambda: 0)
    assert publisher is not None
    _steps(publisher, 7)
    assert publisher.publish_once()
    assert _sum(cloudwatch, contract.PROGRESS_METRIC) == 7.0
    assert _sum(cloudwatch, contract.GPU_ERRORS_METRIC) == 0.0
    listed = cloudwatch.list_metrics(Namespace=contract.METRICS_NAMESPACE)["Metrics"]
    assert {m["MetricName"] for m in listed} == {contract.PROGRESS_METRIC.name, contract.GPU_ERRORS_METRIC.name}
    assert all(sorted(d["Name"] for d in m["Dimensions"]) == ["NodeId", "RunId"] for m in listed), (
        "unhealthy_node queries exactly RunId and NodeId"
    )


def test_a_period_without_steps_publishes_zero_so_a_stall_is_visible(cloudwatch):
    publisher = NodeMetrics.from_env(NodeMetricsConfig(), local_rank=0, environ=AWS_ENV, gpu_errors=None)
    assert publisher.publish_once()
    assert _sum(cloudwatch, contract.PROGRESS_METRIC) == 0.0
    assert _sum(cloudwatch, contract.GPU_ERRORS_METRIC) is None, "no GPU error source: nothing claimed"


def test_gpu_errors_count_only_those_after_the_trainer_started(cloudwatch):
    totals = iter([5, 5, 8])
    publisher = NodeMetrics.from_env(
        NodeMetricsConfig(), local_rank=0, environ=AWS_ENV, gpu_errors=lambda: next(totals)
    )
    publisher.start()
    publisher.close()
    publisher.publish_once()
    publisher.publish_once()
    assert _sum(cloudwatch, contract.GPU_ERRORS_METRIC) == 3.0


def test_the_thread_publishes_every_period_without_the_loop_waiting(cloudwatch):
    publisher = NodeMetrics.from_env(NodeMetricsConfig(period_s=0.05), local_rank=0, environ=AWS_ENV, gpu_errors=None)
    publisher.start()
    _steps(publisher, 3)
    try:
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=10)
        while publisher.published < 2 and datetime.datetime.now() < deadline:
            publisher._stop.wait(0.02)
    finally:
        publisher.close()
    assert publisher.published >= 2
    assert _sum(cloudwatch, contract.PROGRESS_METRIC) == 3.0


class _Refusing:
    def __init__(self) -> None:
        self.calls = 0

    def put_metric_data(self, **_):
        self.calls += 1
        raise OSError("connection refused")


def test_a_failing_endpoint_is_logged_once_and_the_steps_are_carried_to_the_next_point(cloudwatch, caplog):
    refusing = _Refusing()
    publisher = NodeMetrics.from_env(
        NodeMetricsConfig(), local_rank=0, environ=AWS_ENV, client=refusing, gpu_errors=None
    )
    _steps(publisher, 4)
    with caplog.at_level(logging.WARNING, logger="ftfleet.node_metrics"):
        assert not publisher.publish_once()
        assert not publisher.publish_once()
    assert refusing.calls == 2
    assert len([r for r in caplog.records if "PutMetricData" in r.getMessage()]) == 1
    publisher._client = boto3.client("cloudwatch", region_name="us-east-1")
    _steps(publisher, 1)
    assert publisher.publish_once()
    assert _sum(cloudwatch, contract.PROGRESS_METRIC) == 5.0


@pytest.mark.parametrize(
    ("environ", "local_rank", "cfg"),
    [
        ({**AWS_ENV, "FTFLEET_CLOUD": "gcp"}, 0, NodeMetricsConfig()),
        ({k: v for k, v in AWS_ENV.items() if k != "FTFLEET_REGION"}, 0, NodeMetricsConfig()),
        (AWS_ENV, 1, NodeMetricsConfig()),
        (AWS_ENV, 0, NodeMetricsConfig(enabled=False)),
    ],
    ids=["gcp", "no-region", "not-local-rank-0", "disabled"],
)
def test_no_publisher_off_aws_without_a_region_on_other_ranks_or_when_disabled(environ, local_rank, cfg):
    assert NodeMetrics.from_env(cfg, local_rank=local_rank, environ=environ) is None


@pytest.mark.parametrize("period", [0, -1, 301])
def test_a_heartbeat_period_outside_0_to_300_seconds_is_a_config_error(period):
    with pytest.raises(ConfigError, match="resilience.node_metrics.period_s"):
        NodeMetricsConfig(period_s=period)


def test_gpu_errors_are_read_from_nvidia_smi_summed_over_gpus(tmp_path: Path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0\\n2\\n[N/A]\\n1\\n'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert nvidia_smi_ecc_errors() == 3


def test_no_nvidia_smi_means_gpu_errors_are_unknown(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvidia_smi_ecc_errors() is None
