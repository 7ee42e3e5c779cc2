"""The capacity-loss drill: ``python -m drill --faults capacity_loss`` (AWS; GCP's is
drill/capacity_gcp.py, the same scenario on GCP's parts).

A spot region runs out of capacity and the run moves to its standby region by itself,
played locally with no cloud account:

* **the cloud**: moto behind :class:`~drill.aws_standin.AwsStandIn` (which plays the
  empty spot market moto cannot), the home's primary bucket (us-east-1) and its replica
  (us-west-2), which the drill replicates every ``replication_lag_s``
  (:class:`~drill.cloud.LocalCloud`), and the two stacks' Auto Scaling groups: the
  home's sized for the run, the standby's at 0;
* **the home**: the trainer under torchrun, a node of ``home-workers``, holding the run
  lease in the home's primary bucket. At ``loss_step`` its metadata posts a spot
  interruption notice and ``home-workers`` runs out of capacity: the node commits an
  emergency checkpoint and exits 75, its instance is gone (the drill kills its process
  tree) and no other comes;
* **the standby's capacity_watch** (lambdas/capacity_watch), in this process, invoked
  every ``watch_every_s`` with ``loss_s``: once ``home-workers`` has been short for want
  of capacity for ``loss_s``, it moves the run one step per invocation (stop the home,
  wait for replication, release the lease, size the standby's groups);
* **the standby's fleet**: once ``standby-workers`` asks for a node, a torchrun node in
  the standby region, its primary the home's replica bucket. Until the home's run lease
  has run out it exits fenced (78), and, as systemd does on a node
  (``Restart=on-failure``, ``RestartSec`` :data:`RESTART_S`), starts again; then it
  takes the lease, resumes from the newest verified checkpoint there and trains to the
  end.

The report (:mod:`drill.capacity_report`) times the failover and compares the final
``state_sha256`` with an uninterrupted reference run's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3

from drill.aws_standin import AwsStandIn
from drill.capacity_report import CapacityReport
from drill.cloud import CREDENTIALS, LocalCloud
from drill.fake_metadata import FakeMetadataServer
from drill.run import DEFAULT_CONFIG, SOURCE_ROOT, Drill, DrillOptions, _read_summary
from drill.runner import EventTail, Node
from drill.scheduled import ScheduledFunction
from ftfleet.contract import EXIT_FENCED, EXIT_PREEMPTED, agent_exit_file
from ftfleet.errors import UserError
from ftfleet.lambdas.capacity_watch import handler as watch
from ftfleet.lambdas.capacity_watch.config import Config
from ftfleet.lambdas.common.move import LeaseRef, Pair, Side, newest_verified

FAULT = "capacity_loss"
HOME_REGION, STANDBY_REGION = "us-east-1", "us-west-2"
PRIMARY, REPLICA = "home-primary", "home-replica"
RUN_ID = "drill"  # the run_id of the drill's trainer (Drill.common_overrides)
ROOT = f"checkpoints/{RUN_ID}"
LEASE_KEY = f"ftfleet-leases/{RUN_ID}.json"
#: The shortest run lease the trainer allows (its renewal and write margins).
LEASE_TTL_S = 70.0
#: The node's supervisor starts a fenced trainer again after this (infra/aws/boot/node.sh).
RESTART_S = 10.0


@dataclasses.dataclass(kw_only=True)
class CapacityOptions:
    workdir: Path
    cloud: str = "aws"
    """aws: this module's drill; gcp: drill/capacity_gcp.py's."""
    nproc: int = 2
    loss_step: int = 20
    """The home runs out of capacity (and gets its spot notice) at this step."""
    steps: int = 60
    step_delay_s: float = 0.05
    """Paces each step like a bigger model would (does not change the trajectory)."""
    interval_steps: int = 5
    """Fixed checkpoint interval: what replication can have carried at the loss."""
    loss_s: float = 10.0
    """The function's capacityLossMinutes, in seconds: how long the home's workers must
    have been short for want of capacity before the run moves."""
    watch_every_s: float = 2.0
    """How often the standby's capacity_watch is invoked (its schedule)."""
    replication_lag_s: float = 1.0
    replication_wait_s: float = 60.0
    """How long the move waits for the replica to hold the home's newest step."""
    watchdog_s: float = 5.0
    node_timeout_s: float = 180.0
    config: Path = DEFAULT_CONFIG
    overrides: list[str] = dataclasses.field(default_factory=list)


def side(stack: str, region: str, bucket: str) -> Side:
    return Side(stack, region, f"{stack}-coordinator", f"{stack}-workers", bucket, ROOT)


def watch_config(opts: CapacityOptions) -> Config:
    """The standby's capacity_watch configuration, as its stack would render it."""
    home, standby = side("home", HOME_REGION, PRIMARY), side("standby", STANDBY_REGION, REPLICA)
    return Config(
        stack="standby",
        run_id=RUN_ID,
        groups=(standby.coordinator_group, standby.worker_group),
        loss_s=opts.loss_s,
        failover=Pair(
            home, standby, LeaseRef(PRIMARY, LEASE_KEY, HOME_REGION, RUN_ID), replication_wait_s=opts.replication_wait_s
        ),
    )


class CapacityDrill:
    """One drill: :meth:`run` returns the report; every server and process it started
    is gone when it returns or raises."""

    def __init__(self, opts: CapacityOptions, say: Callable[[str], None] = print) -> None:
        self.opts = opts
        self.say_line = say
        self.t0 = time.monotonic()
        self.logs = opts.workdir / "logs"
        self.home = side("home", HOME_REGION, PRIMARY)
        self.standby = side("standby", STANDBY_REGION, REPLICA)
        self.report = CapacityReport(
            loss_step=opts.loss_step, steps=opts.steps, loss_s=opts.loss_s, watch_every_s=opts.watch_every_s
        )
        self.nodes: dict[str, Node] = {}
        self._last_said: tuple[Any, Any] = (None, None)
        # Built by run(): the endpoint, the buckets, the standby's metadata, the function,
        # the trainer's command line.
        self.standin: Any = None
        self.cloud: Any = None
        self.standby_metadata: Any = None
        self.watch: Any = None
        self.drill: Any = None

    def say(self, msg: str) -> None:
        self.say_line(f"[{time.monotonic() - self.t0:6.1f}s] {msg}")

    # -- all of it ------------------------------------------------------------------

    def run(self) -> CapacityReport:
        o = self.opts
        self.logs.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            self._open(stack)
            self.drill = Drill(
                DrillOptions(
                    faults=["notice"],
                    workdir=o.workdir,
                    nproc=o.nproc,
                    first_step=o.loss_step,
                    spacing=o.steps - o.loss_step,
                    step_delay_s=o.step_delay_s,
                    interval=str(o.interval_steps),
                    watchdog_s=o.watchdog_s,
                    node_timeout_s=o.node_timeout_s,
                    config=o.config,
                    overrides=list(o.overrides),
                ),
                self.cloud,
                self.say_line,
            )
            self.drill.t0 = self.t0
            stack.callback(shutil.rmtree, self.drill.shm_root, True)
            stack.callback(self._kill_nodes)
            self._make_groups()
            ref, _, _ = self.drill.run_reference()
            self.report.reference_sha256 = ref.get("state_sha256")
            self.report.problem = self._play()
            self._measure()
        return self.report

    def _open(self, stack: contextlib.ExitStack) -> None:
        """The cloud, the standby node's metadata and the standby's capacity watch."""
        o = self.opts
        try:
            import moto.server  # noqa: F401 - the stand-in's backend
        except ImportError:
            raise UserError(
                "the drill needs moto[server]: install the dev extra, `pip install -e '.[dev]'` (or `make setup`)"
            ) from None
        self.standin = stack.enter_context(AwsStandIn())
        self.cloud = stack.enter_context(
            LocalCloud(
                endpoint_url=self.standin.url,
                primary=PRIMARY,
                replica=REPLICA,
                prefix=ROOT,
                replication_lag_s=o.replication_lag_s,
                replica_region=STANDBY_REGION,
            )
        )
        self.standby_metadata = stack.enter_context(FakeMetadataServer(instance_id="i-0standby00000000000"))
        self.watch = stack.enter_context(
            ScheduledFunction(
                watch.handler,
                watch_config(o),
                STANDBY_REGION,
                self.standin.url,
                self.logs / "capacity_watch.jsonl",
                rule="standby-capacity-watch",
            )
        )

    def _kill_nodes(self) -> None:
        for node in self.nodes.values():
            node.kill()

    def _make_groups(self) -> None:
        """The stacks' groups: the home's sized for the run (a coordinator and one
        worker node), the standby's at 0 (at most 2 workers)."""
        for s, size in ((self.home, 1), (self.standby, 0)):
            ec2, asg = self._client("ec2", s.region), self._client("autoscaling", s.region)
            for name, most in ((s.coordinator_group, 1), (s.worker_group, 2)):
                ec2.create_launch_template(
                    LaunchTemplateName=f"{name}-lt", LaunchTemplateData={"ImageId": "ami-12c6146b"}
                )
                asg.create_auto_scaling_group(
                    AutoScalingGroupName=name,
                    LaunchTemplate={"LaunchTemplateName": f"{name}-lt"},
                    MinSize=size,
                    MaxSize=most,
                    DesiredCapacity=size,
                    AvailabilityZones=[f"{s.region}a"],
                )

    def _client(self, service: str, region: str) -> Any:
        return boto3.client(
            service,
            region_name=region,
            endpoint_url=self.standin.url,
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    # -- the nodes ------------------------------------------------------------------

    def _node_setup(self, s: Side) -> tuple[list[str], dict[str, str]]:
        """The cloud's part of a node of ``s``: trainer overrides and environment."""
        other = REPLICA if s is self.home else PRIMARY
        extra = [
            f"checkpoint.replica_uri=s3://{other}/{ROOT}",
            f"checkpoint.s3_endpoint_url={self.standin.url}",
            f"checkpoint.lease_uri=s3://{PRIMARY}/{LEASE_KEY}",
        ]
        return extra, {"FTFLEET_CLOUD": "aws", "AWS_DEFAULT_REGION": s.region, "AWS_ENDPOINT_URL": self.standin.url}

    def _start_node(self, s: Side, metadata_url: str, fresh: bool = True) -> Node:
        """A torchrun node of ``s``'s worker group, ``s``'s bucket its primary; its run
        directory and fast tier are its own (a node in another region has none of the
        home's local files). ``fresh``: a new machine (else the same one, its trainer
        started again)."""
        base = self.opts.workdir / s.stack
        if fresh:
            shutil.rmtree(base, ignore_errors=True)
        cloud_extra, cloud_env = self._node_setup(s)
        extra = [
            f"resilience.watchdog.timeout_s={self.opts.watchdog_s}",
            "resilience.watchdog.first_step_timeout_s=120",
            f"checkpoint.uri={s.uri}",
            f"checkpoint.lease_holder={s.holder}",
            f"checkpoint.lease_ttl_s={LEASE_TTL_S:g}",
            *cloud_extra,
        ]
        env = self.drill.env(
            {
                "FTFLEET_METADATA_ENDPOINT": metadata_url,
                "FTFLEET_SHM_DIR": str(self.drill.shm_root / s.stack),
                "FTFLEET_NODE_ID": f"{s.stack}-0",
                **cloud_env,
            }
        )
        cmd = self.drill.cmd(base / "run", base / "fast-tier", extra)
        node = Node(s.stack, cmd, env, SOURCE_ROOT, self.logs / f"{s.stack}.log").start()
        self.nodes[s.stack] = node
        self.say(f"{s.stack}: torchrun launched in {s.region} ({self.opts.nproc} workers, primary {s.uri})")
        return node

    # -- the scenario ---------------------------------------------------------------

    def _play(self) -> str:
        """Home, capacity loss, the function's move, the standby to the end; a problem
        that ended it early, or ''."""
        o, r = self.opts, self.report
        home = self._start_node(self.home, self.cloud.metadata.url)
        self.cloud.start_replication()
        home_tail = EventTail(o.workdir / "home" / "run")
        standby: Node | None = None
        standby_tail = EventTail(o.workdir / "standby" / "run")
        home_gone, preempted, next_watch, next_look = False, False, 0.0, 0.0
        deadline = time.monotonic() + o.node_timeout_s
        while True:
            if not home_gone:
                rc = home.poll()
                for e in home_tail.poll():
                    preempted = self._on_home_event(e) or preempted
                if r.t_loss is None and r.home_last_step >= o.loss_step:
                    self._lose_capacity()
                    deadline = time.monotonic() + o.loss_s + o.replication_wait_s + o.node_timeout_s
                if preempted and (home.group is None or home.group.t_down is not None or rc is not None):
                    home.kill()
                    home_gone = True
                    self._home_instances_gone()
                    shutil.rmtree(self.drill.shm_root / "home", ignore_errors=True)  # and its RAM
                    self.say("home: instance terminated (exit 75 after its emergency checkpoint); none replaces it")
                elif rc is not None:
                    return f"home: torchrun exited {rc} before its notice; see {home.log_path}"
            if time.time() >= next_watch:
                self._invoke_watch()
                next_watch = time.time() + o.watch_every_s
                if r.t_decision is not None and not home_gone:
                    home.kill()
                    home_gone = True
                    self._home_instances_gone()
                    self.say("home: instance terminated by the move (its groups went to 0)")
            if standby is None and time.time() >= next_look:
                next_look = time.time() + 1.0
                if self._standby_workers_wanted():
                    self.cloud.stop_replication()  # the home is gone; the standby writes the replica now
                    standby = self._start_node(self.standby, self.standby_metadata.url)
                    deadline = time.monotonic() + LEASE_TTL_S + o.node_timeout_s
            if standby is not None:
                rc = standby.poll()
                for e in standby_tail.poll():
                    self._on_standby_event(e)
                if rc is not None and rc != 0 and self._node_exit(standby) == EXIT_FENCED:
                    r.fenced_starts += 1
                    self.say(f"standby: fenced (exit 78): the home's lease is current; starts again in {RESTART_S:g} s")
                    time.sleep(RESTART_S)
                    standby = self._start_node(self.standby, self.standby_metadata.url, fresh=False)
                elif rc is not None:
                    standby_tail.poll()
                    if rc != 0:
                        return f"standby: torchrun exited {rc}; see {standby.log_path}:\n{standby.log_tail(1500)}"
                    return ""
            if time.monotonic() > deadline:
                return self._timed_out()
            time.sleep(0.05)

    @staticmethod
    def _node_exit(node: Node) -> int | None:
        """The code the node's trainer left for its entrypoint (contract.agent_exit_file):
        torchrun itself exits 1 whatever its workers' codes."""
        path = Path(agent_exit_file(node.pid, node.env.get("TMPDIR")))
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None
        finally:
            path.unlink(missing_ok=True)

    def _on_home_event(self, e: dict[str, Any]) -> bool:
        """Whether the home's node exits for its notice."""
        r, kind = self.report, e["event"]
        if kind in ("step", "first_step"):
            r.home_last_step = max(r.home_last_step, int(e["step"]))
        elif kind == "committed":
            r.home_committed_step = int(e["step"])
            if e.get("reason") not in ("interval", None):
                self.say(f"home: committed step {e['step']} ({e.get('reason')})")
        elif kind == "notice":
            self.say(f"home: ranks agreed on a {e.get('kind')} notice at step {e.get('step')}")
        elif kind == "exit":
            self.say(f"home: rank 0 exits {e.get('code')} at step {e.get('step')} ({e.get('reason')})")
            return e.get("code") == EXIT_PREEMPTED
        return False

    def _on_standby_event(self, e: dict[str, Any]) -> None:
        r, kind = self.report, e["event"]
        if kind == "restored":
            r.resumed_from, r.resumed_tier = int(e["step"]), str(e.get("tier"))
            self.say(f"standby: restored step {e['step']} from its {e.get('tier')} tier ({e.get('source')})")
        elif kind == "fresh":
            r.resumed_from, r.resumed_tier = 0, "none"
            self.say("standby: no checkpoint found, starting at step 0")
        elif kind in ("first_step", "step") and r.t_first_standby_step is None:
            r.t_first_standby_step = float(e["t"])
            self.say(f"standby: first step ({e['step']}) in {self.standby.region}")
        elif kind == "exit":
            self.say(f"standby: rank 0 exits {e.get('code')} at step {e.get('step')} ({e.get('reason')})")

    def _lose_capacity(self) -> None:
        r = self.report
        self.cloud.metadata.schedule_spot_interruption("terminate", in_seconds=120)
        r.t_loss = self.standin.lose_capacity(self.home.worker_group)
        r.home_durable_at_loss = newest_verified(self.home)
        self.say(
            f"home: step {r.home_last_step}: spot interruption notice posted; {self.home.worker_group} is out of "
            f"capacity in {HOME_REGION} (no spot capacity; the function moves the run after {self.opts.loss_s:g} s)"
        )

    def _invoke_watch(self) -> None:
        """One scheduled invocation of the standby's capacity_watch; its decision line
        goes to logs/capacity_watch.jsonl, what it did to the drill's output."""
        r = self.report
        try:
            record = self.watch.invoke()
        except Exception as exc:  # noqa: BLE001 - Lambda would retry; so does the next invocation
            r.watch_errors += 1
            self.say(f"capacity_watch: error: {type(exc).__name__}: {str(exc)[:200]}")
            return
        t = time.time()
        moved = record.get("failover") or {}
        r.invocations += 1
        for line in moved.get("steps") or []:
            self.say(f"capacity_watch: {line}")
        if moved.get("refused"):
            self.say(f"capacity_watch: failover refused: {moved['refused']}")
        elif not moved.get("steps") and (record["decision"], moved.get("trains_in")) != self._last_said:
            self.say(f"capacity_watch: {record['decision']}, failover {json.dumps(moved, sort_keys=True)}")
        self._last_said = (record["decision"], moved.get("trains_in"))
        if record["decision"] == "failover" and r.t_decision is None:
            r.t_decision = t
            r.home_durable_at_decision = newest_verified(self.home)
            r.replica_at_decision = newest_verified(self.standby)
        if moved.get("done") and r.t_sized is None:
            r.t_sized = t

    def _standby_workers_wanted(self) -> bool:
        asg = self._client("autoscaling", STANDBY_REGION)
        got = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[self.standby.worker_group])
        return any(int(g["DesiredCapacity"]) > 0 for g in got["AutoScalingGroups"])

    def _home_instances_gone(self) -> None:
        """The home's instance is gone (AWS: the stand-in no longer lists it)."""

    def _timed_out(self) -> str:
        r, o = self.report, self.opts
        if r.t_loss is None:
            return f"home did not reach step {o.loss_step} within {o.node_timeout_s:.0f}s; see {self.logs / 'home.log'}"
        if r.t_sized is None:
            waited = o.loss_s + o.replication_wait_s + o.node_timeout_s
            return (
                f"the capacity watch did not start the standby within {waited:.0f}s of the capacity loss; "
                f"see {self.logs / 'capacity_watch.jsonl'}"
            )
        return f"the standby did not finish within {o.node_timeout_s:.0f}s; see {self.logs / 'standby.log'}"

    def _measure(self) -> None:
        r = self.report
        summary = _read_summary(self.opts.workdir / "standby" / "run")
        r.state_sha256 = summary.get("state_sha256")
        r.final_step = summary.get("step")
        r.completed = summary.get("status") == "completed"
        opts = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(self.opts).items()}
        r.settings = {"faults": [FAULT], **opts, "lease_ttl_s": LEASE_TTL_S, **self._where()}

    def _where(self) -> dict[str, str]:
        return {
            "cloud": "aws",
            "home": f"{HOME_REGION} (s3://{PRIMARY})",
            "standby": f"{STANDBY_REGION} (s3://{REPLICA})",
        }


def run_capacity_drill(opts: CapacityOptions, say: Callable[[str], None] = print) -> CapacityReport:
    if opts.cloud == "gcp":
        from drill.capacity_gcp import GcpCapacityDrill

        return GcpCapacityDrill(opts, say).run()
    return CapacityDrill(opts, say).run()
