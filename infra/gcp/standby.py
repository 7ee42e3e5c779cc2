"""A standby environment on GCP: the home's dual-region bucket already holds every
checkpoint in both regions, so a standby in the bucket's other region shares it as it is
(no replication to add), with the home's run lease in it.

It adds what a region of its own needs: a network, a remote Artifact Registry repository
whose upstream is the home's (nodes here pull the home's images through it, cached in
this region), the file system (``standbyFastTier``), and node groups that stand at 0:
the workers' target size belongs to the failover from creation on, and the coordinator
VM (its per-instance config) exists only with ``standbyActive``. It grants its node
service account object admin on the home's bucket. The bucket's remediation functions
(storage drift, replication lag, retention) are the home's.

The home publishes :data:`FIELDS` in its ``standby_source`` output
(infra/standby_source.py); the standby refuses a home of another project too.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from ftfleet.infra import standby_source
from ftfleet.infra.gcp.settings import GcpSettings

#: What a GCP home publishes, each a string.
FIELDS = (*standby_source.COMMON, "project", "bucket", "repository", "coordinator_group", "worker_groups")


@dataclass(frozen=True)
class Home:
    stack: str
    region: str
    replica_region: str
    run_id: str
    checkpoint_root: str
    project: str
    bucket: str
    repository: str
    """``projects/P/locations/L/repositories/R``: a remote repository's upstream."""
    coordinator_group: str
    worker_groups: str
    """The home's worker groups, comma-separated, the main one first (a move sizes the
    standby's like them, position by position)."""


def home_of(s: GcpSettings, checkpoint_root: str, project: pulumi.Input[str]) -> pulumi.Output[Home]:
    """The home's ``standby_source``, checked; also refuses a home in another project."""

    def same_project(got: dict[str, str], mine: str | None) -> Home:
        # Empty where the project is not known: an offline plan without gcp:project.
        if got["project"] and mine and got["project"] != mine:
            raise pulumi.RunError(
                f"standbyOf {s.standby.home}: gcp:project is {mine!r} here and {got['project']!r} for "
                f"{s.standby.home}; deploy the standby in {got['project']}"
            )
        return Home(**got)

    source = standby_source.read(s, checkpoint_root, FIELDS, may_be_empty=("project",))
    return pulumi.Output.all(source, project).apply(lambda a: same_project(a[0], a[1]))


@dataclass(frozen=True)
class BucketRef:
    """The home's bucket, by name: what the components read of a bucket."""

    name: pulumi.Output[str]
