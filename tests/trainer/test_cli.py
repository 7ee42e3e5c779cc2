"""`ftfleet ckpt list|verify|inspect TARGET` on directories and buckets."""

from __future__ import annotations

import json

from ftfleet.cli import main
from tests.trainer.conftest import copy_steps
from tests.trainer.test_corruption import flip_bit, shard


def run(capsys, *argv):
    rc = main(["ckpt", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_list_shows_steps_sizes_and_world_size(tmp_path, ref2, capsys):
    root = copy_steps(ref2["run_dir"] / "checkpoints", tmp_path / "ck", [16, 20, 24])
    (root / "step-28").mkdir()  # an interrupted save
    rc, out, _ = run(capsys, "list", root, "--json")
    rows = {r["step"]: r for r in json.loads(out)}
    assert rc == 0
    assert [rows[s]["status"] for s in (16, 20, 24, 28)] == ["ok (sizes)"] * 3 + ["uncommitted"]
    assert rows[24]["world_size"] == 2 and rows[24]["bytes"] > 0 and rows[24]["files"] == 5


def test_verify_passes_a_good_tree_and_fails_naming_the_bad_file(tmp_path, ref1, capsys):
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [22, 24])
    assert run(capsys, "verify", root)[0] == 0
    bad = shard(root / "step-22")
    flip_bit(bad)
    rc, out, err = run(capsys, "verify", root)
    assert rc == 1
    assert f"{bad.name}: crc32c" in out and "CORRUPT" in out and "1 corrupt" in err
    # A truncation is caught even by the quick size check of `list`.
    bad.write_bytes(bad.read_bytes()[:-1])
    assert run(capsys, "list", root)[0] == 1
    # A single step directory is a valid target too.
    assert run(capsys, "verify", root / "step-24")[0] == 0


def test_inspect_reads_the_state_hash_the_trainer_reported(ref1, capsys):
    rc, out, _ = run(capsys, "inspect", ref1["run_dir"] / "checkpoints", "--tensors", "--json")
    info = json.loads(out)
    assert rc == 0 and info["step"] == 24 and info["verified"]
    assert info["state_sha256"] == ref1["state_sha256"]
    assert info["progress"] == {"step": 24, "samples_seen": 144}
    assert any(k.startswith("rng_rank0.torch") for k in info["entries"])


def test_missing_target_is_a_one_line_user_error(tmp_path, capsys):
    rc, _, err = run(capsys, "list", tmp_path / "nope")
    assert rc == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1


def test_ckpt_cli_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from ftfleet.cli import main; main(['ckpt', 'list', '.']);"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip().splitlines()[-1] == "False"
