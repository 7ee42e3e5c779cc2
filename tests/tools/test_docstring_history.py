"""``make lint``'s docstring check finds history and passes contracts."""

from __future__ import annotations

import textwrap

from tests.tools import docstring_history


def _findings(tmp_path, source: str) -> list[str]:
    path = tmp_path / "mod.py"
    path.write_text(textwrap.dedent(source))
    return list(docstring_history.findings(path))


def test_a_date_a_benchmark_log_reference_and_a_machine_timing_are_each_found(tmp_path):
    found = _findings(
        tmp_path,
        '''
        """A module (2026-11-26)."""

        class C:
            """Faster than before (docs/BENCHMARKS.md, "Host memory")."""

            def f(self):
                """It took 0.2 s on the 2-core machine."""
        ''',
    )
    assert [line.split(": ", 1)[1].split(" in a docstring")[0] for line in found] == [
        "a date",
        "a reference to the benchmark log",
        "a measurement on some machine",
    ]
    assert found[0].startswith(f"{tmp_path / 'mod.py'}:2:")


def test_a_finding_names_the_line_of_the_offending_text(tmp_path):
    (line,) = _findings(tmp_path, '"""First line.\n\nThird line, measured on a laptop.\n"""\n')
    assert ":3: a measurement on some machine" in line


def test_contracts_comments_and_strings_pass(tmp_path):
    assert not _findings(
        tmp_path,
        '''
        """Waits at most ``timeout_s`` seconds; raises TimeoutError after that."""

        # 2026-11-26: comments are not docstrings
        MESSAGE = "see docs/BENCHMARKS.md"
        ''',
    )
