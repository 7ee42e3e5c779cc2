"""The environment a launcher gives the trainer processes it starts, tuned to the host.

The contract (:mod:`ftfleet.contract`) says which variables the fleet passes in
(``FTFLEET_HOST_ALLOCATOR``, the EFA devices); this module turns them, and what the host
has installed, into the variables the processes start with:

* the host allocator (:func:`allocator_env`): jemalloc, which keeps freed memory in the
  process for reuse (why: :mod:`ftfleet.trainer.hostmem`), where it is installed;
* glibc's copy threshold (:func:`copy_tunables_env`), so that large snapshot copies
  stream past the cache;
* EFA (:func:`efa_env`): libfabric's provider and NCCL's OFI plugin when the container
  sees EFA devices.

Standard library only, beside the contract: the image's entrypoint calls it before
torch is imported, with whatever interpreter the image has.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

from ftfleet.contract import EFA_DEVICE_DIR, EFA_ENV, HOST_ALLOCATOR_ENV, ContractError, host_allocator

#: jemalloc's settings for a trainer: freed memory stays in the process for reuse (why:
#: ftfleet/trainer/hostmem.py).
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"
#: Where distributions put jemalloc (Debian/Ubuntu's libjemalloc2 on x86-64 and arm64,
#: RPM distributions, a source build); the interpreter's prefix (conda) is searched too.
JEMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)


def find_jemalloc(candidates: Sequence[str] | None = None) -> str | None:
    """The first jemalloc library that exists, or None."""
    if candidates is None:
        candidates = (*JEMALLOC_PATHS, os.path.join(sys.prefix, "lib", "libjemalloc.so.2"))
    return next((path for path in candidates if os.path.isfile(path)), None)


#: Basenames of malloc libraries a process may have preloaded.
MALLOC_LIBRARIES = ("libjemalloc", "libtcmalloc", "libmimalloc")


def is_malloc(path: str) -> bool:
    """Whether ``path`` names one of :data:`MALLOC_LIBRARIES`."""
    return os.path.basename(path).startswith(MALLOC_LIBRARIES)


def allocator_env(environ: Mapping[str, str] | None = None, candidates: Sequence[str] | None = None) -> dict[str, str]:
    """The variables (``LD_PRELOAD``, ``MALLOC_CONF``) to set for the processes a
    launcher starts, as ``FTFLEET_HOST_ALLOCATOR`` in ``environ`` asks: unset, jemalloc
    where it is installed (a malloc preloaded already is left as it is); ``jemalloc``,
    jemalloc or a ContractError; ``system``, glibc's malloc (a preloaded one taken out);
    an absolute path, that library. Another malloc already preloaded where one is asked
    for by name is a ContractError; a ``MALLOC_CONF`` of the caller's own is kept."""
    environ = os.environ if environ is None else environ
    choice = host_allocator(environ)
    preload = environ.get("LD_PRELOAD", "").replace(":", " ").split()
    others = [p for p in preload if not is_malloc(p)]
    if choice == "system":
        return {"LD_PRELOAD": " ".join(others)} if len(others) != len(preload) else {}
    if choice.startswith("/"):
        if not os.path.isfile(choice):
            raise ContractError(f"{HOST_ALLOCATOR_ENV}={choice!r}: no such file; give a malloc library, or system")
        library = choice
    else:  # unset, or jemalloc
        found = find_jemalloc(candidates)
        if found is None:
            if choice:
                raise ContractError(
                    f"{HOST_ALLOCATOR_ENV}=jemalloc: no libjemalloc.so.2 found (install libjemalloc2, give its "
                    "path, or set system)"
                )
            return {}
        library = found
    if any(os.path.basename(p) == os.path.basename(library) for p in preload):
        return {}  # there already (whatever its name): applying the result again changes nothing
    preloaded = [p for p in preload if is_malloc(p)]
    if preloaded:
        if not choice:
            return {}  # the caller's own choice
        raise ContractError(
            f"{HOST_ALLOCATOR_ENV}={choice!r}, but LD_PRELOAD has {preloaded[0]} already: unset one of them"
        )
    out = {"LD_PRELOAD": " ".join([library, *preload])}
    if "jemalloc" in os.path.basename(library) and not environ.get("MALLOC_CONF"):
        out["MALLOC_CONF"] = JEMALLOC_CONF
    return out


#: glibc's tunable for the size from which ``memcpy``/``memmove`` stream a block past
#: the cache (non-temporal stores), and the most trainers get: 4 MiB, an L2's size.
#: glibc derives its default from the L3's size, which can be above every tensor of a
#: snapshot: their copies then read each destination line before writing it
#: (``bench/snapshot_bench.py`` measures both).
NON_TEMPORAL_TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
NON_TEMPORAL_THRESHOLD = 4 << 20
#: The x86-64 program interpreter (fixed by the psABI): ``--list-tunables`` prints the
#: values in force for the environment it runs in (glibc 2.33 and later).
X86_64_LOADER = "/lib64/ld-linux-x86-64.so.2"


def glibc_tunable(name: str, environ: Mapping[str, str], loader: str = X86_64_LOADER) -> int | None:
    """The value of glibc tunable ``name`` that a process started with ``environ`` gets
    (glibc's default or the environment's ``GLIBC_TUNABLES``), as its loader reports it;
    None where it cannot tell (no such loader, an older glibc, another libc). The
    loader runs once per ``GLIBC_TUNABLES`` value in this process."""
    return _listed_tunable(name, environ.get("GLIBC_TUNABLES"), loader)


@functools.lru_cache(maxsize=16)
def _listed_tunable(name: str, tunables: str | None, loader: str) -> int | None:
    env = {} if tunables is None else {"GLIBC_TUNABLES": tunables}
    try:
        out = subprocess.run([loader, "--list-tunables"], env=env, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        key, _, rest = line.partition(":")
        if key == name and rest.split():
            try:
                return int(rest.split()[0], 0)
            except ValueError:
                return None
    return None


def copy_tunables_env(
    environ: Mapping[str, str] | None = None,
    machine: str | None = None,
    current: Callable[[str, Mapping[str, str]], int | None] = glibc_tunable,
) -> dict[str, str]:
    """``GLIBC_TUNABLES`` for the processes a launcher starts: glibc's non-temporal
    threshold lowered to :data:`NON_TEMPORAL_THRESHOLD`, added to the caller's tunables.
    Nothing when the caller sets that tunable (theirs is kept), when glibc's default
    (``current``, asked of the loader) is that or lower or cannot be told, or off
    x86-64: the threshold is only ever lowered."""
    environ = os.environ if environ is None else environ
    machine = platform.machine() if machine is None else machine
    tunables = [item for item in environ.get("GLIBC_TUNABLES", "").split(":") if item]
    if machine.lower() not in ("x86_64", "amd64") or any(t.startswith(NON_TEMPORAL_TUNABLE + "=") for t in tunables):
        return {}
    default = current(NON_TEMPORAL_TUNABLE, environ)
    if default is None or default <= NON_TEMPORAL_THRESHOLD:
        return {}
    return {"GLIBC_TUNABLES": ":".join([*tunables, f"{NON_TEMPORAL_TUNABLE}={NON_TEMPORAL_THRESHOLD:#x}"])}


def host_memory_env(
    environ: Mapping[str, str] | None = None, candidates: Sequence[str] | None = None
) -> dict[str, str]:
    """What a launcher sets for the trainer processes it starts, before they start: the
    host allocator (:func:`allocator_env`) and glibc's copy threshold
    (:func:`copy_tunables_env`). ContractError as :func:`allocator_env`."""
    return {**allocator_env(environ, candidates), **copy_tunables_env(environ)}


def exec_with_host_memory() -> None:
    """For a script that starts trainer-like processes itself (a benchmark), before torch
    is imported: execute this Python again, with the command line it was started with
    (``sys.orig_argv``: interpreter options, ``-c`` or ``-m`` included) and
    :func:`host_memory_env` applied; return when it is applied already (once, then the
    variables are there). ContractError as :func:`allocator_env`."""
    extra = host_memory_env(os.environ)
    if extra:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **extra})


def efa_env(device_dir: str = EFA_DEVICE_DIR) -> dict[str, str]:
    """EFA_ENV when the container sees EFA devices, else nothing."""
    try:
        present = any(name.startswith("uverbs") for name in os.listdir(device_dir))
    except OSError:
        present = False
    return dict(EFA_ENV) if present else {}
