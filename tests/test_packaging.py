"""What `pip install ftfleet` puts into a user's site-packages: one top-level package."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_only_the_ftfleet_package_and_no_test_harness(tmp_path):
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "runs")
    src.mkdir()
    for item in ROOT.iterdir():
        if item.name.startswith(".") or item.name in ("build", "dist", "runs") or item.name.endswith(".egg-info"):
            continue
        if item.is_dir():
            shutil.copytree(item, src / item.name, ignore=ignore)
        else:
            shutil.copy2(item, src / item.name)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".", "-w", str(tmp_path)],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("ftfleet-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"ftfleet", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "ftfleet/trainer/train.py" in names and "ftfleet/trainer/configs/tiny.yaml" in names
    # The GCP startup script installs the node health agent from the package.
    assert "ftfleet/infra/gcp/boot/node_health.py" in names and "ftfleet/infra/gcp/boot/startup.sh" in names
    assert not [n for n in names if "drill" in n or "fake_metadata" in n or "/testing/" in n]
