"""The drill (``python -m drill``, from the repository root): inject every failure a
spot fleet throws at a training run into a local one, and report how the trainer
recovered.

It is a tool of this repository, not part of the installed package: setup.py installs
only ``ftfleet``, so the trainer image carries no fault injection and no fake cloud.

* :mod:`drill.scenario`: which faults, at which steps, on which node;
* :mod:`drill.cloud`: moto S3 (primary and replica buckets) and the fake
  metadata service (:mod:`drill.fake_metadata`) on 127.0.0.1; :mod:`drill.cloud_gcp`
  (``--cloud gcp``): a GCS emulator holding the one dual-region bucket, and the same
  fake speaking GCP's metadata protocol;
* :mod:`drill.worker`: the trainer with the injected faults as its callbacks
  (:mod:`drill.inject`), what torchrun runs;
* :mod:`drill.runner`: one torchrun (a node), its workers, the event log;
* :mod:`drill.run`: the reference run, the faulted run, the injections;
* :mod:`drill.lives`, :mod:`drill.faults`: each fault's measures, from
  ``events.jsonl``;
* :mod:`drill.report`: goodput, the state check, the report;
* :mod:`drill.capacity` (``--faults capacity_loss``): a spot region out of capacity
  (:mod:`drill.aws_standin`), the standby's capacity_watch function run in this process
  (:mod:`drill.scheduled`) moving the run to the standby region; its report
  (:mod:`drill.capacity_report`).

Importing this package imports neither torch nor moto.
"""

from __future__ import annotations

from drill.cli import main

__all__ = ["main"]
