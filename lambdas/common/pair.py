"""What a move between a home stack and its standby names (lambdas/common/move.py):
the two sides, the run lease and how long to wait for replication. Plain data, no
client: the Pulumi program renders it into a standby's capacity_watch config."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ftfleet import contract

#: S3 Replication Time Control replicates 99.99 % of objects within 15 minutes.
REPLICATION_WAIT_S = 900.0


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

    @property
    def holder(self) -> str:
        return contract.lease_holder(self.stack, self.region)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.root}"

    @classmethod
    def of(cls, value: Any) -> Side:
        """From a mapping of the fields (a function's config); raises ValueError."""
        if not isinstance(value, dict):
            raise ValueError("a side is not a JSON object")
        fields = {f: value.get(f) for f in cls.__dataclass_fields__}
        bad = [f for f, v in fields.items() if not isinstance(v, str) or not v]
        if bad:
            raise ValueError(f"a side lacks {', '.join(bad)}")
        return cls(**fields)

    def to_json(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class LeaseRef:
    """Where the run lease lives (the home's primary bucket) and whose run it is."""

    bucket: str
    key: str
    region: str
    run_id: str

    @classmethod
    def parse(cls, uri: str, region: str, run_id: str) -> LeaseRef:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        if not uri.startswith("s3://") or not bucket or not key:
            raise ValueError(f"{uri!r} is not s3://BUCKET/KEY")
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
        return cls(
            Side.of(value.get("home")),
            Side.of(value.get("standby")),
            LeaseRef(**{f: lease[f] for f in LEASE_FIELDS}),
            wait,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "home": self.home.to_json(),
            "standby": self.standby.to_json(),
            "lease": asdict(self.lease),
            "replication_wait_s": self.replication_wait_s,
        }
