"""``make lint``'s check that docstrings state contracts, not history.

A docstring says what holds now; how it was reached (a date, a figure measured on some
machine, what an earlier version cost, a pointer into the benchmark log) belongs in a
commit message or in a benchmark's results. This check fails on such text in any
docstring of the project's Python (modules, classes, functions), and prints one line
per finding: ``path:line: what (the text)``. A design motivated by a number names the
benchmark script (``bench/...``), not a page of results.

Usage: ``python -m tests.tools.docstring_history [PATH ...]`` (default: the project's
code folders); exit 1 when anything is found.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The folders whose Python is checked (the tests are specifications and may name dates).
FOLDERS = ("ftfleet", "trainer", "infra", "lambdas", "drill", "bench", "policy", "examples")

#: (what, pattern) pairs; each pattern is searched in a docstring's text.
RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a date", re.compile(r"\b(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b")),
    (
        "a date",
        re.compile(
            r"\b(?:January|February|March|April|May|June|July|August|September|October|November|December)"
            r"\s+(?:\d{1,2},?\s+)?(?:19|20)\d\d\b"
        ),
    ),
    ("a reference to the benchmark log", re.compile(r"BENCHMARKS(?:\.md)?")),
    ("a measurement on some machine", re.compile(r"\b(?:measured|timed) (?:on|here)\b|\bon this machine\b", re.I)),
    ("a measurement on some machine", re.compile(r"\b(?:the )?(?:test|2-core|CI|build) machine'?s?\b", re.I)),
    ("version history", re.compile(r"\b(?:the first version|an earlier version|used to (?:be|cost|take))\b", re.I)),
)


def docstrings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring in ``tree``: the module's, each class's and function's."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                value = body[0].value.value
                if isinstance(value, str):
                    yield body[0].lineno, value


def findings(path: Path) -> Iterator[str]:
    """One line per rule a docstring of ``path`` breaks."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as exc:
        yield f"{path}: cannot parse ({type(exc).__name__}: {exc})"
        return
    for line, text in docstrings(tree):
        for what, pattern in RULES:
            match = pattern.search(text)
            if match:
                at = line + text[: match.start()].count("\n")
                yield f"{path}:{at}: {what} in a docstring ({match.group(0)!r}); say what holds now"


def python_files(paths: list[Path]) -> Iterator[Path]:
    for path in paths:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.py") if ".venv" not in p.parts)
        elif path.suffix == ".py":
            yield path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    paths = [Path(a) for a in argv] or [ROOT / f for f in FOLDERS if (ROOT / f).exists()]
    found = [line for path in python_files(paths) for line in findings(path)]
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} docstring(s) carry history: move it to the commit message or the benchmark results")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
