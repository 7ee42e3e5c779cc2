"""Generated documentation stays in step with its sources."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ftfleet import contract_doc
from ftfleet.infra import reference, settings

ROOT = Path(__file__).resolve().parent.parent


def test_the_config_reference_matches_pulumi_yaml():
    text = (ROOT / "docs" / "CONFIG.md").read_text()
    assert reference.splice(text) == text, "run `make docs`"


def test_contract_doc_matches_the_contract_module():
    assert (ROOT / "docs" / "CONTRACT.md").read_text() == contract_doc.render_markdown(), "run `make docs`"


def test_every_project_key_has_a_description_and_a_type():
    for key, spec in settings.load_schema().items():
        assert spec.get("description"), key
        assert spec.get("type") in ("string", "integer", "boolean", "array"), key
        if spec["type"] == "array":
            assert spec.get("items", {}).get("type") == "string", key


def test_readme_quickstart_names_exactly_the_two_commands_and_ci_runs_the_test_one():
    text = (ROOT / "README.md").read_text()
    quick = text.split("## Quickstart", 1)[1].split("##", 1)[0]
    assert "make demo" in quick and "make test" in quick
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_the_readmes_own_loop_example_is_the_tested_example_file_and_under_40_lines():
    text = (ROOT / "README.md").read_text()
    example = (ROOT / "examples" / "own_loop.py").read_text()
    code = example[example.index('"""', 3) + 3 :].lstrip("\n")
    section = text.split("### Your own training loop", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert block == code, "copy examples/own_loop.py (without its docstring) into the README"
    assert len(code.splitlines()) < 40


def test_the_readme_is_a_front_page_of_at_most_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250, "move detail to a page under docs/"


def test_every_benchmark_section_links_the_raw_results_it_shows_and_each_exists():
    text = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    assert len(text.splitlines()) <= 300, "BENCHMARKS.md shows current results only; older runs live in git"
    sections = text.split("\n## ")[1:]
    for section in sections:
        title = section.splitlines()[0]
        links = re.findall(r"\(\.\./bench/results/([^)]+\.json)\)", section)
        assert title == "Summary" or links, f"section {title!r} names no raw results (bench/results/*.json)"
        for name in links:
            assert (ROOT / "bench" / "results" / name).is_file(), f"{title}: {name} is not in bench/results/"


def test_every_raw_result_says_what_ran_where_when_and_on_which_commit():
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        doc = json.loads(path.read_text())
        assert doc["format"] == "ftfleet-bench/1", path.name
        for key in ("bench", "command", "started_utc", "commit", "machine", "figures"):
            assert doc.get(key), f"{path.name}: no {key}"
        assert path.name.startswith(f"{doc['bench']}-{doc['started_utc'][:10]}-{doc['commit']['short']}"), path.name


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation other than hyphens
    and underscores dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_to_a_section_names_a_heading_that_exists():
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    anchors = {
        p.resolve(): {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", p.read_text(), re.MULTILINE)} for p in pages
    }
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", page.read_text()):
            if target.startswith("http"):
                continue
            linked = (page.parent / target).resolve() if target else page.resolve()
            if linked in anchors and anchor not in anchors[linked]:
                broken.append(f"{page.name}: {target}#{anchor}")
    assert not broken, broken
