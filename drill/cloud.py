"""The drill's cloud, on 127.0.0.1: an S3 server (moto) holding a primary and a
replica checkpoint bucket, and a fake instance metadata service (AWS IMDSv2).

moto stores a bucket's replication configuration but never copies objects, so
:class:`LocalCloud` replicates itself: :meth:`LocalCloud.replicate` copies what is new
in the primary to the replica (manifests last, as S3 replication gives no ordering
and a manifest without its shards is not a checkpoint anyway) and removes what
retention removed, and a background thread calls it every ``replication_lag_s``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from drill.fake_metadata import FakeMetadataServer
from ftfleet.contract import MANIFEST_NAME
from ftfleet.errors import UserError

log = logging.getLogger("ftfleet.drill")

REGION = "us-east-1"
#: Dummy credentials: moto accepts anything, and nothing may reach a real account.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "drill", "AWS_SECRET_ACCESS_KEY": "drill", "AWS_DEFAULT_REGION": REGION}


class LocalCloud:
    """Start with :meth:`start` (or ``with``); everything listens on 127.0.0.1 on free ports.

    ``endpoint_url``: an S3 endpoint already running (an :class:`~drill.aws_standin.AwsStandIn`)
    instead of a moto server of its own. ``replica_region``: the replica bucket's region
    (the primary's is :data:`REGION`)."""

    def __init__(
        self,
        *,
        primary: str = "ftfleet-drill-primary",
        replica: str = "ftfleet-drill-replica",
        prefix: str = "checkpoints/drill",
        replication_lag_s: float = 1.0,
        endpoint_url: str = "",
        replica_region: str = REGION,
    ) -> None:
        self.primary, self.replica, self.prefix = primary, replica, prefix
        self.replication_lag_s = replication_lag_s
        self.replica_region = replica_region
        self.metadata = FakeMetadataServer(instance_id="i-0drill000000000000")
        self._moto: Any = None
        self._s3: Any = None
        self.endpoint_url = endpoint_url
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.primary_lost = False
        self.copied = 0

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> LocalCloud:
        try:
            import boto3
            from moto.server import ThreadedMotoServer
        except ImportError as exc:
            raise UserError(
                f"the drill needs {exc.name} (moto[server], boto3): install the "
                "dev extra, `pip install -e '.[dev]'` (or `make setup`)"
            ) from None
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's per-request lines
        if not self.endpoint_url:
            self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self._moto.start()
            host, port = self._moto.get_host_and_port()
            self.endpoint_url = f"http://{host}:{port}"
        self._s3 = boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id="drill",
            aws_secret_access_key="drill",
        )
        for bucket, region in ((self.primary, REGION), (self.replica, self.replica_region)):
            where = {} if region == REGION else {"CreateBucketConfiguration": {"LocationConstraint": region}}
            self._s3.create_bucket(Bucket=bucket, **where)
            self._s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
        self.metadata.start()
        return self

    def stop(self) -> None:
        self.stop_replication()
        self.metadata.stop()
        if self._moto is not None:
            self._moto.stop()
            self._moto = None

    def __enter__(self) -> LocalCloud:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def primary_uri(self) -> str:
        return f"s3://{self.primary}/{self.prefix}"

    @property
    def replica_uri(self) -> str:
        return f"s3://{self.replica}/{self.prefix}"

    # -- replication ---------------------------------------------------------------

    def keys(self, bucket: str) -> list[str]:
        """Every key under the checkpoint prefix."""
        return sorted(self._objects(bucket))

    def _objects(self, bucket: str) -> dict[str, tuple[int, str]]:
        out: dict[str, tuple[int, str]] = {}
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=self.prefix + "/"):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = (obj["Size"], obj["ETag"])
        return out

    def replicate(self) -> int:
        """Make the replica hold what the primary holds; the number of objects copied.
        A no-op once the primary is lost (its region is gone, nothing replicates)."""
        with self._lock:
            if self.primary_lost:
                return 0
            src, dst = self._objects(self.primary), self._objects(self.replica)
            todo = [k for k, v in src.items() if dst.get(k) != v]
            todo.sort(key=lambda k: k.endswith("/" + MANIFEST_NAME))  # manifests last
            for key in todo:
                self._s3.copy_object(Bucket=self.replica, Key=key, CopySource={"Bucket": self.primary, "Key": key})
            gone = [k for k in dst if k not in src]
            gone.sort(key=lambda k: not k.endswith("/" + MANIFEST_NAME))  # manifests first
            for key in gone:
                self._s3.delete_object(Bucket=self.replica, Key=key)
            self.copied += len(todo)
            return len(todo)

    def start_replication(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._replicate_forever, name="drill-replication", daemon=True)
        self._thread.start()

    def stop_replication(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None

    def _replicate_forever(self) -> None:
        while not self._stop.wait(self.replication_lag_s):
            try:
                self.replicate()
            except Exception as exc:  # noqa: BLE001 - keep replicating; the drill checks
                log.warning("replication pass failed: %s", exc)

    # -- faults --------------------------------------------------------------------

    def step_keys(self, bucket: str, step: int) -> list[str]:
        prefix = f"{self.prefix}/step-{step}/"
        return sorted(k for k in self._objects(bucket) if k.startswith(prefix))

    def corrupt_step(self, bucket: str, step: int) -> str | None:
        """Flip bytes in the middle of the largest data file of ``step``; its key."""
        with self._lock:
            keys = [k for k in self.step_keys(bucket, step) if k.endswith(".distcp")]
            if not keys:
                return None
            sizes = self._objects(bucket)
            key = max(keys, key=lambda k: sizes[k][0])
            data = bytearray(self._s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            flip_middle(data)
            self._s3.put_object(Bucket=bucket, Key=key, Body=bytes(data))
            return key

    def lose_primary(self) -> int:
        """Delete every object (and version) of the primary bucket, then the bucket: the
        region is gone. Replication stops. The number of object versions deleted."""
        self.stop_replication()
        with self._lock:
            self.primary_lost = True
            deleted = 0
            for page in self._s3.get_paginator("list_object_versions").paginate(Bucket=self.primary):
                doomed = [
                    {"Key": v["Key"], "VersionId": v["VersionId"]}
                    for v in page.get("Versions", []) + page.get("DeleteMarkers", [])
                ]
                for i in range(0, len(doomed), 1000):
                    self._s3.delete_objects(
                        Bucket=self.primary, Delete={"Objects": doomed[i : i + 1000], "Quiet": True}
                    )
                deleted += len(doomed)
            self._s3.delete_bucket(Bucket=self.primary)
            return deleted

    def bucket_exists(self, bucket: str) -> bool:
        try:
            self._s3.head_bucket(Bucket=bucket)
            return True
        except Exception:  # noqa: BLE001 - 404 or 403: not there for us
            return False


def flip_middle(data: bytearray, count: int = 16) -> None:
    """Invert ``count`` bytes in the middle of ``data`` (same size, different content)."""
    mid = len(data) // 2
    for i in range(mid, min(len(data), mid + count)):
        data[i] ^= 0xFF
