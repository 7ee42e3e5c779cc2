"""Fixtures shared by every test folder, and the test tiers.

The reference runs: the uninterrupted runs of the trainer, computed once per test run,
by whichever of pytest-xdist's workers needs one first (every scenario compares against
the same ones). botocore's service models are parsed once per test process, not once per
boto3 session (:func:`_one_botocore_loader`).

The tiers (CONTRIBUTING.md): a test that starts a process (a trainer, torchrun, a
server in a process of its own, any ``subprocess`` or ``multiprocessing`` child) is
marked ``integration``; every other test is a unit test, and ``make test-fast`` runs
only those. With ``FTFLEET_TEST_TIER=fast`` (what ``make test-fast`` sets) a unit test
that starts a process fails, naming the marker it lacks, so the fast tier stays fast
and the marks stay true. Servers on threads of the test's own process (moto's,
the fake metadata service) are part of unit tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import tiers
from tests.gcs_emulator import gcs_bucket, gcs_emulator  # noqa: F401 - fixtures for every folder
from tests.trainer.conftest import run_trainer


@pytest.fixture(scope="session", autouse=True)
def _one_botocore_loader() -> Iterator[None]:
    """Every botocore session of a test process shares one data loader. Each boto3 session
    otherwise parses the service models it uses again (megabytes of JSON for S3), and
    the functions' tests make a session per test. A loader's cache is what one session
    shares among its clients already."""
    import botocore.loaders
    import botocore.session

    shared = functools.lru_cache(maxsize=None)(botocore.loaders.create_loader)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(botocore.session, "create_loader", shared)
        yield


@pytest.fixture(scope="session", autouse=True)
def _quiet_emulators() -> None:
    """The moto and fake-gcs servers log every request at INFO on their own threads, and a
    request a test's proxy held can land during a later test: at WARNING they stay out of
    the records a test counts with caplog."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)


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


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        yield


def _reference(tmp_path_factory, name: str, nproc: int, *overrides: str) -> dict:
    """An uninterrupted run, once per test run: under pytest-xdist every worker's base
    temporary directory lies in the run's own (its parent), where the first worker to
    need the reference runs it and the others wait for its summary (before, each worker
    ran its own). A failed run leaves no summary, and the next worker tries again in a
    directory of its own (the failed one's checkpoints would make it a resume)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    done = root / f"{name}.summary.json"
    with _locked(root / f"{name}.lock"):
        if not done.exists():
            run_dir = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
            summary = {**run_trainer(nproc, run_dir, *overrides), "run_dir": str(run_dir)}
            partial = done.with_suffix(".partial")
            partial.write_text(json.dumps(summary))
            partial.rename(done)  # whole, or not there
        summary = json.loads(done.read_text())
    summary["run_dir"] = Path(summary["run_dir"])
    return summary


@pytest.fixture(scope="session")
def ref1(tmp_path_factory) -> dict:
    """Uninterrupted 1-process run, checkpoint every 2 steps, all kept."""
    return _reference(tmp_path_factory, "ref1", 1, "resilience.interval.fixed_steps=2", "checkpoint.keep=100")


@pytest.fixture(scope="session")
def ref2(tmp_path_factory) -> dict:
    """Uninterrupted 2-process run, every checkpoint kept."""
    return _reference(tmp_path_factory, "ref2", 2, "checkpoint.keep=100")


#: Fixtures that start a process: a test that uses one is an integration test.
LAUNCHING_FIXTURES = frozenset({"gcs_emulator", "gcs_bucket", "ref1", "ref2"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if LAUNCHING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(tiers.MARKER)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Every phase of a test (its fixtures' setup included) runs under its tier's rule."""
    with tiers.guard(item):
        return (yield)
