"""The durable tier on S3 (boto3: multipart uploads, retries in botocore's standard
mode, which retries 5xx, throttling and connection errors with backoff)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ftfleet.trainer.checkpoint.tiers.base import ObjectStore, TierUnavailable, VersionConflict

_MISSING = ("NoSuchKey", "404", "NotFound")
_UNAVAILABLE = (
    "NoSuchBucket",
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "PermanentRedirect",
    "AuthorizationHeaderMalformed",
)


def make_client(endpoint_url: str | None, retries: int, timeout_s: float = 60.0) -> Any:
    """The one place an S3 client is built (the seam tests use). ``timeout_s``: how long
    a request waits for an answer (its connection at most 10 s of it)."""
    import boto3
    from botocore.config import Config

    config = Config(
        # total_max_attempts counts the first attempt; botocore reads max_attempts as retries.
        retries={"mode": "standard", "total_max_attempts": max(1, retries)},
        connect_timeout=min(10.0, timeout_s),
        read_timeout=timeout_s,
        # an endpoint given as host:port has no bucket subdomains
        s3={"addressing_style": "path"} if endpoint_url else None,
        max_pool_connections=32,
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url or None, config=config)


class S3Store(ObjectStore):
    name = "s3"

    def __init__(
        self,
        uri: str,
        *,
        endpoint_url: str | None = None,
        retries: int = 10,
        chunk_mb: int = 64,
        workers: int = 8,
        client: Any = None,
    ):
        super().__init__(uri)
        self.endpoint_url = endpoint_url
        self.client = client or make_client(endpoint_url, retries)
        from boto3.s3.transfer import TransferConfig

        self.transfer = TransferConfig(
            multipart_threshold=chunk_mb << 20,
            multipart_chunksize=chunk_mb << 20,
            max_concurrency=workers,
            use_threads=True,
        )

    def bounded(self, timeout_s: float) -> S3Store:
        return S3Store(self.uri, endpoint_url=self.endpoint_url, client=make_client(self.endpoint_url, 1, timeout_s))

    def _call(self, fn, *args, **kwargs):
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(*args, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in _UNAVAILABLE:
                raise TierUnavailable(f"{self.uri}: {code}") from None
            raise
        except BotoCoreError as exc:  # connection, endpoint and retry-exhaustion errors
            raise TierUnavailable(f"{self.uri}: {exc}") from None

    def list(self, rel_prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        paginator = self.client.get_paginator("list_objects_v2")

        def run() -> None:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.key(rel_prefix)):
                for obj in page.get("Contents", []):
                    out[self.rel(obj["Key"])] = int(obj["Size"])

        self._call(run)
        return out

    def get_bytes(self, rel: str) -> bytes | None:
        from botocore.exceptions import ClientError

        try:
            resp = self._call(self.client.get_object, Bucket=self.bucket, Key=self.key(rel))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                return None
            raise
        return resp["Body"].read()

    def put_bytes(self, rel: str, data: bytes) -> None:
        self._call(self.client.put_object, Bucket=self.bucket, Key=self.key(rel), Body=data)

    def read_versioned(self, rel: str) -> tuple[bytes | None, str | None]:
        from botocore.exceptions import ClientError

        def get() -> Any:
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self.key(rel))
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code")
                if code in _MISSING or (code == "AccessDenied" and not self._listed(rel)):
                    return None
                raise

        resp = self._call(get)
        if resp is None:
            return None, None
        return resp["Body"].read(), resp["ETag"]

    def _listed(self, rel: str) -> bool:
        """Whether the object exists, by a listing of its own key. S3 answers a GET of a
        missing object with 403 where the caller may not list the bucket (Amazon S3 API
        Reference, GetObject: "If you don't have the s3:ListBucket permission, Amazon S3
        returns an HTTP status code 403"); a role that may list only this key (the
        fleet's nodes and the lease) tells the two apart this way."""
        key = self.key(rel)
        resp = self._call(self.client.list_objects_v2, Bucket=self.bucket, Prefix=key, MaxKeys=1)
        return any(obj.get("Key") == key for obj in resp.get("Contents", []))

    def write_if(self, rel: str, data: bytes, version: str | None) -> str:
        """S3 conditional writes (Amazon S3 User Guide, "How to prevent object
        overwrites with conditional writes"): ``If-None-Match: *`` to create,
        ``If-Match: <ETag>`` to replace. 412 PreconditionFailed, and 409
        ConditionalRequestConflict (a concurrent conditional write of the same key), are
        a lost race."""
        from botocore.exceptions import ClientError

        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        try:
            resp = self._call(self.client.put_object, Bucket=self.bucket, Key=self.key(rel), Body=data, **condition)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                raise VersionConflict(f"{self.uri}/{rel}: {code or status}") from None
            raise
        return resp["ETag"]

    def upload_file(self, path: Path, rel: str) -> None:
        self._call(self.client.upload_file, str(path), self.bucket, self.key(rel), Config=self.transfer)

    def download_file(self, rel: str, path: Path) -> None:
        self._call(self.client.download_file, self.bucket, self.key(rel), str(path), Config=self.transfer)

    def iter_object(self, rel: str) -> Iterator[bytes]:
        resp = self._call(self.client.get_object, Bucket=self.bucket, Key=self.key(rel))
        yield from resp["Body"].iter_chunks(8 << 20)

    def delete(self, rels: list[str]) -> None:
        for i in range(0, len(rels), 1000):
            batch = [{"Key": self.key(r)} for r in rels[i : i + 1000]]
            self._call(self.client.delete_objects, Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
