"""The durable tier on Google Cloud Storage (google-cloud-storage: resumable uploads,
CRC32C-checked transfers, the library's default retry policy with backoff)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ftfleet.trainer.checkpoint.tiers.base import ObjectStore, TierUnavailable


def make_client() -> Any:
    """The one place a GCS client is built (the seam tests use)."""
    from google.cloud import storage

    return storage.Client()


class GCSStore(ObjectStore):
    name = "gcs"

    def __init__(self, uri: str, *, chunk_mb: int = 64, client: Any = None):
        super().__init__(uri)
        self._client = client
        self.chunk_size = chunk_mb << 20  # a multiple of 256 KiB, as GCS requires

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                self._client = make_client()
            except Exception as exc:  # no credentials, no project
                raise TierUnavailable(f"{self.uri}: cannot create a GCS client ({exc})") from None
        return self._client

    def _retry(self):
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY

    def _call(self, fn, *args, **kwargs):
        from google.api_core import exceptions as gexc

        try:
            return fn(*args, **kwargs)
        except gexc.NotFound:
            raise
        except (gexc.Forbidden, gexc.Unauthorized) as exc:
            raise TierUnavailable(f"{self.uri}: {exc.message}") from None
        except gexc.RetryError as exc:
            raise TierUnavailable(f"{self.uri}: retries exhausted ({exc})") from None

    def _blob(self, rel: str) -> Any:
        return self.client.bucket(self.bucket).blob(self.key(rel), chunk_size=self.chunk_size)

    def list(self, rel_prefix: str) -> dict[str, int]:
        from google.api_core import exceptions as gexc

        try:
            blobs = self._call(
                lambda: list(self.client.list_blobs(self.bucket, prefix=self.key(rel_prefix), retry=self._retry()))
            )
        except gexc.NotFound:
            raise TierUnavailable(f"{self.uri}: bucket {self.bucket} does not exist") from None
        return {self.rel(b.name): int(b.size) for b in blobs}

    def get_bytes(self, rel: str) -> bytes | None:
        from google.api_core import exceptions as gexc

        try:
            return self._call(self._blob(rel).download_as_bytes, checksum="crc32c", retry=self._retry())
        except gexc.NotFound:
            return None

    def put_bytes(self, rel: str, data: bytes) -> None:
        self._call(self._blob(rel).upload_from_string, data, checksum="crc32c", retry=self._retry())

    def upload_file(self, path: Path, rel: str) -> None:
        # Re-uploading the same bytes under the same name is idempotent, so retrying an
        # upload without a generation precondition is safe here.
        self._call(self._blob(rel).upload_from_filename, str(path), checksum="crc32c", retry=self._retry())

    def download_file(self, rel: str, path: Path) -> None:
        self._call(self._blob(rel).download_to_filename, str(path), checksum="crc32c", retry=self._retry())

    def iter_object(self, rel: str) -> Iterator[bytes]:
        with self._call(self._blob(rel).open, "rb", retry=self._retry()) as f:
            while chunk := f.read(8 << 20):
                yield chunk

    def delete(self, rels: list[str]) -> None:
        from google.api_core import exceptions as gexc

        for rel in rels:
            try:
                self._call(self._blob(rel).delete, retry=self._retry())
            except gexc.NotFound:
                pass
