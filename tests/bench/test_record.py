"""Every benchmark writes its raw results as JSON (bench/record.py): what ran, where, when,
on which commit, and the figures; the fast modes of the scripts that have one, run here
(integration: each starts a Python process)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import record

REPO = Path(__file__).resolve().parents[2]
FIELDS = {"format", "bench", "command", "started_utc", "finished_utc", "commit", "machine", "env", "figures"}


def args_for(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    record.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_run_is_recorded_under_its_name_date_and_commit_with_machine_and_figures(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    path = record.write("demo", {"blocked_s": 0.5}, args_for())
    short = record.AT_START["short"]
    assert path == tmp_path / f"demo-{record.STARTED:%Y-%m-%d}-{short}.json"
    doc = json.loads(path.read_text())
    assert set(doc) == FIELDS and doc["format"] == "ftfleet-bench/1"
    assert doc["figures"] == {"blocked_s": 0.5}
    assert doc["commit"]["full"].startswith(short) and isinstance(doc["commit"]["changed"], list)
    assert {"uname", "cores", "cpu_model", "torch", "load_average_at_start", "load_average"} <= set(doc["machine"])
    assert doc["machine"]["cores"] == os.cpu_count()


def test_the_commit_recorded_is_the_one_checked_out_when_the_run_started(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    monkeypatch.setattr(record, "commit", lambda: {"short": "0000000", "full": "0" * 40, "changed": []})
    doc = json.loads(record.write("demo", {}, args_for()).read_text())
    assert doc["commit"] == record.AT_START != record.commit()


def test_the_changed_paths_are_whole_paths(monkeypatch):
    monkeypatch.setattr(
        record, "_git", lambda *a: " M bench/record.py\n?? docs/NEW.md" if a[0] == "status" else "ab" * 20
    )
    assert record.commit() == {
        "short": "ababab" + "a",
        "full": "ab" * 20,
        "changed": ["bench/record.py", "docs/NEW.md"],
    }


def test_a_second_run_of_the_same_day_and_commit_gets_a_file_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "RESULTS", tmp_path)
    first = record.write("demo", {"n": 1}, args_for())
    second = record.write("demo", {"n": 2}, args_for())
    assert second == first.with_name(first.stem + "-2.json")
    assert json.loads(first.read_text())["figures"] == {"n": 1}


def test_json_names_the_file_and_no_json_writes_none(tmp_path, monkeypatch):
    monkeypatch.setattr(record, "RESULTS", tmp_path / "results")
    assert record.write("demo", {}, args_for("--json", str(tmp_path / "x.json"))) == tmp_path / "x.json"
    assert record.write("demo", {}, args_for("--no-json")) is None
    assert not (tmp_path / "results").exists()


def test_under_torchrun_the_command_is_the_torchrun_line():
    env = {"TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": "2"}
    line = record.command_line(["/usr/bin/python3", "-u", "bench/build_bench.py", "--repeats", "5"], env)
    assert line == "torchrun --standalone --nproc-per-node=2 bench/build_bench.py --repeats 5"
    assert record.command_line(["python", "bench/x.py", "a b"], {}) == "python bench/x.py 'a b'"


@pytest.mark.integration
def test_a_command_with_a_report_of_its_own_is_recorded_with_its_exit_code(tmp_path):
    out = tmp_path / "drill.json"
    writer = "import json, sys; json.dump({'goodput': 0.25}, open(sys.argv[1], 'w')); sys.exit(3)"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "record.py"), "drill", "--json", str(out), "--", sys.executable]
        + ["-c", writer, "{json}"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 3, done.stderr
    doc = json.loads(out.read_text())
    assert doc["bench"] == "drill" and doc["figures"] == {"goodput": 0.25} and doc["exit_code"] == 3
    assert "bench/record.py drill" in doc["command"]


@pytest.mark.integration
def test_a_report_named_by_a_variable_is_recorded_and_a_missing_one_is_not(tmp_path):
    out = tmp_path / "chaos.json"
    writer = "import json, os; json.dump({'kills': []}, open(os.environ['REPORT'], 'w'))"
    cmd = [sys.executable, str(REPO / "bench" / "record.py"), "chaos", "--env", "REPORT", "--json", str(out), "--"]
    assert subprocess.run([*cmd, sys.executable, "-c", writer], capture_output=True).returncode == 0
    assert json.loads(out.read_text())["figures"] == {"kills": []}
    out.unlink()
    done = subprocess.run([*cmd, sys.executable, "-c", "pass"], capture_output=True, text=True)
    assert done.returncode == 1 and "wrote no report" in done.stderr and not out.exists()


FAST = {
    "writer": (["bench/writer_bench.py", "--mb", "2", "--repeats", "1", "--idle", "0"], "writers"),
    "restore": (
        ["bench/restore_bench.py", "--repeats", "1", "--d-model", "32", "--layers", "1", "--vocab", "64"],
        "paths",
    ),
    "checkpoint": (
        ["bench/checkpoint_bench.py", "--repeats", "1", "--d-model", "32", "--layers", "1", "--vocab", "64"],
        "methods",
    ),
    "hostmem-files": (["bench/hostmem_bench.py", "--files", "/dev/shm", "--mb", "1", "--repeats", "1"], "file_systems"),
}


@pytest.mark.integration
@pytest.mark.parametrize("bench", sorted(FAST))
def test_the_fast_mode_of_a_benchmark_writes_its_figures(bench, tmp_path):
    argv, key = FAST[bench]
    out = tmp_path / "r.json"
    extra = ["--dir", str(tmp_path / "d")] if bench in ("restore", "checkpoint", "writer") else []
    done = subprocess.run(
        [sys.executable, *argv, *extra, "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["bench"] == bench and doc["figures"][key]
    assert doc["command"].split()[1:3] == argv[:2]
