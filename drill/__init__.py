"""``ftfleet drill`` (``python -m drill``): inject every failure a spot fleet
throws at a training run into a local one, and report how the trainer recovered.

* :mod:`drill.scenario`: which faults, at which steps, on which node;
* :mod:`drill.cloud`: moto S3 (primary and replica buckets) and the fake
  metadata service on 127.0.0.1;
* :mod:`drill.runner`: one torchrun (a node), its workers, the event log;
* :mod:`drill.run`: the reference run, the faulted run, the injections;
* :mod:`drill.lives`, :mod:`drill.faults`: each fault's measures, from
  ``events.jsonl``;
* :mod:`drill.report`: goodput, the state check, the report.

Importing this package imports neither torch nor moto: ``ftfleet --help`` stays fast.
"""

from __future__ import annotations

from drill.cli import main, register

__all__ = ["main", "register"]
