"""The durable tier on Google Cloud Storage (google-cloud-storage: resumable uploads,
CRC32C-checked transfers, retries of the library's retryable errors with backoff).

The client is ``storage.Client()``: Application Default Credentials on a node (the VM's
service account), and the endpoint named by ``STORAGE_EMULATOR_HOST`` when that is set
(the client's own convention, which the tests and the drill use to reach an emulator).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ftfleet.trainer.checkpoint.tiers.base import ObjectStore, TierUnavailable, VersionConflict

#: Backoff of a retried request: first wait, growth factor, longest wait (seconds).
RETRY_INITIAL_S = 1.0
RETRY_MULTIPLIER = 2.0
RETRY_MAX_WAIT_S = 30.0


def make_client() -> Any:
    """The one place a GCS client is built."""
    from google.cloud import storage

    return storage.Client()


def retry_budget_s(retries: int) -> float:
    """How long a request is retried: the backoff waits of ``retries`` attempts.

    google-api-core retries until a deadline, not a number of attempts, so the
    ``checkpoint.retries`` attempts S3 gets become the time those attempts' waits take.
    Without it the library's default deadline (120 s) holds every request to an
    unreachable bucket for two minutes before restore may move on to the next tier.
    """
    waits = (min(RETRY_INITIAL_S * RETRY_MULTIPLIER**i, RETRY_MAX_WAIT_S) for i in range(max(0, retries - 1)))
    return max(RETRY_INITIAL_S, sum(waits))


class ConcurrentWrite(RuntimeError):
    """Another writer changed the object between this write's read and its upload."""


class GCSStore(ObjectStore):
    name = "gcs"

    def __init__(self, uri: str, *, retries: int = 10, chunk_mb: int = 64, timeout_s: float = 60.0):
        super().__init__(uri)
        self.timeout_s = timeout_s  # per request, except the shards' transfers
        self._client: Any = None  # built on first use: a node without credentials fails there, as unavailable
        self.chunk_size = chunk_mb << 20  # a multiple of 256 KiB, as GCS requires
        self.retry_budget_s = retry_budget_s(retries)
        from google.cloud.storage.retry import DEFAULT_RETRY

        self._retry = DEFAULT_RETRY.with_delay(
            initial=RETRY_INITIAL_S, multiplier=RETRY_MULTIPLIER, maximum=RETRY_MAX_WAIT_S
        ).with_timeout(self.retry_budget_s)

    def bounded(self, timeout_s: float) -> GCSStore:
        return GCSStore(self.uri, retries=1, timeout_s=timeout_s)

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                self._client = make_client()
            except Exception as exc:  # no credentials, no project
                raise TierUnavailable(f"{self.uri}: cannot create a GCS client ({exc})") from None
        return self._client

    def _call(self, fn, *args, missing_bucket_on_404: bool = False, **kwargs):
        """Run one client call; errors that mean "this tier cannot be used" become
        TierUnavailable. A 404 stays NotFound (a missing object) unless the call can
        only 404 for a missing bucket (listing, writing)."""
        from google.api_core import exceptions as gexc
        from requests import exceptions as rexc

        try:
            return fn(*args, **kwargs)
        except gexc.NotFound:
            if missing_bucket_on_404:
                raise TierUnavailable(f"{self.uri}: bucket {self.bucket} does not exist") from None
            raise
        except (gexc.Forbidden, gexc.Unauthorized) as exc:
            raise TierUnavailable(f"{self.uri}: {exc.message}") from None
        except gexc.RetryError as exc:
            raise TierUnavailable(
                f"{self.uri}: no answer after retrying for {self.retry_budget_s:.0f}s ({exc.cause or exc})"
            ) from None
        except rexc.ConnectionError as exc:  # raised past the retry by streamed reads
            raise TierUnavailable(f"{self.uri}: {exc}") from None

    def _blob(self, rel: str) -> Any:
        return self.client.bucket(self.bucket).blob(self.key(rel), chunk_size=self.chunk_size)

    def list(self, rel_prefix: str) -> dict[str, int]:
        blobs = self._call(
            lambda: list(
                self.client.list_blobs(
                    self.bucket, prefix=self.key(rel_prefix), retry=self._retry, timeout=self.timeout_s
                )
            ),
            missing_bucket_on_404=True,
        )
        return {self.rel(b.name): int(b.size) for b in blobs}

    def get_bytes(self, rel: str) -> bytes | None:
        from google.api_core import exceptions as gexc

        try:
            return self._call(
                self._blob(rel).download_as_bytes, checksum="crc32c", retry=self._retry, timeout=self.timeout_s
            )
        except gexc.NotFound:
            return None

    def put_bytes(self, rel: str, data: bytes) -> None:
        """Write a small object (a manifest, a commit marker) conditionally
        (:meth:`write_if`) on the generation read just before, never blindly. A
        conditional write is idempotent, so the retries are safe: a retry that finds its
        own earlier attempt landed (the same bytes) is done, and a stale writer cannot
        overwrite what another wrote meanwhile (ConcurrentWrite)."""
        from google.api_core import exceptions as gexc

        blob = self._blob(rel)
        try:
            self._call(blob.reload, retry=self._retry, timeout=self.timeout_s)
            generation: str | None = str(blob.generation)
        except gexc.NotFound:
            generation = None
        try:
            self.write_if(rel, data, generation)
        except VersionConflict:
            if self.get_bytes(rel) == data:
                return
            raise ConcurrentWrite(
                f"{self.uri}: {rel} changed since generation {generation or 0} was read; not overwritten"
            ) from None

    def read_versioned(self, rel: str) -> tuple[bytes | None, str | None]:
        from google.api_core import exceptions as gexc

        for _ in range(5):
            blob = self._blob(rel)
            try:
                self._call(blob.reload, retry=self._retry, timeout=self.timeout_s)
                generation = int(blob.generation)
                # The bytes of that generation: a newer one in between is read again.
                data = self._call(
                    blob.download_as_bytes,
                    checksum="crc32c",
                    if_generation_match=generation,
                    retry=self._retry,
                    timeout=self.timeout_s,
                )
            except gexc.NotFound:
                return None, None
            except gexc.PreconditionFailed:
                continue
            return data, str(generation)
        raise VersionConflict(f"{self.uri}/{rel}: changed under five reads in a row")

    def write_if(self, rel: str, data: bytes, version: str | None) -> str:
        """A write under a generation precondition ("Request preconditions",
        https://cloud.google.com/storage/docs/request-preconditions):
        ``ifGenerationMatch=0`` to create, the generation read to replace; 412 is a
        lost race. Conditional, so the client's retries are safe."""
        from google.api_core import exceptions as gexc

        blob = self._blob(rel)
        try:
            self._call(
                blob.upload_from_string,
                data,
                checksum="crc32c",
                if_generation_match=0 if version is None else int(version),
                retry=self._retry,
                timeout=self.timeout_s,
                missing_bucket_on_404=True,
            )
        except gexc.PreconditionFailed:
            raise VersionConflict(f"{self.uri}/{rel}: generation is not {version or 0}") from None
        return str(blob.generation)

    def upload_file(self, path: Path, rel: str) -> None:
        # Re-uploading the same bytes under the same name is idempotent, so retrying an
        # upload without a generation precondition is safe here (the library retries
        # uploads only when told to).
        self._call(
            self._blob(rel).upload_from_filename,
            str(path),
            checksum="crc32c",
            retry=self._retry,
            missing_bucket_on_404=True,
        )

    def download_file(self, rel: str, path: Path) -> None:
        self._call(self._blob(rel).download_to_filename, str(path), checksum="crc32c", retry=self._retry)

    def iter_object(self, rel: str) -> Iterator[bytes]:
        reader = self._call(self._blob(rel).open, "rb", retry=self._retry)
        with reader as f:
            while chunk := self._call(f.read, 8 << 20):
                yield chunk

    def delete(self, rels: list[str]) -> None:
        from google.api_core import exceptions as gexc

        for rel in rels:
            try:
                self._call(self._blob(rel).delete, retry=self._retry, timeout=self.timeout_s)
            except gexc.NotFound:
                pass
