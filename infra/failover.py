"""`ftfleet failover STACK --to OTHER`: move a run from one region of an environment to
the other by hand (AWS), printing each step; a failback is the same with the names
swapped (docs/FAILOVER.md, "Moving the job").

It reads both stacks' outputs (`pulumi stack output --json`, or ``--outputs DIR`` holding
``<stack>.json``) and acts through the AWS APIs only. Before changing anything it checks
that the move is safe, and refuses with one line otherwise, with nothing changed:

* the two stacks are a home and its standby (``standby_of``), of one run;
* the target has its file system (a standby with ``standbyFastTier: on-failover`` needs
  ``standbyActive`` and a ``pulumi up`` first);
* the trainer image is in the target region's registry;
* the target's primary bucket holds a checkpoint that verifies (every file's size
  against its manifest);
* the run lease is not held by a third holder, and the target does not hold it already.

Then: the source's groups go to 0 (each node's termination hook takes an emergency
checkpoint); once their instances are gone, it waits (``--wait-s`` per wait; S3
replicates most objects in seconds, 99.99% within 15 minutes under Replication Time
Control, with no bound without it) until the target's primary holds the newest step that
verifies in the source's; then the target's groups take the job's size (the source's
worker group's, kept in its :data:`JOB_WORKERS_TAG` tag for a rerun after a wait ran
out, or ``--workers``). The trainer there restores the newest verified
checkpoint and takes the lease when the source's runs out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftfleet.errors import UserError

#: The tag on the source's worker group that keeps the job's size while a move is under way.
JOB_WORKERS_TAG = "ftfleet:failover-workers"
#: The outputs a stack must have for a failover (infra/aws/stack.py).
NEEDED = ("region", "run_id", "checkpoint_uri", "lease_uri", "coordinator_group", "worker_group", "trainer_image")


class Refused(UserError):
    """A failover step that cannot proceed safely; nothing was changed."""

    exit_code = 1


@dataclass(frozen=True)
class Stack:
    name: str
    outputs: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.outputs[key]

    @property
    def holder(self) -> str:
        """The lease holder its nodes write (contract.lease_holder)."""
        return f"{self.name}/{self['region']}"

    @property
    def standby_of(self) -> str:
        return str(self.outputs.get("standby_of") or "")


def load_outputs(name: str, directory: Path | None) -> Stack:
    """A stack's outputs: ``<directory>/<name>.json``, else `pulumi stack output --json`."""
    if directory is not None:
        path = directory / f"{name}.json"
        try:
            outputs = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise Refused(
                f"{path}: not the stack's outputs ({exc}); write them with `pulumi stack output --json -s {name}`"
            ) from None
    else:
        try:
            done = subprocess.run(
                ["pulumi", "stack", "output", "--json", "--stack", name], capture_output=True, text=True, check=False
            )
        except FileNotFoundError:
            raise Refused(
                "no pulumi CLI here: pass --outputs DIR with <stack>.json from `pulumi stack output --json`"
            ) from None
        if done.returncode != 0:
            raise Refused(f"pulumi stack output -s {name}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
        outputs = json.loads(done.stdout or "{}")
    if not isinstance(outputs, dict):
        raise Refused(f"{name}: its outputs are not a JSON object")
    if str(outputs.get("checkpoint_uri", "")).startswith("gs://"):
        raise Refused(f'{name} is a GCP stack: move its run by hand (docs/FAILOVER.md, "Moving the job")')
    missing = [k for k in NEEDED if not outputs.get(k)]
    if missing:
        raise Refused(
            f"{name} is not deployed with this version of ftfleet (no {', '.join(missing)}): run `pulumi up -s {name}`"
        )
    return Stack(name, outputs)


class Failover:
    """One move from ``source`` to ``target``; ``say`` prints a step."""

    def __init__(
        self,
        source: Stack,
        target: Stack,
        *,
        workers: int | None = None,
        wait_s: float = 900.0,
        poll_s: float = 10.0,
        endpoint_url: str | None = None,
        say: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.source, self.target = source, target
        self.workers, self.wait_s, self.poll_s = workers, wait_s, poll_s
        self.endpoint_url, self.say = endpoint_url, say
        self.clock, self.sleep = clock, sleep
        self._clients: dict[tuple[str, str], Any] = {}

    def _client(self, service: str, region: str) -> Any:
        """One client per service and region for the whole move (the waits poll)."""
        if (service, region) not in self._clients:
            import boto3

            self._clients[service, region] = boto3.client(service, region_name=region)
        return self._clients[service, region]

    # -- the checks -----------------------------------------------------------------

    def check(self) -> tuple[int, int]:
        """Every check of the module doc; (the target's newest verified step, the job's
        worker nodes). Raises :class:`Refused`."""
        s, t = self.source, self.target
        if not (t.standby_of == s.name or s.standby_of == t.name):
            raise Refused(f"{t.name} is not {s.name}'s standby, nor {s.name} {t.name}'s: set ftfleet:standbyOf")
        if s["run_id"] != t["run_id"] or s["lease_uri"] != t["lease_uri"]:
            raise Refused(f"{s.name} and {t.name} train different runs or leases; deploy both with one run")
        if not t.outputs.get("fsx_dns_name"):
            raise Refused(
                f"{t.name} has no file system yet: `pulumi config set ftfleet:standbyActive true -s {t.name}` "
                f"and `pulumi up -s {t.name}` first"
            )
        self._check_image()
        step = self._newest_verified(t)
        if step is None:
            raise Refused(f"{t['checkpoint_uri']} holds no checkpoint that verifies: nothing to resume there")
        self._check_lease()
        group = self._group(s, s["worker_group"])
        workers = self.workers
        if workers is None:
            # A move stopped in a wait already set the source to 0: its tag kept the size.
            recorded = {tag["Key"]: tag["Value"] for tag in group.get("Tags", [])}.get(JOB_WORKERS_TAG, "")
            workers = max(group["DesiredCapacity"], group["MinSize"]) or (int(recorded) if recorded.isdigit() else 0)
        if workers < 1:
            raise Refused(f"{s.name}'s worker group is at 0 and no job size is recorded: give --workers N")
        target_group = self._group(t, t["worker_group"])
        if workers > target_group["MaxSize"]:
            raise Refused(
                f"{t.name}'s worker group takes at most {target_group['MaxSize']} nodes, not {workers}: "
                "raise its workerMaxSize"
            )
        return step, workers

    def _check_image(self) -> None:
        t = self.target
        uri = t["trainer_image"]
        registry, _, path = uri.partition("/")
        if "@" in path:
            repository, _, digest = path.partition("@")
            image = {"imageDigest": digest}
        else:
            repository, _, tag = path.rpartition(":")
            image = {"imageTag": tag}
        ecr = self._client("ecr", t["region"])
        try:
            ecr.describe_images(registryId=registry.split(".")[0], repositoryName=repository, imageIds=[image])
        except Exception as exc:  # noqa: BLE001 - botocore's modelled errors are classes made at run time
            code = type(exc).__name__
            if code in ("ImageNotFoundException", "RepositoryNotFoundException"):
                raise Refused(f"{uri} is not in {t['region']}'s registry ({code}): push it there first") from None
            raise Refused(f"{uri}: the registry in {t['region']} could not be asked ({code}: {exc})") from None

    def _newest_verified(self, stack: Stack) -> int | None:
        from ftfleet.trainer.checkpoint.cli import newest_verified

        return newest_verified(stack["checkpoint_uri"], self.endpoint_url)

    def _check_lease(self) -> None:
        doc = self._lease()
        if doc is None:
            return
        holder, expired = doc["holder"], float(doc["expires_at"]) <= time.time()
        if holder == self.target.holder and not expired:
            raise Refused(f"{self.target.name} holds the run lease already: the run trains there")
        if holder not in (self.source.holder, self.target.holder) and not expired:
            raise Refused(
                f"the run lease is held by {holder}, neither {self.source.name} nor {self.target.name}: stop it first"
            )

    def _lease(self) -> dict[str, Any] | None:
        from ftfleet.trainer.resilience.fencing.lease import LeaseError, RunLease, open_lease_store

        store, name = open_lease_store(self.source["lease_uri"], endpoint_url=self.endpoint_url)
        try:
            return RunLease(store, name, run_id=self.source["run_id"], holder="ftfleet failover").document()
        except LeaseError as exc:
            raise Refused(str(exc)) from None

    def _group(self, stack: Stack, name: str) -> dict[str, Any]:
        groups = self._client("autoscaling", stack["region"]).describe_auto_scaling_groups(AutoScalingGroupNames=[name])
        if not groups["AutoScalingGroups"]:
            raise Refused(f"{stack.name}'s group {name} is not in {stack['region']}: run `pulumi up -s {stack.name}`")
        return groups["AutoScalingGroups"][0]

    # -- the move -------------------------------------------------------------------

    def run(self, dry_run: bool = False) -> int:
        s, t = self.source, self.target
        step, workers = self.check()
        self.say(f"checked: {t.name} has its file system, the image and step-{step} verified; the lease allows it")
        if dry_run:
            self.say(
                f"dry run: would stop {s.name}'s groups and start {t.name}'s with 1 coordinator + {workers} workers"
            )
            return 0
        self._client("autoscaling", s["region"]).create_or_update_tags(
            Tags=[
                {
                    "ResourceId": s["worker_group"],
                    "ResourceType": "auto-scaling-group",
                    "Key": JOB_WORKERS_TAG,
                    "Value": str(workers),
                    "PropagateAtLaunch": False,
                }
            ]
        )
        self._resize(s, s["coordinator_group"], 0, 0)
        self._resize(s, s["worker_group"], 0, 0)
        self.say(f"stopping {s.name}: its groups go to 0; each node takes an emergency checkpoint first")
        self._wait(lambda: self._listed(s) == 0, f"{s.name}'s instances to leave")
        wanted = self._newest_verified(s)
        resume = step
        if wanted is not None:
            self._wait(
                lambda: (self._newest_verified(t) or 0) >= wanted,
                f"step-{wanted} of {s.name} to verify in {t['checkpoint_uri']}",
            )
            resume = max(step, wanted)
        self._resize(t, t["coordinator_group"], 1, 1)
        self._resize(t, t["worker_group"], workers, workers)
        self.say(
            f"started {t.name}: 1 coordinator + {workers} workers; it resumes from step-{resume} "
            f"and takes the lease when {s.name}'s runs out"
        )
        return 0

    def _resize(self, stack: Stack, name: str, minimum: int, desired: int) -> None:
        try:
            self._client("autoscaling", stack["region"]).update_auto_scaling_group(
                AutoScalingGroupName=name, MinSize=minimum, DesiredCapacity=desired
            )
        except Exception as exc:  # noqa: BLE001 - ScalingActivityInProgress, ResourceContention: one line
            raise UserError(
                f"{stack['region']} {name}: resizing to {desired} failed ({type(exc).__name__}: {exc}); the steps "
                "printed above were done: run the same command again"
            ) from None
        self.say(f"  {stack['region']} {name}: min {minimum}, desired {desired}")

    def _listed(self, stack: Stack) -> int:
        """The groups' instances, in service or still leaving (Terminating:Wait)."""
        return sum(
            len(self._group(stack, stack[g]).get("Instances", [])) for g in ("coordinator_group", "worker_group")
        )

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        deadline = self.clock() + self.wait_s
        while not done():
            if self.clock() >= deadline:
                raise UserError(
                    f"waited {self.wait_s:.0f} s for {what}; nothing more was changed: look, then run the same "
                    "command again (it starts over from the checks)"
                )
            self.sleep(self.poll_s)
        self.say(f"  done: {what}")


def run(args: argparse.Namespace) -> int:
    outputs = Path(args.outputs) if args.outputs else None
    source, target = load_outputs(args.stack, outputs), load_outputs(args.to, outputs)
    failover = Failover(source, target, workers=args.workers, wait_s=args.wait_s, endpoint_url=args.endpoint_url)
    code = failover.run(dry_run=args.dry_run)
    sys.stdout.flush()
    return code


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "failover",
        help="move a run to its other region (AWS): checks first, then each step",
        description=__doc__.split("\n")[0],
    )
    p.add_argument("stack", help="the stack that trains the run now")
    p.add_argument("--to", required=True, help="its standby (or, to fail back, its home)")
    p.add_argument("--workers", type=int, help="worker nodes there (default: the worker group's size here)")
    p.add_argument("--wait-s", type=float, default=900.0, help="longest wait for each step (default 900)")
    p.add_argument(
        "--outputs", metavar="DIR", help="read <stack>.json stack outputs from DIR instead of the pulumi CLI"
    )
    p.add_argument("--endpoint-url", help="S3 endpoint (tests)")
    p.add_argument("--dry-run", action="store_true", help="run the checks and say what would be done")
    p.set_defaults(func=run)
