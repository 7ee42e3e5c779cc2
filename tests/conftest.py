"""Fixtures shared by every test folder: the uninterrupted reference runs of the
trainer, computed once per session (tests/trainer and tests/resilience compare against
the same ones)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gcs_emulator import gcs_bucket, gcs_emulator  # noqa: F401 - fixtures for every folder
from tests.trainer.conftest import run_trainer


@pytest.fixture(scope="session", autouse=True)
def children_tmpdir(tmp_path_factory) -> Iterator[Path]:
    """The processes the tests start keep their temporary files (torchrun's run logs,
    multiprocessing's socket directories, a stopped agent's exit file) in this
    session's pytest directory instead of /tmp, where every killed process left its own
    for good. pytest keeps the last three sessions' directories."""
    tmp = tmp_path_factory.mktemp("tmp")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmp))
        yield tmp


@pytest.fixture(scope="session")
def session_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("trainer")


@pytest.fixture(scope="session")
def ref1(session_dir) -> dict:
    """Uninterrupted 1-process run, checkpoint every 2 steps, all kept."""
    d = session_dir / "ref1"
    s = run_trainer(1, d, "resilience.interval.fixed_steps=2", "checkpoint.keep=100")
    s["run_dir"] = d
    return s


@pytest.fixture(scope="session")
def ref2(session_dir) -> dict:
    """Uninterrupted 2-process run, every checkpoint kept."""
    d = session_dir / "ref2"
    s = run_trainer(2, d, "checkpoint.keep=100")
    s["run_dir"] = d
    return s
