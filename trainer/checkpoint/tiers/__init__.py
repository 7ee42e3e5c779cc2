"""Checkpoint tiers: the fast local directory and the durable object stores."""

from __future__ import annotations

from ftfleet.trainer.checkpoint.tiers.base import ObjectStore, TierUnavailable, parse_uri
from ftfleet.trainer.checkpoint.tiers.local import LocalTier

__all__ = ["LocalTier", "ObjectStore", "TierUnavailable", "open_store", "parse_uri"]


#: S3 clients this process built, by (endpoint, retries), when :func:`reuse_clients` is on.
_s3_clients: dict[tuple[str | None, int], object] | None = None


def reuse_clients(on: bool = True) -> None:
    """Let later stores of this process use the S3 client an earlier one built (boto3's
    clients are thread-safe). The in-process worker turns it on: its restarts are new
    starts of the same process, and building the primary's and the replica's clients
    is a measurable part of a restart's critical path. Off by default: a
    client keeps the endpoint and credentials it was built with."""
    global _s3_clients
    _s3_clients = {} if on else None


def open_store(
    uri: str, *, endpoint_url: str | None = None, retries: int = 10, chunk_mb: int = 64, workers: int = 8
) -> ObjectStore:
    scheme, _, _ = parse_uri(uri)
    if scheme == "s3":
        from ftfleet.trainer.checkpoint.tiers import s3

        client = None
        if _s3_clients is not None:
            if (endpoint_url, retries) not in _s3_clients:
                _s3_clients[endpoint_url, retries] = s3.make_client(endpoint_url, retries)
            client = _s3_clients[endpoint_url, retries]
        return s3.S3Store(
            uri, endpoint_url=endpoint_url, retries=retries, chunk_mb=chunk_mb, workers=workers, client=client
        )
    from ftfleet.trainer.checkpoint.tiers.gcs import GCSStore

    return GCSStore(uri, retries=retries, chunk_mb=chunk_mb)
