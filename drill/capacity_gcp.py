"""The capacity-loss drill on GCP: ``python -m drill --faults capacity_loss --cloud gcp``.

The same scenario as :mod:`drill.capacity`, with GCP's parts, played locally:

* **the cloud**: one dual-region bucket in the GCS emulator (:class:`~drill.cloud_gcp.GcpCloud`)
  holding the checkpoints and the run lease for both stacks, and the stacks' regional
  managed instance groups in the Compute Engine stand-in (:mod:`drill.gcp_standin`,
  which also takes the function's Cloud Monitoring writes): the home's sized for the
  run, the standby's workers at 0 and its coordinator VM running (``standbyActive``, as
  ``standbyAutoFailover`` needs on GCP);
* **the home**: the trainer under torchrun, a node of ``home-workers``, holding the run
  lease. At ``loss_step`` its metadata says it is preempted and ``home-workers``' zone
  runs out of resources: the node commits an emergency checkpoint and exits 75, its VM
  is gone, and the group records a resource-exhaustion error at every creation attempt;
* **the standby's gcp_capacity_watch** (lambdas/gcp_capacity_watch), in this process,
  pushed Cloud Scheduler's message every ``watch_every_s``: once ``home-workers`` has
  been short for want of capacity for ``loss_s``, it moves the run one step per run
  (stop the home's groups, wait until they list no VM, size the standby's workers);
* **the standby's fleet**: once ``standby-workers`` asks for a node, a torchrun node in
  the standby region on the same bucket, fenced (78) until the home's lease has run out
  and started again as systemd would, then resuming from the newest verified checkpoint.

There is no replication to wait for: both regions read the one bucket.
"""

from __future__ import annotations

import contextlib
from typing import Any

from drill.capacity import LEASE_KEY, ROOT, RUN_ID, CapacityDrill, CapacityOptions
from drill.cloud_gcp import PROJECT, GcpCloud
from drill.fake_metadata import FakeMetadataServer
from drill.gcp_standin import Compute
from drill.scheduled import PushedFunction
from ftfleet.contract import GCP_PREEMPTION_NOTICE_S
from ftfleet.lambdas.common.move import newest_verified
from ftfleet.lambdas.common.pair import LeaseRef, Pair, Side
from ftfleet.lambdas.gcp_capacity_watch import handler as watch
from ftfleet.lambdas.gcp_capacity_watch.config import Config

HOME_REGION, STANDBY_REGION = "us-central1", "us-east1"
BUCKET = "ftfleet-drill-ckpt"  # GcpCloud's


def side(stack: str, region: str) -> Side:
    return Side(stack, region, f"{stack}-coordinator", f"{stack}-workers", BUCKET, ROOT, cloud="gcp", project=PROJECT)


def watch_config(opts: CapacityOptions) -> Config:
    """The standby's gcp_capacity_watch configuration, as its stack would render it."""
    home, standby = side("home", HOME_REGION), side("standby", STANDBY_REGION)
    return Config(
        stack="standby",
        run_id=RUN_ID,
        project=PROJECT,
        region=STANDBY_REGION,
        groups=(standby.coordinator_group, standby.worker_group),
        loss_s=opts.loss_s,
        bucket=BUCKET,
        state_key=f"{ROOT}/fleet/capacity-watch-standby.json",
        failover=Pair(home, standby, LeaseRef(BUCKET, LEASE_KEY, HOME_REGION, RUN_ID)),
    )


class GcpCapacityDrill(CapacityDrill):
    def __init__(self, opts: CapacityOptions, say: Any = print) -> None:
        super().__init__(opts, say)
        self.home, self.standby = side("home", HOME_REGION), side("standby", STANDBY_REGION)
        self.compute: Compute | None = None

    def _open(self, stack: contextlib.ExitStack) -> None:
        self.cloud = stack.enter_context(GcpCloud(bucket=BUCKET, prefix=ROOT))
        self.compute = Compute(PROJECT)
        stack.callback(self.compute.close)
        self.standby_metadata = stack.enter_context(FakeMetadataServer(instance_id="standby-workers-0001"))
        env = {
            "STORAGE_EMULATOR_HOST": self.cloud.emulator_url,
            "GOOGLE_CLOUD_PROJECT": PROJECT,
            "FTFLEET_COMPUTE_ENDPOINT": self.compute.url,
            "FTFLEET_MONITORING_ENDPOINT": self.compute.url,
        }
        # The drill reads the bucket as the function does (newest_verified): the
        # function's environment stays this process's while the drill runs.
        self.watch = stack.enter_context(
            PushedFunction(watch.handler, watch_config(self.opts), env, self.logs / "capacity_watch.jsonl")
        )

    def _make_groups(self) -> None:
        """The home: a coordinator VM and one worker; the standby: its coordinator VM
        (active) and no worker."""
        assert self.compute is not None
        for s, workers in ((self.home, 1), (self.standby, 0)):
            self.compute.group(s.coordinator_group, 1, ready=1, region=s.region)
            self.compute.group(s.worker_group, workers, ready=workers, region=s.region)

    def _node_setup(self, s: Side) -> tuple[list[str], dict[str, str]]:
        extra = [f"checkpoint.lease_uri=gs://{BUCKET}/{LEASE_KEY}"]
        env = {
            "FTFLEET_CLOUD": "gcp",
            "FTFLEET_PREEMPTION_NOTICE_S": str(GCP_PREEMPTION_NOTICE_S),
            **self.cloud.node_env(),
        }
        return extra, env

    def _lose_capacity(self) -> None:
        assert self.compute is not None
        r = self.report
        self.cloud.metadata.preempt()
        r.t_loss = self.compute.lose_capacity(self.home.worker_group)
        r.home_durable_at_loss = newest_verified(self.home)
        self.say(
            f"home: step {r.home_last_step}: instance/preempted is TRUE; {self.home.worker_group}'s zone is out of "
            f"resources in {HOME_REGION} (the function moves the run after {self.opts.loss_s:g} s)"
        )

    def _invoke_watch(self) -> None:
        super()._invoke_watch()
        if self.report.t_decision is not None:
            # The VMs the move deleted have run their shutdown scripts by the next run
            # (the home's node, which took the emergency checkpoint, is gone already).
            assert self.compute is not None
            self.compute.settle()

    def _standby_workers_wanted(self) -> bool:
        assert self.compute is not None
        return self.compute.groups[self.standby.worker_group]["target"] > 0

    def _home_instances_gone(self) -> None:
        """The home's VMs have run their shutdown scripts and are gone; the standby's
        new VMs run."""
        assert self.compute is not None
        self.compute.settle()

    def _where(self) -> dict[str, str]:
        return {
            "cloud": "gcp",
            "home": f"{HOME_REGION} (gs://{BUCKET}, dual-region)",
            "standby": f"{STANDBY_REGION} (the same bucket)",
        }
