"""Checkpoint tiers: the fast local directory and the durable object stores."""

from __future__ import annotations

from ftfleet.trainer.checkpoint.tiers.base import ObjectStore, TierUnavailable, parse_uri
from ftfleet.trainer.checkpoint.tiers.local import LocalTier

__all__ = ["LocalTier", "ObjectStore", "TierUnavailable", "open_store", "parse_uri"]


def open_store(
    uri: str, *, endpoint_url: str | None = None, retries: int = 10, chunk_mb: int = 64, workers: int = 8
) -> ObjectStore:
    scheme, _, _ = parse_uri(uri)
    if scheme == "s3":
        from ftfleet.trainer.checkpoint.tiers.s3 import S3Store

        return S3Store(uri, endpoint_url=endpoint_url, retries=retries, chunk_mb=chunk_mb, workers=workers)
    from ftfleet.trainer.checkpoint.tiers.gcs import GCSStore

    return GCSStore(uri, retries=retries, chunk_mb=chunk_mb)
