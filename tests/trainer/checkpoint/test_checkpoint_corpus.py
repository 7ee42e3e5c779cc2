"""A corpus of damaged checkpoints and hostile names: the trainer's restore skips each
bad one with one log line and takes the previous checkpoint, and ``ftfleet ckpt
verify`` reports instead of crashing.

Every case starts from the same tier (two good checkpoints, steps 3 and 5, saved by
the real CheckpointManager) and damages it. ``DAMAGED`` spoils step 5: restore must
come back with step 3, and name step 5 in exactly one warning. ``JUNK`` adds names
and files next to the checkpoints that only look like one: restore must still take
step 5.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ftfleet.cli import main
from ftfleet.trainer.checkpoint.manifest import checksum_file, read_manifest, write_manifest
from tests.trainer.conftest import in_process_manager

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A tier with steps 3 and 5, as the manager wrote them."""
    root = tmp_path_factory.mktemp("corpus") / "ck"
    mgr = in_process_manager(root)
    for step in (3, 5):
        mgr.app_state.progress.step = step
        mgr.save(step, blocking=True)
    mgr.close()
    return root


def shard(d: Path) -> Path:
    return sorted(d.glob("*.distcp"))[0]


def manifest_json(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def write_json(d: Path, doc: object) -> None:
    (d / "manifest.json").write_text(json.dumps(doc))


def edit_manifest(change: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(d: Path) -> None:
        doc = manifest_json(d)
        change(doc)
        write_json(d, doc)

    return apply


def replace_and_relist(name_of: Callable[[Path], Path], data: bytes) -> Callable[[Path], None]:
    """Replace a file and list its new size and CRC in the manifest: what a writer that
    can write the bucket (or a bug that wrote the wrong bytes) leaves behind. Only
    loading it can tell."""

    def apply(d: Path) -> None:
        path = name_of(d)
        path.write_bytes(data)
        manifest = read_manifest(d)
        manifest.files[path.name] = checksum_file(path)
        write_manifest(d, manifest)

    return apply


class Gadget:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def flip(path: Path, at: int = 200) -> None:
    raw = bytearray(path.read_bytes())
    raw[at % len(raw)] ^= 0x10
    path.write_bytes(raw)


def first_entry(doc: dict) -> dict:
    return doc["files"][sorted(doc["files"])[0]]


def rename_entry(new: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        name = sorted(doc["files"])[0]
        doc["files"][new] = doc["files"].pop(name)

    return change


#: Damage done to step 5; restore takes step 3.
DAMAGED: dict[str, Callable[[Path], object]] = {
    "bit flip in a shard": lambda d: flip(shard(d)),
    "truncated shard": lambda d: shard(d).write_bytes(shard(d).read_bytes()[:-9]),
    "missing shard": lambda d: shard(d).unlink(),
    "bit flip in .metadata": lambda d: flip(d / ".metadata", 40),
    "metadata the safe unpickler refuses, relisted": replace_and_relist(
        lambda d: d / ".metadata", pickle.dumps(Gadget())
    ),
    "metadata that is no pickle, relisted": replace_and_relist(lambda d: d / ".metadata", b"\x00not a pickle" * 10),
    "metadata cut short, relisted": replace_and_relist(lambda d: d / ".metadata", b"\x80\x04\x95"),
    "shard that is no torch file, relisted": replace_and_relist(shard, b"PK\x03\x04" + b"\xff" * 4000),
    "manifest not JSON": lambda d: (d / "manifest.json").write_text('{"format": "ftfl'),
    "manifest nested past the parser": lambda d: (d / "manifest.json").write_text("[" * 100_000),
    "manifest not UTF-8": lambda d: (d / "manifest.json").write_bytes(b"\xff\xfe{\x00}"),
    "manifest empty": lambda d: (d / "manifest.json").write_bytes(b""),
    "manifest a JSON list": lambda d: write_json(d, [manifest_json(d)]),
    "manifest a directory": lambda d: ((d / "manifest.json").unlink(), (d / "manifest.json").mkdir()),
    "size past a float": lambda d: (d / "manifest.json").write_text(
        (d / "manifest.json").read_text().replace('"size": ', '"size": 1e999, "was": ', 1)
    ),
    "created_at an integer past a float": edit_manifest(lambda m: m.update(created_at=10**400)),
    "created_at not a number": edit_manifest(lambda m: m.update(created_at="yesterday")),
    "step past int64": edit_manifest(lambda m: m.update(step=10**30)),
    "manifest of another step": edit_manifest(lambda m: m.update(step=7)),
    "negative size": edit_manifest(lambda m: first_entry(m).update(size=-1)),
    "size a boolean": edit_manifest(lambda m: first_entry(m).update(size=True)),
    "crc not hex": edit_manifest(lambda m: first_entry(m).update(crc32c="zzzzzzzz")),
    "lists no files": edit_manifest(lambda m: m.update(files={})),
    "file name out of the directory": edit_manifest(rename_entry("../../escape")),
    "file name past 255 bytes": edit_manifest(rename_entry("x" * 300)),
    "file name of a lone surrogate": edit_manifest(rename_entry("\ud800")),
    "listed file is a directory": lambda d: shard_dir(d),
    "world size 0": edit_manifest(lambda m: m.update(world_size=0)),
}


def shard_dir(d: Path) -> None:
    name = sorted(manifest_json(d)["files"])[0]
    (d / name).unlink(missing_ok=True)
    (d / name).mkdir()


#: Names beside the checkpoints that only look like one; restore takes step 5.
JUNK: dict[str, Callable[[Path], object]] = {
    "superscript digit": lambda root: shutil.copytree(root / "step-5", root / "step-\u00b2"),
    "Arabic-Indic digits": lambda root: shutil.copytree(root / "step-5", root / "step-\u0661\u0662"),
    "zero padding": lambda root: shutil.copytree(root / "step-5", root / "step-007"),
    "200 digits": lambda root: (root / ("step-" + "9" * 200)).mkdir(),
    "a file named like a step": lambda root: (root / "step-9").write_text("not a directory"),
    "a manifest that is a dangling link": lambda root: (
        (root / "step-11").mkdir(),
        (root / "step-11" / "manifest.json").symlink_to(root / "nowhere"),
    ),
    "a step directory of non-UTF-8 bytes": lambda root: os.mkdir(os.fsencode(root) + b"/step-\xff\xfe"),
}


def tier(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "ck"
    shutil.copytree(pristine, root, symlinks=True)
    return root


def restore(root: Path, caplog) -> tuple[int | None, list[str]]:
    mgr = in_process_manager(root)
    try:
        with caplog.at_level(logging.WARNING, logger="ftfleet.ckpt"):
            found = mgr.restore()
    finally:
        mgr.close()
    # ftfleet's own lines (DCP logs its exception too, at ERROR, on its own logger).
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("ftfleet")]
    return (found.step if found else None), warnings


def verify(root: Path, capsys) -> tuple[int, str]:
    rc = main(["ckpt", "verify", str(root)])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_the_corpus_is_large_enough():
    assert len(DAMAGED) >= 20 and len(DAMAGED) + len(JUNK) >= 30


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_newest_checkpoint_is_skipped_in_one_line_and_the_previous_restored(pristine, tmp_path, caplog, case):
    root = tier(pristine, tmp_path)
    DAMAGED[case](root / "step-5")
    step, warnings = restore(root, caplog)
    assert step == 3, warnings
    about = [w for w in warnings if "step-5" in w]
    assert len(about) == 1 and "\n" not in about[0] and "skipping" in about[0], warnings


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_verify_reports_a_damaged_checkpoint_without_crashing(pristine, tmp_path, capsys, case):
    root = tier(pristine, tmp_path)
    DAMAGED[case](root / "step-5")
    rc, text = verify(root, capsys)
    # The bytes of a relisted file match the manifest: only loading can tell them apart.
    assert rc == (0 if "relisted" in case else 1), text
    assert "Traceback" not in text


@pytest.mark.parametrize("case", sorted(JUNK))
def test_names_that_only_look_like_a_checkpoint_are_passed_over(pristine, tmp_path, caplog, capsys, case):
    root = tier(pristine, tmp_path)
    JUNK[case](root)
    step, warnings = restore(root, caplog)
    assert step == 5, warnings
    rc, text = verify(root, capsys)
    assert rc == 0 and "Traceback" not in text, text
    rows = {line.split()[0]: line.split()[1] for line in text.splitlines()[1:] if line[:10].strip().isdigit()}
    assert {step: status for step, status in rows.items() if status != "uncommitted"} == {"3": "ok", "5": "ok"}, text
