"""Large CPU tensors on transparent huge pages (trainer/hostmem.py): the allocator is
asked before anything big is allocated, a user's explicit choice is kept, and the page
faults of a fresh 100 MB tensor drop by more than an order of magnitude where the kernel
gives huge pages. Fault counts, not timings: they do not depend on the machine's load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ftfleet.trainer import hostmem

# A fresh process: the allocator reads the variable once, at its first large allocation.
PROBE = textwrap.dedent(
    """
    import json, resource, sys
    from ftfleet.trainer.config import load_config
    cfg = load_config(sys.argv[1], sys.argv[2:])
    if cfg.train.huge_pages:
        from ftfleet.trainer.hostmem import use_huge_pages
        use_huge_pages()
    from ftfleet.trainer.train import train  # what the entry points import next
    import torch
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    counts = []
    for _ in range(3):
        before = faults()
        x = torch.ones(25_000_000)  # 100 MB, new pages each time (freed below)
        del x
        counts.append(faults() - before)
    print(json.dumps({"faults": counts}))
    """
)


def _faults(tmp_path: Path, *overrides: str, env: dict[str, str] | None = None) -> int:
    config = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "tiny.yaml"
    environ = {k: v for k, v in os.environ.items() if k != hostmem.ENV}
    environ.update(env or {})
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(config), f"run_dir={tmp_path}", *overrides],
        capture_output=True,
        text=True,
        env=environ,
        timeout=120,
        check=True,
    )
    return min(json.loads(out.stdout.strip().splitlines()[-1])["faults"])


@pytest.mark.skipif(
    hostmem.thp_mode() not in ("always", "madvise"), reason="the kernel gives no transparent huge pages here"
)
def test_a_fresh_large_tensor_faults_per_huge_page_not_per_page(tmp_path: Path) -> None:
    small_pages = 100_000_000 // 4096  # 24,414 faults for 100 MB of 4 KiB pages
    huge = _faults(tmp_path)
    off = _faults(tmp_path, "train.huge_pages=false")
    user_off = _faults(tmp_path, env={hostmem.ENV: "0"})
    assert off > small_pages * 0.9 and user_off > small_pages * 0.9
    assert huge < small_pages / 10, (huge, off)


def test_a_users_setting_is_kept_and_the_kernel_mode_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    assert hostmem.thp_mode(mode) == "madvise"
    monkeypatch.setenv(hostmem.ENV, "0")
    assert hostmem.use_huge_pages(mode) is False
    assert os.environ[hostmem.ENV] == "0"
    monkeypatch.delenv(hostmem.ENV)
    assert hostmem.use_huge_pages(mode) is True
    assert os.environ[hostmem.ENV] == "1"
    mode.write_text("always madvise [never]\n")
    assert hostmem.use_huge_pages(mode) is False  # asked for, but the kernel gives none
    assert hostmem.thp_mode(tmp_path / "missing") is None
