import io
import json
import logging
import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ftfleet.errors import ConfigError
from ftfleet.trainer.resilience.observability.metrics import (
    JsonFormatter,
    Metrics,
    configure_json_logging,
    metrics_port,
)

NAMES = (
    "ftfleet_steps_total",
    "ftfleet_step_seconds_bucket",
    "ftfleet_checkpoint_blocked_seconds_sum",
    "ftfleet_checkpoint_persist_seconds_count",
    "ftfleet_last_committed_step",
    "ftfleet_notices_total",
    "ftfleet_rollbacks_total",
    "ftfleet_skipped_steps_total",
    "ftfleet_restarts",
    "ftfleet_checkpoint_interval_steps",
)


@pytest.fixture
def root_logger_restored():
    """configure_json_logging replaces the root logger's handlers and level: put pytest's back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_exporter_serves_every_metric_with_node_and_rank_labels():
    metrics = Metrics.from_env({"FTFLEET_NODE_ID": "i-0abc", "RANK": "3", "TORCHELASTIC_RESTART_COUNT": "2"})
    metrics.step(0.2)
    metrics.step(0.3)
    metrics.checkpoint_saved(blocked_s=0.5, persist_s=4.0)
    metrics.last_committed_step.set(1200)
    metrics.notice("termination")
    metrics.rollbacks.inc()
    port = metrics.serve(free_port(), addr="127.0.0.1")
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        metrics.close()
    for name in NAMES:
        assert name in text, name
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    labels = (("node", "i-0abc"), ("rank", "3"))
    assert samples[("ftfleet_steps_total", labels)] == 2.0
    assert samples[("ftfleet_step_seconds_sum", labels)] == pytest.approx(0.5)
    assert samples[("ftfleet_checkpoint_persist_seconds_sum", labels)] == 4.0
    assert samples[("ftfleet_last_committed_step", labels)] == 1200.0
    assert samples[("ftfleet_restarts", labels)] == 2.0
    assert samples[("ftfleet_rollbacks_total", labels)] == 1.0
    assert samples[("ftfleet_notices_total", (("kind", "termination"), *labels))] == 1.0
    assert samples[("ftfleet_notices_total", (("kind", "rebalance"), *labels))] == 0.0


def test_each_local_rank_serves_on_the_base_port_plus_its_local_rank():
    port = free_port()
    metrics = Metrics(rank=5)
    try:
        assert metrics.serve(port - 3, local_rank=3, addr="127.0.0.1") == port
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        assert b'rank="5"' in text
    finally:
        metrics.close()


def test_port_zero_means_no_exporter():
    assert Metrics().serve(0) is None
    assert metrics_port({}) == 0
    assert metrics_port({"FTFLEET_METRICS_PORT": "9400"}) == 9400
    with pytest.raises(ConfigError, match="FTFLEET_METRICS_PORT"):
        metrics_port({"FTFLEET_METRICS_PORT": "http"})


def test_metrics_objects_do_not_share_a_registry():
    a, b = Metrics(), Metrics()
    a.steps.inc()
    assert b.registry.get_sample_value("ftfleet_steps_total", {"node": "", "rank": "0"}) == 0.0


def test_log_lines_are_json_with_static_and_extra_fields(root_logger_restored):
    stream = io.StringIO()
    configure_json_logging(static={"node": "i-0abc", "rank": 0}, stream=stream)
    log = logging.getLogger("ftfleet.trainer.test")
    log.info("checkpoint %d committed", 1200, extra={"blocked_s": 0.5})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("save failed")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["msg"] == "checkpoint 1200 committed" and first["level"] == "INFO"
    assert (first["node"], first["rank"], first["blocked_s"]) == ("i-0abc", 0, 0.5)
    assert first["ts"].endswith("Z") and first["logger"] == "ftfleet.trainer.test"
    assert "RuntimeError: boom" in second["exc"]


def test_unserialisable_extras_do_not_break_a_log_line():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    record.path = object()
    assert json.loads(JsonFormatter().format(record))["msg"] == "m"
