"""Fixtures of the resilience tests: a fake metadata service and fast watcher settings.
Helpers for subprocesses and polling live in helpers.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from drill.fake_metadata import FakeMetadataServer
from ftfleet.trainer.resilience.notices.watcher import WatcherConfig


@pytest.fixture
def fake_metadata() -> Iterator[FakeMetadataServer]:
    with FakeMetadataServer(max_wait_s=5.0) as server:
        yield server


@pytest.fixture
def fast_config() -> WatcherConfig:
    """Polls every 50 ms; long polls and backoff stay short so tests end quickly."""
    return WatcherConfig(poll_interval_s=0.05, gcp_wait_timeout_s=2.0, request_timeout_s=2.0, max_backoff_s=0.2)
