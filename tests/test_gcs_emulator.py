"""The GCS emulator the GCS tests run against behaves as the client expects."""

from __future__ import annotations

import pytest
from google.api_core import exceptions as gexc

from tests.gcs_emulator import gcs_client


def test_objects_round_trip_with_their_crc32c_and_generation_preconditions(gcs_bucket):
    bucket = gcs_client().bucket(gcs_bucket)
    blob = bucket.blob("checkpoints/run/step-1/manifest.json")
    blob.upload_from_string(b"{}", checksum="crc32c", if_generation_match=0)
    assert bucket.blob(blob.name).download_as_bytes() == b"{}"
    with pytest.raises(gexc.PreconditionFailed):  # create-only write of an existing object
        bucket.blob(blob.name).upload_from_string(b"[]", if_generation_match=0)
    assert [b.name for b in gcs_client().list_blobs(gcs_bucket, prefix="checkpoints/run/")] == [blob.name]


def test_each_test_gets_an_empty_bucket(gcs_bucket):
    assert list(gcs_client().list_blobs(gcs_bucket)) == []


def test_the_emulator_keeps_answering_after_many_requests(gcs_bucket):
    """The wrapper pipes the server's log to a pipe nobody read: after a few hundred
    requests the server blocked and every later test timed out."""
    client = gcs_client()
    for _ in range(600):
        assert list(client.list_blobs(gcs_bucket, max_results=1)) == []
