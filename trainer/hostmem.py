"""Host memory: large CPU tensors on transparent huge pages, and an allocator that
keeps freed memory.

glibc's malloc serves a block above its mmap threshold (32 MiB at most) with a fresh
``mmap`` and unmaps it on ``free``. A training step frees and allocates its gradients,
activations and optimizer temporaries every step, so each big tensor comes back as new
4 KiB pages that the kernel faults in and zeroes one by one, every step; every snapshot,
save, restore and restart pays for fresh pages the same way (``bench/hostmem_bench.py``
measures the cost).

PyTorch's CPU allocator can ask for transparent huge pages: with
``THP_MEM_ALLOC_ENABLE=1`` it aligns blocks of 2 MiB and more to 2 MiB and advises
``MADV_HUGEPAGE``, so a fresh block faults once per 2 MiB instead of once per 4 KiB. It
takes the kernel's THP mode ``madvise`` or ``always``
(``/sys/kernel/mm/transparent_hugepage/enabled``); with ``never`` nothing changes.
Making glibc keep freed memory instead (``M_MMAP_MAX`` 0, no trimming) does not work:
PyTorch allocates with ``posix_memalign``, whose freed block is too small for the next
request of the same size, so the heap grows by every step's blocks.

PyTorch reads the variable once, at its first CPU allocation (of any size): call
:func:`use_huge_pages` before importing torch (the trainer's entry points do, right
after the config is read), or set ``THP_MEM_ALLOC_ENABLE=1`` in the environment. It
sets the variable only when it is not set (``THP_MEM_ALLOC_ENABLE=0`` keeps a user's
choice); children (data-loader workers) inherit it.

Huge pages make a fresh block cheaper; they do not stop the blocks from being fresh,
and on a virtual machine that reports free memory to its host (virtio-balloon free page
reporting) a block that stayed free for a moment, across a save or a restart, comes
back through the host's page faults. jemalloc keeps freed memory in the process for the
next allocation of its size (``MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1``: never
handed back), so after the first steps a step allocates nothing new from the kernel.
PyTorch's CPU performance guide recommends it for CPU work; it keeps the process's peak
of host memory, which a training node dedicates to its trainer anyway. A process takes
it only when it starts: :func:`ftfleet.hostenv.allocator_env` gives the
variables (``LD_PRELOAD``) for the processes a launcher starts, and
:func:`ftfleet.hostenv.host_memory_env` adds glibc's copy threshold to them, as
the image's entrypoint and the in-process launcher set (``FTFLEET_HOST_ALLOCATOR``,
docs/CONTRACT.md); :func:`active_allocator` says which one a running process has.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from ftfleet.hostenv import is_malloc

log = logging.getLogger("ftfleet.hostmem")

ENV = "THP_MEM_ALLOC_ENABLE"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode(path: Path = THP_MODE) -> str | None:
    """The kernel's THP mode (``always``, ``madvise``, ``never``), None where unknown."""
    try:
        text = path.read_text()
    except OSError:
        return None
    chosen = [word.strip("[]") for word in text.split() if word.startswith("[")]
    return chosen[0] if chosen else None


def use_huge_pages(path: Path = THP_MODE) -> bool:
    """Ask PyTorch's CPU allocator for huge pages (see the module), unless ``THP_MEM_ALLOC_ENABLE``
    is set already. True when they are asked for and the kernel can give them."""
    mode = thp_mode(path)
    if os.environ.get(ENV) is None:
        os.environ[ENV] = "1"
        if "torch" in sys.modules:  # (a user's factory imports it with the config)
            log.debug(
                "host memory: %s=1 set after torch was imported: it holds only if torch has not "
                "allocated CPU memory yet (set it in the environment, or call this before importing torch)",
                ENV,
            )
    asked = os.environ[ENV] == "1"
    if asked and mode == "never":
        log.info("host memory: the kernel's transparent huge pages are off (%s: never); 4 KiB pages", path)
    return asked and mode in ("always", "madvise")


def active_allocator(maps: Path = Path("/proc/self/maps")) -> str:
    """The malloc library this process has loaded (``jemalloc``, ``tcmalloc``,
    ``mimalloc``: :data:`ftfleet.hostenv.MALLOC_LIBRARIES`), else ``glibc``."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:
        return "unknown"
    for line in lines:
        path = line.rsplit(" ", 1)[-1]
        if is_malloc(path):
            return os.path.basename(path)[len("lib") :].split(".")[0]
    return "glibc"
