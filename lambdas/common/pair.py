"""What a move between a home stack and its standby names (lambdas/common/move.py):
the two sides, the run lease and how long to wait for replication. Plain data, no
client: the Pulumi program renders it into a standby's capacity watch config.

Both sides of a pair are of one cloud (:data:`CLOUDS`): on AWS each side has its own
primary bucket (the standby's is the home's replica) and the lease is in the home's; on
GCP both share the home's dual-region bucket, lease and all."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ftfleet import contract

#: S3 Replication Time Control replicates 99.99 % of objects within 15 minutes.
REPLICATION_WAIT_S = 900.0
#: A side's cloud -> the scheme of its bucket's URIs.
CLOUDS = {"aws": "s3", "gcp": "gs"}


@dataclass(frozen=True)
class Side:
    """One stack of the pair, as a move sees it."""

    stack: str
    region: str
    coordinator_group: str
    worker_group: str
    bucket: str
    """The stack's primary checkpoint bucket (a standby's is the home's replica)."""
    root: str
    """The run's checkpoint root in it (key prefix, no slashes at its ends)."""
    cloud: str = "aws"
    project: str = ""
    """GCP: the project of the side's groups."""
    more_worker_groups: tuple[str, ...] = ()
    """Worker groups beside ``worker_group`` (GCP: the on-demand workers' group), which
    a move stops and sizes with it, position by position."""

    @property
    def holder(self) -> str:
        return contract.lease_holder(self.stack, self.region)

    @property
    def uri(self) -> str:
        return f"{CLOUDS.get(self.cloud, self.cloud)}://{self.bucket}/{self.root}"

    @property
    def worker_groups(self) -> tuple[str, ...]:
        return (self.worker_group, *self.more_worker_groups)

    @classmethod
    def of(cls, value: Any) -> Side:
        """From a mapping of the fields (a function's config); raises ValueError."""
        if not isinstance(value, dict):
            raise ValueError("a side is not a JSON object")
        needed = ("stack", "region", "coordinator_group", "worker_group", "bucket", "root")
        bad = [f for f in needed if not isinstance(value.get(f), str) or not value.get(f)]
        if bad:
            raise ValueError(f"a side lacks {', '.join(bad)}")
        cloud, project = value.get("cloud", "aws"), value.get("project", "")
        more = value.get("more_worker_groups", [])
        if cloud not in CLOUDS:
            raise ValueError(f"a side's cloud is {cloud!r}, not one of {', '.join(CLOUDS)}")
        if not isinstance(project, str) or (cloud == "gcp" and not project):
            raise ValueError("a GCP side lacks project")
        if not isinstance(more, list) or not all(isinstance(g, str) and g for g in more):
            raise ValueError("a side's more_worker_groups is not a list of names")
        return cls(**{f: value[f] for f in needed}, cloud=cloud, project=project, more_worker_groups=tuple(more))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "more_worker_groups": list(self.more_worker_groups)}


@dataclass(frozen=True)
class LeaseRef:
    """Where the run lease lives (the home's primary bucket) and whose run it is."""

    bucket: str
    key: str
    region: str
    run_id: str

    @classmethod
    def parse(cls, uri: str, region: str, run_id: str) -> LeaseRef:
        """From ``s3://BUCKET/KEY`` or ``gs://BUCKET/KEY``; raises ValueError."""
        scheme, _, rest = uri.partition("://")
        bucket, _, key = rest.partition("/")
        if scheme not in CLOUDS.values() or not bucket or not key:
            raise ValueError(f"{uri!r} is not s3://BUCKET/KEY or gs://BUCKET/KEY")
        return cls(bucket, key, region, run_id)


LEASE_FIELDS = ("bucket", "key", "region", "run_id")


@dataclass(frozen=True)
class Pair:
    """A home, its standby and their run lease: what a standby's capacity_watch moves."""

    home: Side
    standby: Side
    lease: LeaseRef
    replication_wait_s: float = REPLICATION_WAIT_S

    @classmethod
    def of(cls, value: Any) -> Pair:
        """From :meth:`to_json`'s mapping; raises ValueError naming what is wrong."""
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        lease = value.get("lease")
        if not isinstance(lease, dict) or not all(isinstance(lease.get(f), str) and lease[f] for f in LEASE_FIELDS):
            raise ValueError(f"lease needs {', '.join(LEASE_FIELDS)}")
        wait = float(value.get("replication_wait_s", REPLICATION_WAIT_S))
        if not wait >= 0:
            raise ValueError("replication_wait_s is not >= 0")
        home, standby = Side.of(value.get("home")), Side.of(value.get("standby"))
        if home.cloud != standby.cloud:
            raise ValueError(f"home is on {home.cloud}, standby on {standby.cloud}: a pair is of one cloud")
        return cls(home, standby, LeaseRef(**{f: lease[f] for f in LEASE_FIELDS}), wait)

    def to_json(self) -> dict[str, Any]:
        return {
            "home": self.home.to_json(),
            "standby": self.standby.to_json(),
            "lease": asdict(self.lease),
            "replication_wait_s": self.replication_wait_s,
        }
