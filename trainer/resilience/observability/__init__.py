"""What a running trainer tells the outside.

* ``metrics.py``: Prometheus metrics per rank, and JSON log lines;
* ``node_metrics.py``: the node's heartbeat in CloudWatch, which the unhealthy_node
  function judges (AWS);
* ``monitor.py``: the step monitor, after every step: the watchdog's heartbeat, the
  step metrics and the step events.
"""

from ftfleet.trainer.resilience.observability.metrics import JsonFormatter, Metrics, configure_json_logging

__all__ = ["JsonFormatter", "Metrics", "configure_json_logging"]
