"""Scheduled: the run's retention schedule applied to the checkpoint bucket.

The trainer prunes the bucket after each of its uploads; nobody does for a run that is
gone. Cloud Scheduler publishes to the function's topic every hour, and the function
applies the same decision (ftfleet/retention.py, :func:`~ftfleet.retention.plan_sweep`)
to every step directory under the run's checkpoint root (the root the replication watch
reads), all of them, not the newest SCAN_LIMIT of lambdas/common/checkpoints.py:

* kept: what the newest readable manifest's recorded policy keeps (its rules and pinned
  steps; the stack's ``checkpointRetention`` where no manifest records one), every
  milestone as its manifest marks it, the newest committed checkpoint, the newest
  complete one (its manifest and every file it lists, with the listed sizes, as
  lambdas/common/checkpoints.py counts it), and every checkpoint whose manifest does not
  read;
* deleted: the other committed checkpoints, oldest first, each ``manifest.json`` first,
  so that it stops being a checkpoint before it loses a file; then step directories
  without a manifest, older than the newest checkpoint, whose newest object is
  DEBRIS_AGE_S old (debris of a crashed save or upload).

Every object is deleted at the generation the listing saw (``ifGenerationMatch``): an
object written again since is not this sweep's to delete. The bucket is one dual-region
namespace, so there is no replica to sweep; its versioning and lifecycle rules keep a
deleted object as a noncurrent version for their window. A step that fails to delete
is logged and counted, and the sweep goes on; it starts no deletion in the last
RESERVE_S seconds of its invocation, and the next hour's run goes on where it stopped.
A listing or a manifest that cannot be read fails the run (Pub/Sub redelivers it):
nothing is deleted on a partial survey. Written at every run, label stack
(config.METRICS): ``retention_deleted_checkpoints``, ``retention_kept_checkpoints``,
``retention_delete_failures``.
"""

from __future__ import annotations

from typing import Any

from ftfleet import contract, retention
from ftfleet.lambdas.common import checkpoints, gcp, runtime
from ftfleet.lambdas.common.log import DecisionLog
from ftfleet.lambdas.gcp_retention_sweep.config import DELETED, FAILURES, KEPT, Config

NAME = "gcp_retention_sweep"
#: Seconds of the invocation kept for the deletion in progress and the metrics.
RESERVE_S = 60.0

clock = runtime.Clock()

Listing = dict[int, dict[str, Any]]
"""step -> {object name below the step's directory: its listed blob}."""


class StepDirectories:
    """The run's step directories in one Cloud Storage bucket."""

    def __init__(self, name: str, root: str):
        self.name, self.root = name, root

    def list(self) -> Listing:
        """Every object under ``<root>/step-``, every page, grouped by step directory;
        names that are no step directory (``contract.parse_step_dir``) are left out."""
        out: Listing = {}
        for blob in gcp.storage().list_blobs(self.name, prefix=f"{self.root}/{contract.STEP_DIR_PREFIX}"):
            directory, slash, rest = blob.name[len(self.root) + 1 :].partition("/")
            step = contract.parse_step_dir(directory)
            if step is not None and slash and rest:
                out.setdefault(step, {})[rest] = blob
        return out

    @staticmethod
    def remove(objects: dict[str, Any]) -> None:
        """The manifest first, then every other object, each at its listed generation.
        An object already gone is no failure; any other error stops this step."""
        from google.api_core import exceptions

        for name in sorted(objects, key=lambda n: (n != contract.MANIFEST_NAME, n)):
            listed = objects[name]
            # The live object, not the listed generation: a delete that names a
            # generation removes that version for good, while deleting the live object of
            # a versioned bucket leaves a noncurrent version ("Object Versioning").
            try:
                listed.bucket.blob(listed.name).delete(if_generation_match=listed.generation)
            except exceptions.NotFound:
                pass  # pruned by the trainer, or by a sweep before this one


def survey(listing: Listing, now: float) -> tuple[dict[int, retention.Recorded | None], set[int], dict[int, float]]:
    """What :func:`~ftfleet.retention.plan_sweep` takes: step -> what its manifest
    records (None where it does not read), the complete steps, and each step directory
    without a manifest -> when its newest object was written."""
    from google.api_core import exceptions

    recorded: dict[int, retention.Recorded | None] = {}
    complete: set[int] = set()
    uncommitted: dict[int, float] = {}
    sizes = {step: {name: int(b.size or 0) for name, b in objects.items()} for step, objects in listing.items()}
    for step, objects in listing.items():
        manifest = objects.get(contract.MANIFEST_NAME)
        if manifest is None:
            uncommitted[step] = max(b.updated.timestamp() if b.updated else now for b in objects.values())
            continue
        try:
            text = manifest.download_as_bytes()
        except exceptions.NotFound:
            continue  # deleted since the listing: not a checkpoint any more
        recorded[step], whole = checkpoints.recorded(text, step, sizes)
        if whole:
            complete.add(step)
    return recorded, complete, uncommitted


def handler(cloud_event: Any, context: Any = None) -> dict[str, Any]:
    return runtime.run(NAME, Config, decide, cloud_event, context)


def decide(event: Any, cfg: Config, log: DecisionLog, context: Any) -> dict[str, Any]:
    gcp.message(event)  # any tick will do; a malformed message is still dropped
    now = clock.now()
    # Cloud Functions hands the handler no remaining time (lambdas/common/push.py): the
    # invocation's budget is the function's timeout, counted from here.
    deadline = now + runtime.remaining_s(context, default=cfg.timeout_s) - RESERVE_S
    directories = StepDirectories(cfg.bucket, cfg.root)
    listing = directories.list()
    recorded, complete, uncommitted = survey(listing, now)
    plan = retention.plan_sweep(recorded, complete, uncommitted, now, retention.Policy(cfg.rules))
    deleted: list[int] = []
    failed: list[int] = []
    left: list[int] = []
    for step in [*plan.delete, *plan.debris]:
        if clock.now() >= deadline:
            left.append(step)
            continue
        try:
            directories.remove(listing[step])
            deleted.append(step)
        except Exception as exc:  # noqa: BLE001 - one step's failure must not stop the sweep
            failed.append(step)
            log.decision("delete-failed", level="WARNING", step=step, error=f"{type(exc).__name__}: {exc}")
    labels = {"stack": cfg.stack}
    gcp.write_metrics(
        cfg.project, [(DELETED, len(deleted), labels), (KEPT, len(plan.kept), labels), (FAILURES, len(failed), labels)]
    )
    return log.decision(
        "swept" if recorded else "no-checkpoint",
        level="WARNING" if failed else "INFO",
        deleted=deleted,
        debris=[s for s in plan.debris if s in deleted],
        failed=failed,
        left_for_next=left,
        kept=len(plan.kept),
        rules=list(plan.policy.rules),
        pinned=sorted(plan.policy.pinned),
    )


runtime.prime(Config)
