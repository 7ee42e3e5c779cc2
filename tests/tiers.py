"""The rule of the fast tier: a test not marked ``integration`` launches no Python
process, no shell script and no server process.

:func:`guard` wraps each test (setup, call and teardown, so a fixture's server process
counts too). When ``FTFLEET_TEST_TIER`` is ``fast`` and the test is not marked
``integration``, launching one raises :class:`LaunchInUnitTest` naming the test and the
marker it lacks. What costs is a Python process (an interpreter that imports torch, a
trainer, torchrun, a multiprocessing child, the image's entrypoint) and a shell script
run for real (a boot script against its stubs forks a process per command). Single
tools (shellcheck, the dynamic loader's ``--list-tunables``) are part of unit tests.
Otherwise nothing changes.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import re
import subprocess
from collections.abc import Iterator
from typing import Any

MARKER = "integration"
ENV = "FTFLEET_TEST_TIER"
#: Programs whose launch makes a test an integration test, matched against the basename
#: of every word of the command line (a ``nice``, ``setpriv`` or shell prefix included).
LAUNCHES = re.compile(r"^(python[0-9.]*|torchrun|docker-entrypoint|gcs-emulator|fake[-_]gcs[-_]server.*)$")
#: Shells: a launch when they are the program run (not a word such as ``--shell bash``).
SHELLS = re.compile(r"^(bash|sh|dash)$")


class LaunchInUnitTest(RuntimeError):
    """A unit test (no ``integration`` marker) started a process under the fast tier."""


_current: list[str] = []  # the node id of the unit test being guarded, when there is one
_installed = False


def _refuse(what: str) -> None:
    if _current:
        raise LaunchInUnitTest(
            f"{_current[-1]} starts a process ({what}) but is not marked {MARKER}: "
            f"add @pytest.mark.{MARKER} (or pytestmark in its file), or keep it in-process"
        )


def _install() -> None:
    """Wrap the two ways a test's code starts a child: subprocess and multiprocessing."""
    global _installed
    if _installed:
        return
    _installed = True
    execute = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    start = multiprocessing.process.BaseProcess.start

    def execute_child(self: Any, args: Any, *rest: Any, **kwargs: Any) -> Any:
        words = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
        names = [os.path.basename(os.fsdecode(w)) for w in words]
        if any(LAUNCHES.match(n) for n in names) or (names and SHELLS.match(names[0])):
            _refuse(f"subprocess {args!r:.80}")
        return execute(self, args, *rest, **kwargs)

    def start_process(self: Any) -> Any:
        _refuse(f"multiprocessing {self.name}")
        return start(self)

    subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]
    multiprocessing.process.BaseProcess.start = start_process  # type: ignore[method-assign]


@contextlib.contextmanager
def guard(item: Any) -> Iterator[None]:
    """Apply the fast tier's rule to ``item`` (a pytest item) while the block runs."""
    if os.environ.get(ENV) != "fast" or item.get_closest_marker(MARKER) is not None:
        yield
        return
    _install()
    _current.append(item.nodeid)
    try:
        yield
    finally:
        _current.pop()
