"""Nothing is unpickled from a checkpoint beyond DCP's metadata classes (allowlist) and
torch.load(weights_only=True); a checkpoint of another run or config is refused."""

from __future__ import annotations

import os
import pickle
import struct

import pytest

from ftfleet.trainer.checkpoint.comm import LocalComm
from ftfleet.trainer.checkpoint.manifest import checksum_file, read_manifest, write_manifest
from ftfleet.trainer.checkpoint.restore import CheckpointRefused, Identity, find_and_prepare
from ftfleet.trainer.checkpoint.safe_load import (
    CheckpointLoadError,
    UnsafeCheckpointError,
    load_into,
    load_offline,
    read_metadata_file,
)
from ftfleet.trainer.checkpoint.tiers import LocalTier
from tests.trainer.conftest import copy_steps


class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_metadata_with_a_code_gadget_is_refused_even_with_a_matching_manifest(tmp_path, ref1):
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [24])
    step_dir = root / "step-24"
    marker = tmp_path / "pwned"
    (step_dir / ".metadata").write_bytes(pickle.dumps(Payload(str(marker))))
    # An attacker who can write the bucket can also rewrite the manifest.
    manifest = read_manifest(step_dir)
    manifest.files[".metadata"] = checksum_file(step_dir / ".metadata")
    write_manifest(step_dir, manifest)
    with pytest.raises(UnsafeCheckpointError, match=r"io\.open.*refusing"):
        read_metadata_file(step_dir / ".metadata")
    with pytest.raises(CheckpointLoadError, match="refusing to unpickle"):
        load_offline(step_dir)
    assert not marker.exists()


def dotted_global_call(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 pickle of ``module.<name>(arg)``: STACK_GLOBAL resolves a dotted name
    attribute by attribute, so an allowed module leads to whatever it imports."""

    def text(value: str) -> bytes:
        raw = value.encode()
        return pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw

    return (
        pickle.PROTO
        + b"\x04"
        + text(module)
        + text(name)
        + pickle.STACK_GLOBAL
        + text(arg)
        + pickle.TUPLE1
        + pickle.REDUCE
        + pickle.STOP
    )


@pytest.mark.parametrize("name", ["os.mkdir", "torch.os.mkdir"])
def test_metadata_reaching_through_dcp_metadata_module_by_dotted_name_is_refused(tmp_path, ref1, name):
    """torch.distributed.checkpoint.metadata imports os and torch; the restore path
    (load_into) must not let a dotted name walk from it to os.mkdir."""
    import torch

    step_dir = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [24]) / "step-24"
    marker = tmp_path / "pwned"
    (step_dir / ".metadata").write_bytes(dotted_global_call("torch.distributed.checkpoint.metadata", name, str(marker)))
    with pytest.raises(CheckpointLoadError, match="refusing to unpickle"):
        load_into({"app": {"progress": {"step": torch.tensor(0)}}}, step_dir)
    assert not marker.exists()


def test_non_tensor_entries_are_loaded_weights_only(tmp_path):
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "pwned"
    dcp.save({"evil": Payload(str(marker)), "ok": 3}, checkpoint_id=tmp_path / "ck", no_dist=True)
    marker.unlink(missing_ok=True)  # saving pickled it; make sure only a load could recreate it
    with pytest.raises(CheckpointLoadError, match="(?i)weights_only|unpickl"):
        load_offline(tmp_path / "ck")
    assert not marker.exists()
    assert load_offline(tmp_path / "ck", keys={"ok"}) == {"ok": 3}


@pytest.mark.parametrize("field", ["run_id", "config_hash"])
def test_a_checkpoint_of_another_run_or_config_is_refused_unless_forced(tmp_path, ref1, field):
    root = copy_steps(ref1["run_dir"] / "checkpoints", tmp_path / "ck", [22, 24])
    m = read_manifest(root / "step-24")
    mine = Identity(
        "other-run" if field == "run_id" else m.run_id, "0123456789abcdef" if field == "config_hash" else m.config_hash
    )
    with pytest.raises(CheckpointRefused) as err:
        find_and_prepare(LocalComm(), LocalTier(root), [], mine)
    msg = str(err.value)
    assert field.replace("_", " ") in msg.replace("_", " ") and "checkpoint.force_load=true" in msg
    assert "\n" not in msg and err.value.exit_code == 2
    forced = find_and_prepare(LocalComm(), LocalTier(root), [], mine, force=True)
    assert forced.step == 24
    assert os.path.exists(root / "step-24" / "manifest.json")
