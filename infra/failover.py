"""`ftfleet failover STACK --to OTHER`: move a run from one region of an environment to
the other by hand (AWS or GCP), printing each step; a failback is the same with the
names swapped (docs/FAILOVER.md, "Moving the job").

It reads both stacks' outputs (`pulumi stack output --json`, or ``--outputs DIR`` holding
``<stack>.json``) and acts through the cloud's APIs only. Before changing anything it
checks that the move is safe, and refuses with one line otherwise, with nothing changed:

* the two stacks are a home and its standby (``standby_of``), of one run and one cloud;
* the target has its file system (a standby with ``standbyFastTier: on-failover`` needs
  ``standbyActive`` and a ``pulumi up`` first; on GCP that also makes its groups);
* AWS: the trainer image is in the target region's registry (a GCP standby's remote
  repository pulls it from the home's on first use);
* the target's primary bucket holds a checkpoint that verifies (every file's size
  against its manifest);
* the run lease is not held by a third holder, and the target does not hold it already.

Then the steps of :class:`~ftfleet.lambdas.common.move.Move`, the same a standby's
capacity watch takes by itself: the source's groups go to 0 (each node's termination
hook or shutdown script takes an emergency checkpoint); once the cloud lists none of
their instances, it waits until the target's primary holds the newest step that
verifies in the source's (S3 replicates most objects in seconds, 99.99 % within 15
minutes under Replication Time Control, with no bound without it; a GCP pair shares one
bucket); the target's groups take the job's size (the source's worker groups', or
``--workers`` for the main one). The target's nodes take the run lease once the
source's has run out. The move's record lives with the source (AWS: tags on its worker
group; GCP: an object beside the checkpoints): a command that ran out of ``--wait-s``,
or a function that began the move, is finished by the same command again.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ftfleet.errors import UserError
from ftfleet.lambdas.common import aws
from ftfleet.lambdas.common.move import JOB_WORKERS_TAG, LeaseRef, Move, Refused, Side

__all__ = ["JOB_WORKERS_TAG", "Failover", "Refused", "Stack", "load_outputs"]
#: The outputs a stack must have for a failover, per cloud (infra/aws/stack.py,
#: infra/gcp/stack.py).
NEEDED = {
    "aws": ("region", "run_id", "checkpoint_uri", "lease_uri", "coordinator_group", "worker_group", "trainer_image"),
    "gcp": ("region", "project", "run_id", "checkpoint_uri", "lease_uri", "coordinator_group", "worker_group"),
}


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

    @property
    def cloud(self) -> str:
        return "gcp" if str(self.outputs.get("checkpoint_uri", "")).startswith("gs://") else "aws"

    @property
    def has_file_system(self) -> bool:
        return bool(self.outputs.get("file_system_mount" if self.cloud == "gcp" else "fsx_dns_name"))


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
    stack = Stack(name, outputs)
    if stack.cloud == "gcp" and stack.standby_of and not stack.has_file_system:
        raise Refused(_inactive(name))
    missing = [k for k in NEEDED[stack.cloud] if not outputs.get(k)]
    if missing:
        raise Refused(
            f"{name} is not deployed with this version of ftfleet (no {', '.join(missing)}): run `pulumi up -s {name}`"
        )
    return stack


def _inactive(name: str) -> str:
    return (
        f"{name} has no file system yet: `pulumi config set ftfleet:standbyActive true -s {name}` "
        f"and `pulumi up -s {name}` first"
    )


def side(stack: Stack) -> Side:
    _, _, rest = str(stack["checkpoint_uri"]).partition("://")
    bucket, _, root = rest.partition("/")
    main = stack["worker_group"]
    more = tuple(g for g in stack.outputs.get("worker_groups") or [] if isinstance(g, str) and g and g != main)
    return Side(
        stack.name,
        stack["region"],
        stack["coordinator_group"],
        main,
        bucket,
        root.strip("/"),
        cloud=stack.cloud,
        project=str(stack.outputs.get("project") or ""),
        more_worker_groups=more,
    )


class Failover:
    """One move from ``source`` to ``target`` (:class:`~ftfleet.lambdas.common.move.Move`),
    after the checks only the stack outputs allow; ``say`` prints a step."""

    def __init__(
        self,
        source: Stack,
        target: Stack,
        *,
        workers: int | None = None,
        wait_s: float = 900.0,
        poll_s: float = 10.0,
        say: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.source, self.target = source, target
        self.wait_s, self.poll_s = wait_s, poll_s
        self.say, self.clock, self.sleep = say, clock, sleep
        home = target if source.standby_of == target.name else source
        try:
            lease = LeaseRef.parse(str(source["lease_uri"]), home["region"], str(source["run_id"]))
        except ValueError as exc:
            raise Refused(f"{source.name}'s lease_uri: {exc}; run `pulumi up -s {source.name}`") from None
        self.move = Move(side(source), side(target), lease, workers=workers, replication_wait_s=math.inf, say=say)

    # -- the checks only the outputs allow ----------------------------------------------

    def check_stacks(self) -> None:
        s, t = self.source, self.target
        if not (t.standby_of == s.name or s.standby_of == t.name):
            raise Refused(f"{t.name} is not {s.name}'s standby, nor {s.name} {t.name}'s: set ftfleet:standbyOf")
        if s.cloud != t.cloud:
            raise Refused(f"{s.name} is on {s.cloud} and {t.name} on {t.cloud}: a run moves within one cloud")
        if s["run_id"] != t["run_id"] or s["lease_uri"] != t["lease_uri"]:
            raise Refused(f"{s.name} and {t.name} train different runs or leases; deploy both with one run")
        if not t.has_file_system:
            raise Refused(_inactive(t.name))
        if t.cloud == "aws":
            self._check_image()

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
        ecr = aws.client("ecr", t["region"])
        try:
            ecr.describe_images(registryId=registry.split(".")[0], repositoryName=repository, imageIds=[image])
        except Exception as exc:  # noqa: BLE001 - botocore's modelled errors are classes made at run time
            code = type(exc).__name__
            if code in ("ImageNotFoundException", "RepositoryNotFoundException"):
                raise Refused(f"{uri} is not in {t['region']}'s registry ({code}): push it there first") from None
            raise Refused(f"{uri}: the registry in {t['region']} could not be asked ({code}: {exc})") from None

    # -- the move -------------------------------------------------------------------

    def run(self, dry_run: bool = False) -> int:
        s, t = self.source, self.target
        self.check_stacks()
        self.say(f"checked: {t.name} has its file system{' and the image' if t.cloud == 'aws' else ''}")
        try:
            if dry_run:
                return self._dry_run()
            deadline = self.clock() + self.wait_s
            while not self.move.advance():
                if self.clock() >= deadline:
                    raise UserError(
                        f"waited {self.wait_s:.0f} s; the steps printed above were done: look, then run the same "
                        "command again (it goes on from where the move stands)"
                    )
                self.sleep(self.poll_s)
        except cloud_errors() as exc:
            code = aws.error_code(exc) or type(exc).__name__
            raise UserError(f"{code}: {exc}; the steps printed above were done: run the same command again") from None
        self.say(f"{t.name} takes the lease when {s.name}'s runs out")
        return 0

    def _dry_run(self) -> int:
        s, t = self.source, self.target
        if self.move.under_way():
            self.say(f"dry run: a move from {s.name} to {t.name} is under way; the same command goes on with it")
            return 0
        step, workers = self.move.check()
        self.say(
            f"dry run: step-{step} verifies in {t['checkpoint_uri']}; would stop {s.name}'s groups and start "
            f"{t.name}'s with 1 coordinator + {sum(workers)} workers"
        )
        return 0


def cloud_errors() -> tuple[type[BaseException], ...]:
    """What a cloud's API raises for a call it refused or could not answer."""
    errors: list[type[BaseException]] = [aws.ClientError]
    try:
        import requests
        from google.api_core.exceptions import GoogleAPIError

        from ftfleet.lambdas.common.gcp_groups import TooLong

        errors += [requests.RequestException, GoogleAPIError, TooLong]
    except ImportError:  # an AWS-only install
        pass
    return tuple(errors)


def run(args: argparse.Namespace) -> int:
    outputs = Path(args.outputs) if args.outputs else None
    source, target = load_outputs(args.stack, outputs), load_outputs(args.to, outputs)
    failover = Failover(source, target, workers=args.workers, wait_s=args.wait_s)
    code = failover.run(dry_run=args.dry_run)
    sys.stdout.flush()
    return code


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "failover",
        help="move a run to its other region: checks first, then each step",
        description=__doc__.split("\n")[0],
    )
    p.add_argument("stack", help="the stack that trains the run now")
    p.add_argument("--to", required=True, help="its standby (or, to fail back, its home)")
    p.add_argument("--workers", type=int, help="worker nodes there (default: the worker group's size here)")
    p.add_argument("--wait-s", type=float, default=900.0, help="longest wait for each step (default 900)")
    p.add_argument(
        "--outputs", metavar="DIR", help="read <stack>.json stack outputs from DIR instead of the pulumi CLI"
    )
    p.add_argument("--dry-run", action="store_true", help="run the checks and say what would be done")
    p.set_defaults(func=run)
