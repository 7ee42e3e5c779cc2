"""Incremental checkpoints (checkpoint.incremental): what is not written again, that a
restore through references is bit-identical, and that nothing deletes a referenced file."""

from __future__ import annotations

import json
import random
import shutil
import time

import pytest
import torch

from ftfleet import retention as core
from ftfleet.cli import main as ftfleet
from ftfleet.trainer.checkpoint.incremental import WHOLE_BYTES, fingerprint
from ftfleet.trainer.checkpoint.manifest import FileEntry, Manifest, ManifestError, read_manifest
from ftfleet.trainer.checkpoint.state import checkpoint_state, state_sha256
from tests.trainer.conftest import in_process_manager

INCREMENTAL = ("checkpoint.incremental=true", "checkpoint.async_save=false")


def frozen(mgr, trainable: int = 2) -> list[torch.nn.Parameter]:
    """Freeze all but the last ``trainable`` parameters (a fine-tuning setup); returns
    the trainable ones."""
    params = list(mgr.app_state.model.parameters())
    for p in params[:-trainable]:
        p.requires_grad_(False)
    return params[-trainable:]


def train_and_save(mgr, steps, params) -> list[Manifest]:
    out = []
    for step in steps:
        with torch.no_grad():
            for p in params:
                p.add_(0.01 * step)
        mgr.app_state.progress.step = step
        out.append(mgr.save(step, blocking=True))
    return out


def sha(mgr) -> str:
    return state_sha256(checkpoint_state(mgr.app_state.state_dict()))


def fresh(root, *overrides):
    mgr = in_process_manager(root, *INCREMENTAL, *overrides)
    frozen(mgr)
    return mgr


def test_a_frozen_base_is_written_once_and_restores_bit_identical(tmp_path, capsys):
    root = tmp_path / "ckpt"
    mgr = fresh(root)
    trainable = list(mgr.app_state.model.parameters())[-2:]
    frozen_share = 1 - sum(p.numel() for p in trainable) / sum(p.numel() for p in mgr.app_state.model.parameters())
    assert frozen_share >= 0.8
    first, second, third = train_and_save(mgr, [1, 2, 3], trainable)
    expected = sha(mgr)
    mgr.close()

    assert not first.references and first.reused_bytes == 0
    for m in (second, third):
        assert 1 in m.references and m.total_bytes <= 0.25 * (m.total_bytes + m.reused_bytes)
        for step, files in m.references.items():  # the checkpoint that wrote the bytes, never a chain
            assert files.items() <= read_manifest(root / f"step-{step}").files.items()
    on_disk = json.loads((root / "step-3" / "manifest.json").read_text())
    assert on_disk["format"] == "ftfleet-checkpoint/2" and "1" in on_disk["references"]

    again = fresh(root)
    restored = again.restore()
    assert restored.step == 3 and sha(again) == expected
    again.close()

    assert ftfleet(["ckpt", "verify", str(root)]) == 0
    # A self-contained copy: no references, and it restores alone.
    assert ftfleet(["ckpt", "export", str(root), "3", "--to", "checkpoint", "-o", str(tmp_path / "copy")]) == 0
    copy = read_manifest(tmp_path / "copy" / "step-3")
    assert not copy.references and copy.total_bytes > third.total_bytes
    alone = fresh(tmp_path / "copy")
    assert alone.restore().step == 3 and sha(alone) == expected
    alone.close()
    assert ftfleet(["ckpt", "verify", str(tmp_path / "copy")]) == 0
    # A referenced file that rots is the referencing checkpoint's problem too.
    shard = sorted((root / "step-1").glob("__0_*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert ftfleet(["ckpt", "verify", str(root / "step-3"), "--json"]) == 1
    (row,) = json.loads(capsys.readouterr().out)
    assert any(p.startswith(f"../step-1/{shard.name}: crc32c") for p in row["problems"]), row


def test_a_tensor_whose_sample_matches_but_whose_bytes_differ_is_written(tmp_path):
    root = tmp_path / "ckpt"
    mgr = fresh(root)
    trainable = list(mgr.app_state.model.parameters())[-2:]
    big = max(mgr.app_state.model.parameters(), key=lambda p: p.numel())
    assert big.numel() * big.element_size() >= 4 * WHOLE_BYTES and not big.requires_grad
    train_and_save(mgr, [1], trainable)
    before = fingerprint(big.detach().clone())
    with torch.no_grad():  # element 1: bytes 4-7, between the sampled ones
        big.view(-1)[1] += 1.0
    assert fingerprint(big.detach()) == before, "the sample cannot tell: only the bytes can"
    (m,) = train_and_save(mgr, [2], trainable)
    assert set(m.references) == {1}  # the other frozen tensors are still referenced
    expected = sha(mgr)
    mgr.close()
    again = fresh(root)
    assert again.restore().step == 2 and sha(again) == expected


def test_every_nth_save_writes_every_tensor(tmp_path):
    mgr = fresh(tmp_path / "ckpt", "checkpoint.incremental_full_every=3", "checkpoint.keep=10")
    trainable = list(mgr.app_state.model.parameters())[-2:]
    saved = train_and_save(mgr, [1, 2, 3, 4, 5], trainable)
    mgr.close()
    assert [sorted(m.references) for m in saved] == [[], [1], [1], [], [4]]


def test_a_save_after_a_restore_writes_every_tensor_and_never_references_a_later_step(tmp_path):
    root = tmp_path / "ckpt"
    mgr = fresh(root, "checkpoint.keep=10")
    trainable = list(mgr.app_state.model.parameters())[-2:]
    train_and_save(mgr, [1, 2], trainable)
    mgr.close()
    again = fresh(root, "checkpoint.keep=10", "checkpoint.load_step=1")
    assert again.restore().step == 1
    (m,) = train_and_save(again, [2], trainable)  # the same step again, on another trajectory
    (n,) = train_and_save(again, [3], trainable)
    again.close()
    assert not m.references and set(n.references) == {2}


def test_the_fast_tier_keeps_a_referenced_checkpoint_until_nothing_names_it(tmp_path):
    root = tmp_path / "ckpt"
    mgr = fresh(root, "checkpoint.keep=2", "checkpoint.incremental_full_every=3")
    trainable = list(mgr.app_state.model.parameters())[-2:]
    listing = []
    for step in range(1, 7):  # 1 and 4 write everything, the others reference them
        train_and_save(mgr, [step], trainable)
        listing.append(sorted(int(p.name[5:]) for p in root.iterdir()))
    mgr.close()
    # The newest 2, and what a manifest there names when the prune looked (a referencing
    # checkpoint and the one it references are not deleted by the same prune).
    assert listing == [[1], [1, 2], [1, 2, 3], [1, 3, 4], [1, 4, 5], [4, 5, 6]]
    assert ftfleet(["ckpt", "verify", str(root)]) == 0


@pytest.mark.timeout(120)
def test_a_bucket_holds_each_file_once_and_restores_through_references(tmp_path, moto_url, bucket, s3):
    uri = f"s3://{bucket}/run"
    extra = (f"checkpoint.uri={uri}", f"checkpoint.s3_endpoint_url={moto_url}")
    mgr = fresh(tmp_path / "a", *extra)
    trainable = list(mgr.app_state.model.parameters())[-2:]
    train_and_save(mgr, [1, 2, 3], trainable)
    expected = sha(mgr)
    assert mgr.close(wait_for_upload=True)
    keys = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="run/")["Contents"]}
    durable = sorted(int(k.split("/")[1][5:]) for k in keys if k.endswith("/manifest.json"))
    assert durable[-1] == 3
    own = {
        f"run/step-{s}/{n}": e.size
        for s in durable
        for n, e in read_manifest(tmp_path / "a" / f"step-{s}").files.items()
    }
    # Each referenced file is there once: as its own step's, or for step-3 when that step
    # was not uploaded (the upload skips to the newest commit).
    referenced = {
        f"run/step-{r}/{n}": e.size
        for r, files in read_manifest(tmp_path / "a" / "step-3").references.items()
        for n, e in files.items()
    }
    assert {k: v for k, v in keys.items() if not k.endswith("manifest.json")} == {**referenced, **own}
    assert ftfleet(["ckpt", "verify", uri, "--endpoint-url", moto_url]) == 0

    # Another machine: an empty fast tier restores step-3 and the files it references.
    again = fresh(tmp_path / "b", *extra)
    assert again.restore().step == 3 and sha(again) == expected
    again.close(wait_for_upload=False)


def test_a_manifest_with_references_is_format_2_and_names_earlier_steps_only():
    entry = {"size": 4, "crc32c": "0000000a"}
    good = Manifest(
        step=5,
        run_id="r",
        config_hash="c",
        world_size=1,
        files={"__0_0.distcp": FileEntry(1, "00000000")},
        torch_version="t",
        references={3: {"__0_0.distcp": FileEntry(4, "0000000a")}},
        reused_bytes=4,
    )
    assert Manifest.from_json(good.to_json()) == good
    assert good.every_file()["../step-3/__0_0.distcp"] == FileEntry(4, "0000000a")
    data = json.loads(good.to_json())
    for bad, why in [
        ({**data, "format": "ftfleet-checkpoint/1"}, "format"),
        ({**data, "references": {"5": {"x": entry}}}, "not an earlier step"),
        ({**data, "references": {"007": {"x": entry}}}, "not an earlier step"),
        ({**data, "references": {"3": {"../x": entry}}}, "illegal file name"),
        ({**data, "references": {"3": {"x": {"size": True, "crc32c": "0000000a"}}}}, "bad entry"),
    ]:
        with pytest.raises(ManifestError, match=why):
            Manifest.from_json(json.dumps(bad))


# --- retention never leaves a manifest naming a file that is gone ------------------------


class Tier:
    """A bucket stand-in: step -> {file: present}, manifests as Recorded, deletions one
    object at a time, manifest first (as the sweeps and the trainer delete)."""

    def __init__(self):
        self.manifests: dict[int, core.Recorded] = {}
        self.files: dict[int, set[str]] = {}

    def deletions(self, plan: core.SweepPlan) -> list[tuple[int, str | None]]:
        out: list[tuple[int, str | None]] = []
        for step in plan.delete:
            out.append((step, None))
            out += [(step, f) for f in sorted(self.files.get(step, ()))]
        for step in plan.debris:
            out += [(step, f) for f in sorted(self.files.get(step, ()))]
        return out

    def apply(self, op: tuple[int, str | None]) -> None:
        step, name = op
        if name is None:
            self.manifests.pop(step, None)
        else:
            self.files[step].discard(name)


def test_no_crash_during_any_sweep_leaves_a_referenced_file_missing():
    hour = 3600.0
    rng = random.Random(1234)
    policy = core.Policy(("all for 6h", "1d for 7d", "1w for 13w"))
    for trial in range(40):
        tier = Tier()
        chain_start = 0
        for step in range(1, 24 * 40, rng.choice((1, 3, 7))):
            if rng.random() < 0.15:
                chain_start = step  # a full save
            refs = frozenset({chain_start}) if chain_start and chain_start != step else frozenset()
            tier.manifests[step] = core.Recorded(step * hour, policy=policy, references=refs)
            tier.files[step] = {"__0_0.distcp", ".metadata"}
            if rng.random() < 0.3:  # a sweep now, cut short at a random object
                now = step * hour
                plan = core.plan_sweep(tier.manifests, set(tier.manifests), {}, now)
                ops = tier.deletions(plan)
                for op in ops[: rng.randint(0, len(ops))]:
                    tier.apply(op)
                for owner, recorded in tier.manifests.items():
                    assert tier.files[owner] == {"__0_0.distcp", ".metadata"}, (trial, owner)
                    for ref in recorded.references:
                        assert tier.files.get(ref) == {"__0_0.distcp", ".metadata"}, (trial, owner, ref)
    assert tier.manifests  # something is kept


def test_a_sweep_counts_a_checkpoint_whole_only_with_the_files_it_references():
    from lambdas.common import checkpoints

    text = json.dumps(
        {
            "created_at": 10.0,
            "files": {"a": {"size": 1, "crc32c": "00000000"}},
            "references": {"3": {"b": {"size": 2, "crc32c": "00000000"}}},
        }
    ).encode()
    rec, whole = checkpoints.recorded(text, 5, {5: {"a": 1}, 3: {"b": 2}})
    assert whole and rec.references == {3}
    assert checkpoints.recorded(text, 5, {5: {"a": 1}})[1] is False
    assert checkpoints.recorded(text, 5, {5: {"a": 1}, 3: {"b": 3}})[1] is False


def test_a_sweep_keeps_referenced_steps_and_their_uncommitted_files():
    day = 86400.0
    recorded = {
        1: core.Recorded(0.0),
        9: core.Recorded(8 * day, references=frozenset({1, 4})),
        10: core.Recorded(9 * day),
    }
    hourly = core.Policy(("all for 1h",))
    plan = core.plan_sweep(recorded, set(recorded), {4: 0.0, 5: 0.0}, now=9 * day, fallback=hourly)
    assert plan.kept[1] == core.REFERENCED and 1 not in plan.delete
    assert plan.delete == [9] and plan.debris == [5]


@pytest.fixture(autouse=True)
def _no_leftovers(tmp_path):
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


FROZEN = ["model.freeze=['tok_emb.*','pos_emb.*','blocks.0.*','head.*']", "checkpoint.keep=4"]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_fine_tuning_run_stopped_and_resumed_on_incremental_checkpoints_ends_as_without_them(tmp_path):
    """Two ranks (FSDP), a frozen base: the run that writes incremental checkpoints, is
    stopped and resumed from them ends bit-identical to the run that writes full ones."""
    from tests.trainer.conftest import run_trainer

    reference = run_trainer(2, tmp_path / "ref", *FROZEN, "resilience.interval.fixed_steps=6")
    run_dir = tmp_path / "run"
    flags = [*FROZEN, "resilience.interval.fixed_steps=6", "checkpoint.incremental=true"]
    assert run_trainer(2, run_dir, *flags, "train.stop_at_step=14")["step"] == 14
    done = run_trainer(2, run_dir, *flags)
    assert done["state_sha256"] == reference["state_sha256"]
    ckpts = run_dir / "checkpoints"
    manifests = {int(p.name[5:]): read_manifest(p) for p in ckpts.glob("step-*") if (p / "manifest.json").exists()}
    newest = manifests[max(manifests)]
    assert newest.references and newest.reused_bytes > 0
    assert ftfleet(["ckpt", "verify", str(ckpts)]) == 0


def test_the_list_names_what_references_a_checkpoint(tmp_path, capsys):
    root = tmp_path / "ckpt"
    mgr = fresh(root, "checkpoint.keep=10")
    train_and_save(mgr, [1, 2], list(mgr.app_state.model.parameters())[-2:])
    mgr.close()
    capsys.readouterr()
    assert ftfleet(["ckpt", "list", str(root), "--json", "--retention", "1w for 1w"]) == 0
    rows = {r["step"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[2]["references"] == [1] and rows[2]["reused_bytes"] > 0
    assert rows[2]["kept_by"] == "newest" and rows[1]["kept_by"] == "referenced by step-2"


@pytest.mark.timeout(120)
def test_a_gcs_bucket_restores_through_references_too(tmp_path, gcs_bucket):
    uri = f"gs://{gcs_bucket}/run"
    mgr = fresh(tmp_path / "a", f"checkpoint.uri={uri}")
    trainable = list(mgr.app_state.model.parameters())[-2:]
    train_and_save(mgr, [1, 2, 3], trainable)
    expected = sha(mgr)
    assert mgr.close(wait_for_upload=True)
    assert ftfleet(["ckpt", "verify", uri]) == 0
    again = fresh(tmp_path / "b", f"checkpoint.uri={uri}")
    assert again.restore().step == 3 and sha(again) == expected
    references = read_manifest(tmp_path / "b" / "step-3").references
    assert 1 in references
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted(["step-3", *(f"step-{r}" for r in references)])
    for r, files in references.items():  # only the files step-3 reads, no checkpoint of their own
        assert sorted(p.name for p in (tmp_path / "b" / f"step-{r}").iterdir()) == sorted(files)
    again.close(wait_for_upload=False)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_saves_written_from_the_in_memory_snapshots_reference_too(tmp_path):
    """checkpoint.save_from_memory: the writer gets the snapshot's tensors, not a staged
    copy of its own; they are compared and referenced the same way."""
    from tests.trainer.conftest import MEMORY, run_trainer

    flags = [*FROZEN, *MEMORY, "resilience.interval.mode=fixed", "checkpoint.incremental=true", "train.steps=24"]
    run_trainer(2, tmp_path / "run", *flags, env={"FTFLEET_SHM_DIR": str(tmp_path / "shm")})
    ckpts = tmp_path / "run" / "checkpoints"
    newest = read_manifest(max(ckpts.glob("step-*"), key=lambda p: int(p.name[5:])))
    assert newest.references and newest.reused_bytes > 0
    assert ftfleet(["ckpt", "verify", str(ckpts)]) == 0


# --- another save of a referenced step is never overwritten -------------------------------


def test_a_restore_does_not_write_a_referenced_file_over_another_save_of_its_step(tmp_path, moto_url, bucket):
    from ftfleet.trainer.checkpoint.manifest import checksum_file

    extra = (f"checkpoint.uri=s3://{bucket}/run", f"checkpoint.s3_endpoint_url={moto_url}")
    mgr = fresh(tmp_path / "a", *extra)
    train_and_save(mgr, [1, 2, 3], list(mgr.app_state.model.parameters())[-2:])
    assert mgr.close(wait_for_upload=True)
    # Another machine whose fast tier holds its own save of step 1 (other weights).
    other = fresh(tmp_path / "b", "checkpoint.keep=10")
    with torch.no_grad():
        for p in other.app_state.model.parameters():
            p.add_(1.0)
    train_and_save(other, [1], list(other.app_state.model.parameters())[-2:])
    other.close()
    before = {p.name: checksum_file(p) for p in (tmp_path / "b" / "step-1").iterdir()}
    again = fresh(tmp_path / "b", *extra)
    restored = again.restore()
    again.close(wait_for_upload=False)
    assert restored is None or restored.step != 3  # step-3 from the bucket needs step-1's other bytes
    assert {p.name: checksum_file(p) for p in (tmp_path / "b" / "step-1").iterdir()} == before


def test_an_upload_does_not_write_a_referenced_file_over_another_save_of_its_step(tmp_path, moto_url, bucket, s3):
    from ftfleet.trainer.checkpoint.comm import LocalComm
    from ftfleet.trainer.checkpoint.tiers import LocalTier
    from ftfleet.trainer.checkpoint.tiers.s3 import S3Store
    from ftfleet.trainer.checkpoint.upload import Uploader

    store = S3Store(f"s3://{bucket}/run", endpoint_url=moto_url)
    first = fresh(tmp_path / "a", f"checkpoint.uri=s3://{bucket}/run", f"checkpoint.s3_endpoint_url={moto_url}")
    train_and_save(first, [1], list(first.app_state.model.parameters())[-2:])
    assert first.close(wait_for_upload=True)  # the bucket's step-1
    listed = {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="run/step-1/")["Contents"]}

    second = fresh(tmp_path / "b")  # another save of step 1, then 2 referencing it
    with torch.no_grad():
        for p in second.app_state.model.parameters():
            p.add_(1.0)
    train_and_save(second, [1, 2], list(second.app_state.model.parameters())[-2:])
    second.close()
    up = Uploader(store, LocalTier(tmp_path / "b"), LocalComm(), workers=2)
    up.submit(read_manifest(tmp_path / "b" / "step-2"))  # step-1's own upload skipped
    up.close(wait=True, timeout=60)
    assert up.durable_steps == []
    assert {o["Key"]: o["ETag"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="run/step-1/")["Contents"]} == listed


def test_a_referenced_object_gone_from_the_bucket_is_sent_again(tmp_path, moto_url, bucket, s3):
    from ftfleet.trainer.checkpoint.comm import LocalComm
    from ftfleet.trainer.checkpoint.tiers import LocalTier
    from ftfleet.trainer.checkpoint.tiers.s3 import S3Store
    from ftfleet.trainer.checkpoint.upload import Uploader

    mgr = fresh(tmp_path / "c", "checkpoint.keep=10")
    train_and_save(mgr, [1, 2, 3], list(mgr.app_state.model.parameters())[-2:])
    mgr.close()
    store = S3Store(f"s3://{bucket}/run", endpoint_url=moto_url)
    up = Uploader(store, LocalTier(tmp_path / "c"), LocalComm(), workers=2)
    up.submit(read_manifest(tmp_path / "c" / "step-2"))  # and step-1's referenced files, for it
    while not up.idle():
        time.sleep(0.01)
    gone = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="run/step-1/")["Contents"]]
    assert gone
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in gone]})  # a sweep, an expiry
    up.submit(read_manifest(tmp_path / "c" / "step-3"))
    assert up.close(wait=True, timeout=60) and up.durable_steps == [2, 3]
    back = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="run/step-1/")["Contents"]]
    assert set(gone) <= set(back)


def test_init_from_refuses_a_copy_whose_references_nothing_checks(tmp_path):
    from ftfleet.errors import ConfigError
    from ftfleet.trainer.weights import _checked_files

    mgr = fresh(tmp_path / "ckpt")
    train_and_save(mgr, [1, 2], list(mgr.app_state.model.parameters())[-2:])
    mgr.close()
    assert "../step-1/__0_0.distcp" in _checked_files(tmp_path / "ckpt" / "step-2")
    bare = tmp_path / "copy" / "step-2"
    shutil.copytree(tmp_path / "ckpt" / "step-2", bare)
    (bare / "manifest.json").unlink()
    with pytest.raises(ConfigError, match="export DIR STEP --to checkpoint"):
        _checked_files(bare)


def test_a_save_whose_base_lost_a_file_fails_and_the_next_writes_everything(tmp_path):
    root = tmp_path / "ckpt"
    mgr = fresh(root, "checkpoint.keep=10")
    trainable = list(mgr.app_state.model.parameters())[-2:]
    train_and_save(mgr, [1], trainable)
    for f in (root / "step-1").glob("__*.distcp"):
        f.write_bytes(f.read_bytes() + b"x")  # rewritten behind the trainer's back
    with pytest.raises(Exception, match="referenced with"):
        train_and_save(mgr, [2], trainable)
    (m,) = train_and_save(mgr, [3], trainable)
    mgr.close()
    assert not m.references
