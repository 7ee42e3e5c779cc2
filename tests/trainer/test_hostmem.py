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

from ftfleet import hostenv
from ftfleet.contract import ContractError
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


@pytest.mark.integration
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


# -- the host allocator (FTFLEET_HOST_ALLOCATOR) -------------------------------------

REUSE = textwrap.dedent(
    """
    import json, resource
    import torch
    from ftfleet.trainer.hostmem import active_allocator
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    counts = []
    for _ in range(3):
        before = faults()
        x = torch.ones(25_000_000)  # 100 MB, freed below
        del x
        counts.append(faults() - before)
    print(json.dumps({"allocator": active_allocator(), "faults": counts}))
    """
)


def _reuse(env: dict[str, str]) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF", hostmem.ENV)}
    environ.update({hostmem.ENV: "0", **env})  # 4 KiB pages: one fault per page touched
    out = subprocess.run(
        [sys.executable, "-c", REUSE], capture_output=True, text=True, env=environ, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(hostenv.find_jemalloc() is None, reason="no libjemalloc.so.2 on this machine (apt libjemalloc2)")
def test_with_jemalloc_a_freed_tensor_s_memory_is_reused_not_faulted_in_again() -> None:
    small_pages = 100_000_000 // 4096
    glibc = _reuse(hostenv.allocator_env({"FTFLEET_HOST_ALLOCATOR": "system"}))
    assert glibc["allocator"] == "glibc"
    assert min(glibc["faults"]) > small_pages * 0.9  # every allocation: new pages from the kernel
    jemalloc = _reuse(hostenv.allocator_env({}))
    assert jemalloc["allocator"] == "jemalloc"
    first, *again = jemalloc["faults"]
    assert first > small_pages * 0.9 and max(again) < small_pages / 10, jemalloc


def test_the_allocator_variables_follow_the_setting(tmp_path: Path) -> None:
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    found = [str(lib)]
    assert hostenv.allocator_env({}, found) == {"LD_PRELOAD": str(lib), "MALLOC_CONF": hostenv.JEMALLOC_CONF}
    assert hostenv.allocator_env({"FTFLEET_HOST_ALLOCATOR": "jemalloc"}, found)["LD_PRELOAD"] == str(lib)
    assert hostenv.allocator_env({"FTFLEET_HOST_ALLOCATOR": "system"}, found) == {}
    # Another preload is kept behind it; a MALLOC_CONF of the user's own is kept.
    env = hostenv.allocator_env({"LD_PRELOAD": "/opt/a.so:/opt/b.so", "MALLOC_CONF": "narenas:2"}, found)
    assert env == {"LD_PRELOAD": f"{lib} /opt/a.so /opt/b.so"}
    # Preloaded already (by whoever started this process): nothing to add.
    assert hostenv.allocator_env({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, found) == {}
    # system takes a preloaded malloc out, and leaves the rest.
    system = {"FTFLEET_HOST_ALLOCATOR": "system", "LD_PRELOAD": f"/opt/a.so {lib}"}
    assert hostenv.allocator_env(system, found) == {"LD_PRELOAD": "/opt/a.so"}
    # Another malloc preloaded by the caller: kept when nothing is asked for by name, refused when jemalloc is.
    tcmalloc = {"LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"}
    assert hostenv.allocator_env(tcmalloc, found) == {}
    with pytest.raises(ContractError, match="LD_PRELOAD has /usr/lib/libtcmalloc.so.4 already"):
        hostenv.allocator_env({**tcmalloc, "FTFLEET_HOST_ALLOCATOR": "jemalloc"}, found)
    # Not installed: nothing unless it was asked for by name.
    assert hostenv.allocator_env({}, [str(tmp_path / "missing.so")]) == {}
    with pytest.raises(ContractError, match="FTFLEET_HOST_ALLOCATOR=jemalloc: no libjemalloc.so.2 found"):
        hostenv.allocator_env({"FTFLEET_HOST_ALLOCATOR": "jemalloc"}, [str(tmp_path / "missing.so")])
    # A library by path: preloaded without jemalloc's settings; it must exist.
    other = tmp_path / "libtcmalloc.so.4"
    other.write_bytes(b"")
    assert hostenv.allocator_env({"FTFLEET_HOST_ALLOCATOR": str(other)}) == {"LD_PRELOAD": str(other)}
    # Applied once, it is there: whatever the library's name, applying it again adds nothing
    # (a process that re-executes itself with the result would otherwise never stop).
    plain = tmp_path / "mymalloc.so"
    plain.write_bytes(b"")
    once = hostenv.allocator_env({"FTFLEET_HOST_ALLOCATOR": str(plain)})
    assert once == {"LD_PRELOAD": str(plain)}
    assert hostenv.allocator_env({"FTFLEET_HOST_ALLOCATOR": str(plain), **once}) == {}
    with pytest.raises(ContractError, match="no such file"):
        hostenv.allocator_env({"FTFLEET_HOST_ALLOCATOR": str(tmp_path / "nope.so")})
    with pytest.raises(ContractError, match="use jemalloc, system or a library's absolute path"):
        hostenv.allocator_env({"FTFLEET_HOST_ALLOCATOR": "tcmalloc"})


def test_trainers_get_glibcs_non_temporal_threshold_lowered_never_raised() -> None:
    ours = f"{hostenv.NON_TEMPORAL_TUNABLE}={hostenv.NON_TEMPORAL_THRESHOLD:#x}"
    asked: list[dict[str, str]] = []

    def default(value: int | None):
        def current(name: str, environ):
            assert name == hostenv.NON_TEMPORAL_TUNABLE
            asked.append(dict(environ))
            return value

        return current

    big = default(0x7200000)  # glibc 2.36's on a host with a large L3
    assert hostenv.copy_tunables_env({}, "x86_64", big) == {"GLIBC_TUNABLES": ours}
    # The caller's other tunables are kept in front (and the loader is asked with them).
    other = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert hostenv.copy_tunables_env(other, "x86_64", big) == {"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{ours}"}
    assert asked[-1] == other
    # Their own threshold wins, whatever it is; applied once, it is there (a process
    # re-executing itself with the result stops).
    theirs = {"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{hostenv.NON_TEMPORAL_TUNABLE}=0x10000000"}
    assert hostenv.copy_tunables_env(theirs, "x86_64", big) == {}
    assert hostenv.copy_tunables_env({"GLIBC_TUNABLES": ours}, "x86_64", big) == {}
    # A default at or below ours, or none to be told: glibc is left alone.
    assert hostenv.copy_tunables_env({}, "x86_64", default(0xC0000)) == {}
    assert hostenv.copy_tunables_env({}, "x86_64", default(hostenv.NON_TEMPORAL_THRESHOLD)) == {}
    assert hostenv.copy_tunables_env({}, "x86_64", default(None)) == {}
    assert hostenv.copy_tunables_env({}, "aarch64", big) == {}  # an x86 tunable


def test_a_script_is_executed_again_once_with_the_host_memory_variables(monkeypatch) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(os, "execve", lambda exe, argv, env: calls.append((exe, argv, env)))
    monkeypatch.setattr(sys, "orig_argv", ["python3", "-u", "bench.py", "--mb", "64"])
    monkeypatch.setattr(hostenv, "host_memory_env", lambda environ: {"GLIBC_TUNABLES": "x=1"})
    hostenv.exec_with_host_memory()
    ((exe, argv, env),) = calls
    assert exe == sys.executable and argv == [sys.executable, "-u", "bench.py", "--mb", "64"]
    assert env["GLIBC_TUNABLES"] == "x=1" and env["PATH"] == os.environ["PATH"]
    monkeypatch.setattr(hostenv, "host_memory_env", lambda environ: {})
    hostenv.exec_with_host_memory()  # applied already: nothing
    assert len(calls) == 1


def test_the_loader_reports_the_threshold_in_force(tmp_path: Path) -> None:
    name = hostenv.NON_TEMPORAL_TUNABLE
    fake = tmp_path / "ld.so"
    fake.write_text(
        f"#!/bin/sh\necho 'glibc.malloc.arena_max: 0x0 (min: 0x1, max: 0xff)'\necho '{name}: 0x7200000 (min: 0x4040)'\n"
    )
    fake.chmod(0o755)
    assert hostenv.glibc_tunable(name, {}, str(fake)) == 0x7200000
    assert hostenv.glibc_tunable("glibc.cpu.nothing", {}, str(fake)) is None
    assert hostenv.glibc_tunable(name, {}, str(tmp_path / "missing")) is None


@pytest.mark.skipif(not Path(hostenv.X86_64_LOADER).exists(), reason="no x86-64 glibc loader")
def test_this_glibc_takes_the_threshold_trainers_get() -> None:
    # glibc ignores a tunable it does not know, or a value out of its range, without a
    # word: its loader lists the value in force.
    default = hostenv.glibc_tunable(hostenv.NON_TEMPORAL_TUNABLE, {})
    if default is None:
        pytest.skip("this glibc's loader does not list its tunables (glibc before 2.33)")
    env = hostenv.copy_tunables_env({})
    assert hostenv.glibc_tunable(hostenv.NON_TEMPORAL_TUNABLE, env) == min(default, hostenv.NON_TEMPORAL_THRESHOLD)
    # With the allocator's variables (none for glibc's malloc, nothing preloaded).
    assert hostenv.host_memory_env({"FTFLEET_HOST_ALLOCATOR": "system"}) == env


def test_the_loaded_allocator_is_read_from_the_process_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
    assert hostmem.active_allocator(maps) == "jemalloc"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert hostmem.active_allocator(maps) == "glibc"
    assert hostmem.active_allocator(tmp_path / "missing") == "unknown"
