"""What a home stack publishes for its standby, and the standby's check of it; the same
on both clouds (infra/aws/standby.py, infra/gcp/standby.py; docs/FAILOVER.md).

The home exports one output, :data:`OUTPUT`: a mapping of strings, the cloud-neutral
:data:`COMMON` fields and the cloud's own. A standby reads it through a StackReference
(:func:`read`) and stops the run with one line, before anything is created, when the
home has not published it or does not match the standby's settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi

#: The home stack's output a standby reads.
OUTPUT = "standby_source"
#: Fields every home publishes.
COMMON = ("stack", "region", "replica_region", "run_id", "checkpoint_root")


def publish(s: Any, checkpoint_root: str, **outputs: pulumi.Input[str]) -> pulumi.Output[dict[str, str]]:
    """The home's :data:`OUTPUT`: its :data:`COMMON` fields and ``outputs``."""
    fixed = {
        "stack": s.stack,
        "region": s.region,
        "replica_region": s.replica_region,
        "run_id": s.trainer.run_id,
        "checkpoint_root": checkpoint_root,
    }
    return pulumi.Output.all(**outputs).apply(lambda resolved: {**fixed, **resolved})


def checked(
    source: Any, s: Any, checkpoint_root: str, fields: tuple[str, ...], may_be_empty: tuple[str, ...] = ()
) -> dict[str, str]:
    """``source`` (the home's :data:`OUTPUT`) as a dict of ``fields``; raises
    pulumi.RunError with one line when it is absent, incomplete (a field other than
    ``may_be_empty`` empty), or names other regions, another run or another checkpoint
    root than this standby's settings ``s``."""
    home = s.standby.home
    if not isinstance(source, Mapping) or not source:
        raise pulumi.RunError(
            f"standbyOf {home}: the stack has no {OUTPUT} output; deploy {home} (`pulumi up -s {home}`) "
            "with this version of ftfleet first"
        )
    missing = [f for f in fields if not isinstance(source.get(f), str) or not (source[f] or f in may_be_empty)]
    if missing:
        raise pulumi.RunError(
            f"standbyOf {home}: its {OUTPUT} lacks {', '.join(missing)}; run `pulumi up -s {home}` again"
        )
    got = {f: source[f] for f in fields}
    for what, mine, theirs, fix in (
        (f"{s.cloud}:region", s.region, got["replica_region"], f"deploy the standby in {got['replica_region']}"),
        ("ftfleet:replicaRegion", s.replica_region, got["region"], f"set ftfleet:replicaRegion {got['region']}"),
        ("ftfleet:runId", s.trainer.run_id, got["run_id"], f"set ftfleet:runId {got['run_id']}"),
        (
            "the checkpoint root",
            checkpoint_root,
            got["checkpoint_root"],
            f"set ftfleet:checkpointPrefix and runId as {home} does",
        ),
    ):
        if mine != theirs:
            raise pulumi.RunError(f"standbyOf {home}: {what} is {mine!r} here and {theirs!r} for {home}; {fix}")
    return got


def read(
    s: Any, checkpoint_root: str, fields: tuple[str, ...], may_be_empty: tuple[str, ...] = ()
) -> pulumi.Output[dict[str, str]]:
    """The home stack's :data:`OUTPUT`, through a StackReference, :func:`checked`."""
    name = f"{pulumi.get_organization()}/{pulumi.get_project()}/{s.standby.home}"
    source = pulumi.StackReference(f"{s.name}-home", stack_name=name).get_output(OUTPUT)
    return source.apply(lambda value: checked(value, s, checkpoint_root, fields, may_be_empty))
