"""The raw results of a benchmark run, as one JSON file under ``bench/results/``: what ran
(the command line), where (the machine), when (UTC), on which code (the commit, and the
paths where the tree differed from it) and the figures. A figure quoted in the docs
without its record is a figure nobody can check.

Every script under ``bench/`` calls :func:`add_arguments` on its parser and :func:`write`
with its figures. The default file is ``bench/results/<bench>-<UTC date>-<commit>.json``
(``-2``, ``-3``, ... when that exists); ``--json PATH`` writes elsewhere, ``--no-json``
writes nothing.

A command that writes a JSON report of its own is recorded the same way::

    python bench/record.py drill -- .venv/bin/python -m drill --json {json}
    python bench/record.py chaos --env FTFLEET_CHAOS_REPORT -- .venv/bin/python -m pytest -m chaos ...

``{json}`` in the command, or the variable ``--env`` names, is the file the command
writes; its content becomes the record's ``figures``. The command's exit code is the
wrapper's; a command that wrote no JSON is recorded nowhere.

This module imports nothing beyond the standard library, so a script may import it
before torch.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
FORMAT = "ftfleet-bench/1"
STARTED = datetime.datetime.now(datetime.UTC)

#: Variables that change what a benchmark measures (the host allocator, glibc's copy
#: threshold, huge pages, threads); recorded when set.
ENV_KEYS = (
    "FTFLEET_HOST_ALLOCATOR",
    "LD_PRELOAD",
    "MALLOC_CONF",
    "GLIBC_TUNABLES",
    "THP_MEM_ALLOC_ENABLE",
    "OMP_NUM_THREADS",
    "FTFLEET_SHM_DIR",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json PATH`` and ``--no-json`` on a benchmark's command line."""
    group = parser.add_argument_group("raw results")
    group.add_argument(
        "--json",
        type=Path,
        default=None,
        metavar="PATH",
        help="write the raw results here (default: bench/results/<bench>-<UTC date>-<commit>.json)",
    )
    group.add_argument("--no-json", action="store_true", help="write no JSON of the results")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.rstrip("\n") if out.returncode == 0 else None


def commit() -> dict[str, Any]:
    """The checked-out commit and the paths where the tree differs from it (the results
    directory left out). ``short`` is ``unknown`` outside a git checkout."""
    full = (_git("rev-parse", "HEAD") or "").strip() or None
    status = _git("status", "--porcelain", "--", ".", ":(exclude)bench/results")
    changed = [line[3:] for line in (status or "").splitlines() if line.strip()]
    return {"short": full[:7] if full else "unknown", "full": full, "changed": changed}


#: The code a run measures is the code at its start: a commit made while it runs (a
#: long benchmark) must not be recorded as the one it ran.
AT_START = commit()
#: The load average when the run started (the machine's other work); ``machine()``
#: adds the one at its end.
LOAD_AT_START = [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """Where the run happened: ``uname`` (without the host name), cores, CPU model,
    memory, the load average at the start and now (1, 5 and 15 minutes), Python, torch,
    and the GPU when torch has one."""
    u = platform.uname()
    info: dict[str, Any] = {
        "uname": f"{u.system} {u.release} {u.version} {u.machine}",
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "load_average_at_start": LOAD_AT_START,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": _version("torch"),
    }
    torch = sys.modules.get("torch")  # only if the benchmark imported it
    if torch is not None and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def command_line(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The command that started this run, as one shell line. Under torchrun (its workers
    are started as ``python -u SCRIPT ...``) the torchrun command it came from."""
    argv = list(sys.orig_argv if argv is None else argv)
    environ = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in environ and "LOCAL_WORLD_SIZE" in environ:
        rest = [a for a in argv[1:] if a != "-u"]
        return shlex.join(["torchrun", "--standalone", f"--nproc-per-node={environ['LOCAL_WORLD_SIZE']}", *rest])
    exe = argv[0]
    try:  # .venv/bin/python, not the interpreter it links to
        exe = str(Path(os.path.abspath(exe)).relative_to(REPO)) if os.path.isabs(exe) else exe
    except ValueError:
        pass
    return shlex.join([exe, *argv[1:]])


def default_path(bench: str, short: str, results: Path | None = None) -> Path:
    """``<results>/<bench>-<UTC date>-<short>.json``, or the first free ``-N`` beside it."""
    results = RESULTS if results is None else results
    stem = f"{bench}-{STARTED:%Y-%m-%d}-{short}"
    path, n = results / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = results / f"{stem}-{n}.json"
    return path


def document(bench: str, figures: Any, *, command: str | None = None) -> dict[str, Any]:
    """The record of one run: its figures, the command, the machine, the commit."""
    return {
        "format": FORMAT,
        "bench": bench,
        "command": command if command is not None else command_line(),
        "started_utc": STARTED.isoformat(timespec="seconds"),
        "finished_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": AT_START,
        "machine": machine(),
        "env": {k: os.environ[k] for k in ENV_KEYS if k in os.environ},
        "figures": figures,
    }


def save(doc: dict[str, Any], path: Path | None = None) -> Path:
    """Write ``doc`` to ``path`` (default: :func:`default_path`) whole or not at all."""
    path = default_path(doc["bench"], doc["commit"]["short"]) if path is None else path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    print(f"raw results: {path}", file=sys.stderr, flush=True)
    return path


def write(bench: str, figures: Any, args: argparse.Namespace) -> Path | None:
    """Record this run's ``figures`` as ``args`` (:func:`add_arguments`) ask; the path."""
    if args.no_json:
        return None
    return save(document(bench, figures), args.json)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench", help="the record's name (the file's first part), e.g. drill")
    parser.add_argument("--env", metavar="VAR", help="pass the report's path in this variable, not as {json}")
    add_arguments(parser)
    parser.usage = "%(prog)s BENCH [--env VAR] [--json PATH | --no-json] -- COMMAND ..."
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        parser.error("give the command after --")
    cut = argv.index("--")
    args, cmd = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    if not cmd:
        parser.error("give the command after --")
    if not args.env and not any("{json}" in a for a in cmd):
        parser.error("the command must name its report as {json}, or give --env VAR")
    with tempfile.TemporaryDirectory(prefix="ftfleet-record-") as tmp:
        report = Path(tmp) / "report.json"
        environ = {**os.environ, **({args.env: str(report)} if args.env else {})}
        code = subprocess.run([a.replace("{json}", str(report)) for a in cmd], env=environ).returncode
        if not report.exists():
            print(f"error: the command (exit {code}) wrote no report; nothing recorded", file=sys.stderr)
            return code or 1
        figures = json.loads(report.read_text())
    doc = document(args.bench, figures)
    doc["exit_code"] = code
    if not args.no_json:
        save(doc, args.json)
    return code


if __name__ == "__main__":
    sys.exit(main())
