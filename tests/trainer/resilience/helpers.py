"""Helpers of the resilience tests: polling with a bound, and running code in a fresh
Python process (signals, os._exit and torch.distributed need one)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def wait_for(predicate: Callable[[], object], timeout_s: float = 15.0, what: str = "condition") -> object:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``.
    The bound only keeps a broken test from hanging; nothing asserts how long it took."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


def subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FTFLEET_", "TORCHELASTIC_", "TORCH_ELASTIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run_python(
    code: str, *, timeout_s: float = 60.0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter from the repository root."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env=env or subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
