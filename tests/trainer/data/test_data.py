"""The data path: the global sample order, token shards and `ftfleet data prepare`, and
the per-rank reader (a StatefulDataLoader with workers) whose state resumes exactly."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import IterableDataset

from ftfleet.cli import main
from ftfleet.errors import UserError
from ftfleet.trainer.data.loader import GlobalBatches
from ftfleet.trainer.data.order import GlobalOrder
from ftfleet.trainer.data.shards import INDEX, ShardIndex, ShardSetError, TokenShards
from ftfleet.trainer.data.workers import resolve_start_method, start_worker_server
from tests.trainer.conftest import REPO, child_env, wait_for

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran"]


def write_corpus(root: Path, docs: int = 5, words: int = 120, seed: int = 0) -> list[str]:
    """Text files doc0.txt ... in name order; returns their texts."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    texts = []
    for i in range(docs):
        text = " ".join(rng.choice(WORDS, size=words)) + f" — π{i}"  # not only ASCII
        (root / f"doc{i}.txt").write_text(text, encoding="utf-8")
        texts.append(text)
    return texts


def prepare(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["data", "prepare", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


# ---------------------------------------------------------------------------
# The global order
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_each_epoch_visits_every_index_once_in_an_order_fixed_by_the_seed(n):
    order = GlobalOrder(n, seed=3, shuffle=True)
    first, second = order.indices(np.arange(n)), order.indices(np.arange(n, 2 * n))
    assert sorted(first) == sorted(second) == list(range(n))
    again = GlobalOrder(n, seed=3, shuffle=True).indices(np.arange(2 * n))
    assert (again == np.concatenate([first, second])).all()
    if n >= 7:
        assert list(first) != list(range(n)) and list(first) != list(second)
        assert list(GlobalOrder(n, seed=4, shuffle=True).indices(np.arange(n))) != list(first)


def test_a_position_reads_the_same_index_however_the_positions_are_split():
    order = GlobalOrder(50, seed=1, shuffle=True)
    whole = order.indices(np.arange(150))
    pieces = np.concatenate([GlobalOrder(50, 1, True).indices(np.arange(a, a + 3)) for a in range(0, 150, 3)])
    assert (whole == pieces).all()


def test_without_shuffle_or_a_length_position_i_reads_index_i():
    assert list(GlobalOrder(5, 1, shuffle=False).indices(np.arange(12))) == [0, 1, 2, 3, 4] * 2 + [0, 1]
    assert list(GlobalOrder(None, 1, shuffle=True).indices(np.arange(3, 7))) == [3, 4, 5, 6]


# ---------------------------------------------------------------------------
# Token shards and `ftfleet data prepare`
# ---------------------------------------------------------------------------


def test_prepared_shards_hold_every_document_and_samples_tile_the_stream(tmp_path, capsys):
    texts = write_corpus(tmp_path / "corpus")
    rc, out, _ = prepare(capsys, tmp_path / "corpus", "--out", tmp_path / "s", "--shard-tokens", 600)
    assert rc == 0 and "5 documents" in out
    index = ShardIndex.read(tmp_path / "s")
    stream = np.concatenate([np.append(np.frombuffer(t.encode(), np.uint8), 256) for t in texts]).astype(np.int64)
    assert (index.dtype, index.vocab_size, index.eos_id, index.tokenizer) == ("uint16", 257, 256, "bytes")
    assert len(index.shards) > 1 and index.num_tokens == len(stream) and index.num_documents == 5
    # Shards hold whole documents, back to back; .docs has where each one starts.
    on_disk, starts = [], []
    for s in index.shards:
        tokens = np.fromfile(tmp_path / "s" / s.tokens_file, dtype="<u2")
        starts += list(np.fromfile(tmp_path / "s" / s.docs_file, dtype="<u8") + sum(map(len, on_disk)))
        on_disk.append(tokens)
    assert (np.concatenate(on_disk) == stream).all()
    assert starts == list(np.cumsum([0] + [len(t.encode()) + 1 for t in texts[:-1]]))
    data = TokenShards(tmp_path / "s", seq_len=16)
    assert len(data) == (len(stream) - 1) // 16
    for k in range(len(data)):  # samples that straddle two shards included
        assert (data[k] == stream[16 * k : 16 * k + 17]).all()


def test_jsonl_files_and_line_splits_make_one_document_each(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"body": "one"}\n\n{"body": "two"}\n')
    (tmp_path / "in" / "b.txt").write_text("three\nfour\n")
    rc, out, _ = prepare(capsys, tmp_path / "in", "--out", tmp_path / "s", "--text-key", "body", "--split", "line")
    assert rc == 0 and "4 documents" in out
    data = TokenShards(tmp_path / "s", seq_len=1)
    assert bytes(data.tokens(0, data.num_tokens)[data.tokens(0, data.num_tokens) < 256].astype(np.uint8)) == (
        b"onetwothreefour"
    )


def test_a_users_tokenizer_and_a_hugging_face_tokenizer_directory(tmp_path, capsys):
    (tmp_path / "in.txt").write_text("the cat sat on a mat")
    rc, _, _ = prepare(
        capsys, tmp_path / "in.txt", "--out", tmp_path / "u", "--tokenizer", "tests.trainer.userpkg:words"
    )
    index = ShardIndex.read(tmp_path / "u")
    assert rc == 0 and (index.vocab_size, index.eos_id) == (10, 1)
    assert list(TokenShards(tmp_path / "u", seq_len=1).tokens(0, 7)) == [2, 3, 4, 5, 6, 7, 1]

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<eos>", *WORDS])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="<eos>").save_pretrained(
        tmp_path / "tok"
    )
    rc, _, _ = prepare(capsys, tmp_path / "in.txt", "--out", tmp_path / "h", "--tokenizer", tmp_path / "tok")
    index = ShardIndex.read(tmp_path / "h")
    assert rc == 0 and index.tokenizer.startswith("hf:") and (index.vocab_size, index.eos_id) == (10, 1)
    assert list(TokenShards(tmp_path / "h", seq_len=1).tokens(0, 7)) == [2, 3, 4, 5, 6, 7, 1]


def test_progress_is_shown_on_request(tmp_path, capsys):
    write_corpus(tmp_path / "corpus", docs=2)
    _, _, err = prepare(capsys, tmp_path / "corpus", "--out", tmp_path / "s", "--progress")
    assert "100%" in err


@pytest.mark.parametrize(
    "case, words",
    [
        ("missing", ["nope.txt does not exist"]),
        ("empty", ["no text in 2 input file(s)"]),
        ("unwritable", ["cannot write there"]),
        ("tokenizer-import", ["cannot import nopkg"]),
        ("tokenizer-raises", ["calling it failed", "no vocabulary file"]),
        ("not-utf8", ["bad.txt: not UTF-8 text"]),
        ("bad-jsonl", ["x.jsonl:2: not a JSON object with a string 'text'"]),
        ("exists", ["already holds a shard set", "--overwrite"]),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_shard_set(tmp_path, capsys, case, words):
    inputs, out, extra = [tmp_path / "in"], tmp_path / "out", []
    write_corpus(tmp_path / "in", docs=2)
    if case == "missing":
        inputs.append(tmp_path / "nope.txt")
    elif case == "empty":
        inputs = [tmp_path / "blank"]
        (tmp_path / "blank").mkdir()
        (tmp_path / "blank" / "a.txt").write_text("")
        (tmp_path / "blank" / "b.txt").write_text("  \n")
    elif case == "unwritable":
        (tmp_path / "file").write_text("")
        out = tmp_path / "file" / "out"
    elif case == "tokenizer-import":
        extra = ["--tokenizer", "nopkg.tok:build"]
    elif case == "tokenizer-raises":
        extra = ["--tokenizer", "tests.trainer.userpkg:broken_tokenizer"]
    elif case == "not-utf8":
        (tmp_path / "in" / "bad.txt").write_bytes(b"ok \xff\xfe")
    elif case == "bad-jsonl":
        (tmp_path / "in" / "x.jsonl").write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    elif case == "exists":
        assert prepare(capsys, tmp_path / "in", "--out", out)[0] == 0
        before = (out / INDEX).read_text()
    rc, _, err = prepare(capsys, *inputs, "--out", out, *extra)
    assert rc == 2 and err.startswith("error:") and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err
    if case == "exists":
        assert (out / INDEX).read_text() == before
    else:
        assert not (out / INDEX).exists()
        assert not list(out.glob(".*.partial")) if out.is_dir() else True


@pytest.mark.integration
def test_an_interrupted_prepare_leaves_no_set_a_reader_accepts(tmp_path, capsys):
    """Killed after its first shard: no index, so readers refuse the directory; the
    next prepare starts over and completes."""
    (tmp_path / "in.txt").write_text("\n".join(" ".join(WORDS) for _ in range(80)))
    argv = ["data", "prepare", str(tmp_path / "in.txt"), "--out", str(tmp_path / "s"), "--split", "line"]
    argv += ["--shard-tokens", "40"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ftfleet.cli", *argv, "--tokenizer", "tests.trainer.userpkg:slow_words"],
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: (tmp_path / "s" / "shard-00001.tokens").exists() or proc.poll() is not None, 60, 0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "prepare finished before the kill"
    assert (tmp_path / "s" / "shard-00000.tokens").exists() and not (tmp_path / "s" / INDEX).exists()
    with pytest.raises(ShardSetError, match="no index.json: not a complete shard set") as err:
        TokenShards(tmp_path / "s", seq_len=8)
    assert "\n" not in str(err.value)

    assert main([*argv, "--tokenizer", "tests.trainer.userpkg:words"]) == 0
    capsys.readouterr()
    assert ShardIndex.read(tmp_path / "s").num_documents == 80
    assert not list((tmp_path / "s").glob(".*"))


@pytest.mark.integration
def test_prepare_and_the_shard_reader_start_without_torch(tmp_path):
    write_corpus(tmp_path / "in", docs=2)
    code = (
        "import sys; from ftfleet.cli import main; "
        f"main(['data', 'prepare', {str(tmp_path / 'in')!r}, '--out', {str(tmp_path / 's')!r}]); "
        "from ftfleet.trainer.data.shards import TokenShards; "
        f"TokenShards({str(tmp_path / 's')!r}, 8)[0]; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr


def test_a_damaged_set_is_refused_naming_the_file(tmp_path, capsys):
    write_corpus(tmp_path / "in")
    assert prepare(capsys, tmp_path / "in", "--out", tmp_path / "s", "--shard-tokens", 600)[0] == 0
    shard = tmp_path / "s" / "shard-00001.tokens"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(data)
    assert main(["data", "inspect", str(tmp_path / "s"), "--verify"]) == 1
    assert "CORRUPT shard-00001.tokens: crc32c" in capsys.readouterr().out
    shard.write_bytes(data[:-2])
    with pytest.raises(ShardSetError, match=r"shard-00001.tokens: \d+ bytes, the index says \d+"):
        TokenShards(tmp_path / "s", seq_len=8)


def test_a_missing_shard_directory_is_one_line_naming_it(tmp_path):
    with pytest.raises(ShardSetError, match=f"^{tmp_path / 'nope'}: no such directory; write one with"):
        TokenShards(tmp_path / "nope", seq_len=8)


def test_a_set_from_another_format_version_is_refused(tmp_path, capsys):
    write_corpus(tmp_path / "in", docs=1)
    assert prepare(capsys, tmp_path / "in", "--out", tmp_path / "s")[0] == 0
    index = json.loads((tmp_path / "s" / INDEX).read_text())
    (tmp_path / "s" / INDEX).write_text(json.dumps({**index, "format": "ftfleet-tokens/2"}))
    with pytest.raises(ShardSetError, match="format 'ftfleet-tokens/2', this ftfleet reads ftfleet-tokens/1"):
        ShardIndex.read(tmp_path / "s")


# ---------------------------------------------------------------------------
# The per-rank reader, and what the checkpoint holds
# ---------------------------------------------------------------------------

B = 6


class Numbered:
    """Map-style, sized: item i is [i, how many items this process has served]. The
    count is dataset state that lives in the loader's worker processes."""

    def __init__(self, n: int = 40):
        self.n, self.served = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        self.served += 1
        return np.array([i, self.served])

    def state_dict(self) -> dict:
        return {"served": self.served}

    def load_state_dict(self, state: dict) -> None:
        self.served = state["served"]


def reader(dataset, rank=0, world=2, workers=0) -> GlobalBatches:
    return GlobalBatches(dataset, B, rank, world, torch.device("cpu"), seed=5, shuffle=True, num_workers=workers)


def through_a_checkpoint(state: dict) -> dict:
    """What the checkpoint gives back (non-tensor values are torch.save'd and loaded
    with weights_only=True)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return torch.load(io.BytesIO(buf.getvalue()), weights_only=True)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_ranks_together_read_each_global_batch_once_in_the_global_order(world):
    order = GlobalOrder(40, seed=5, shuffle=True)
    readers = [reader(Numbered(), r, world) for r in range(world)]
    for step in range(10):
        got = np.concatenate([r.get(step * B, step + 1).data[:, 0].numpy() for r in readers])
        assert list(got) == list(order.indices(np.arange(step * B, (step + 1) * B)))


@pytest.mark.integration
def test_a_reader_with_workers_resumes_exactly_from_its_checkpointed_state():
    a = reader(Numbered(), workers=2)
    for step in range(5):
        a.get(step * B, step + 1)
    state = through_a_checkpoint(a.state_dict())
    expected = [a.get(step * B, step + 1).data for step in range(5, 9)]
    b = reader(Numbered(), workers=2)
    b.load_state_dict(state)
    got = [b.get(step * B, step + 1).data for step in range(5, 9)]
    # Indices and the workers' dataset state both continue where they stood.
    assert all(torch.equal(x, y) for x, y in zip(expected, got, strict=True))
    fresh = reader(Numbered(), workers=2).get(5 * B, 6).data
    assert torch.equal(fresh[:, 0], expected[0][:, 0]) and not torch.equal(fresh, expected[0])


@pytest.mark.integration
def test_a_map_style_reader_continues_from_the_sample_count_on_another_world_size():
    a = reader(Numbered(), rank=1, world=2, workers=2)
    for step in range(4):
        a.get(step * B, step + 1)
    b = reader(Numbered(), rank=1, world=3, workers=2)
    b.load_state_dict(through_a_checkpoint(a.state_dict()))  # written by rank 1 of 2: not usable
    order = GlobalOrder(40, seed=5, shuffle=True)
    assert list(b.get(4 * B, 5).data[:, 0]) == list(order.indices(np.arange(4 * B + 2, 4 * B + 4)))


def test_a_skipped_or_replayed_batch_moves_the_reader_to_the_loops_position():
    a, order = reader(Numbered(), rank=0, world=1), GlobalOrder(40, seed=5, shuffle=True)
    a.get(0, 1)
    assert list(a.get(2 * B, 3).data[:, 0]) == list(order.indices(np.arange(2 * B, 3 * B)))
    assert list(a.get(B, 2).data[:, 0]) == list(order.indices(np.arange(B, 2 * B)))


class Counter(IterableDataset):
    """An iterable with state: yields 0, 1, 2, ... from where it stood."""

    def __init__(self):
        self.next = 0

    def __iter__(self):
        while True:
            self.next += 1
            yield self.next - 1

    def state_dict(self) -> dict:
        return {"next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.next = state["next"]


def test_an_iterable_dataset_resumes_from_its_state_on_the_same_world_size_only():
    a = reader(Counter(), world=1)
    for step in range(3):
        a.get(step * B, step + 1)
    state = through_a_checkpoint(a.state_dict())
    b = reader(Counter(), world=1)
    b.load_state_dict(state)
    assert b.get(3 * B, 4).data.tolist() == list(range(18, 24)) == a.get(3 * B, 4).data.tolist()
    assert b.get(5 * B, 6).data.tolist() == list(range(30, 36))  # a skipped batch is read past
    other = reader(Counter(), world=2)
    other.load_state_dict(state)
    with pytest.raises(UserError, match="cannot resume an IterableDataset at sample 18: it was written by rank 0 of 1"):
        other.get(3 * B, 4)


@pytest.mark.integration
def test_the_reader_state_is_saved_per_rank_in_the_checkpoint(tmp_path):
    import torch.distributed.checkpoint as dcp

    from ftfleet.trainer.checkpoint.safe_load import load_into, load_offline
    from ftfleet.trainer.checkpoint.state import AppState, TrainProgress

    def app(data):
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        return AppState(model, optimizer, scheduler, TrainProgress(), rank=0, seed=0, per_rank={"data": data})

    a = reader(Numbered(), world=1, workers=2)
    for step in range(3):
        a.get(step * B, step + 1)
    dcp.save({"app": app(a)}, checkpoint_id=tmp_path / "ck")
    assert isinstance(load_offline(tmp_path / "ck")["app"]["data_rank0"]["reader"], bytes)
    b = reader(Numbered(), world=1, workers=2)
    load_into({"app": app(b)}, tmp_path / "ck")
    assert torch.equal(b.get(3 * B, 4).data, a.get(3 * B, 4).data)


@pytest.mark.integration
def test_shards_are_read_through_worker_processes(tmp_path, capsys):
    write_corpus(tmp_path / "in")
    assert prepare(capsys, tmp_path / "in", "--out", tmp_path / "s", "--shard-tokens", 600)[0] == 0
    shards = TokenShards(tmp_path / "s", seq_len=16)
    r = GlobalBatches(shards, B, 0, 1, torch.device("cpu"), seed=5, shuffle=True, num_workers=2)
    order = GlobalOrder(len(shards), seed=5, shuffle=True)
    batch = r.get(B, 2).data
    assert batch.shape == (B, 17) and batch.dtype == torch.int64
    assert all(
        torch.equal(batch[j], torch.from_numpy(shards[int(i)])) for j, i in enumerate(order.indices(range(B, 2 * B)))
    )


def test_a_checkpoint_taken_before_the_first_update_resumes_as_if_never_taken(tmp_path):
    """get_state_dict gives an optimizer without state one (a zero-lr step: AdamW's
    step count 1). Saving must not leave that behind, nor bring it back on load."""
    import torch.distributed.checkpoint as dcp

    from ftfleet.trainer.checkpoint.safe_load import load_into
    from ftfleet.trainer.checkpoint.state import AppState, TrainProgress

    def app():
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 3)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
        return AppState(model, optimizer, scheduler, TrainProgress(), rank=0, seed=0)

    def one_step(a):
        a.model(torch.ones(2, 3)).sum().backward()
        a.optimizer.step()
        return a.model.weight.detach().clone()

    saved = app()
    dcp.save({"app": saved}, checkpoint_id=tmp_path / "ck")
    assert not saved.optimizer.state
    loaded = app()
    load_into({"app": loaded}, tmp_path / "ck")
    assert not loaded.optimizer.state
    assert torch.equal(one_step(loaded), one_step(app())) and torch.equal(one_step(saved), one_step(app()))


@pytest.mark.integration
def test_close_stops_the_reader_workers_at_once():
    """The loader keeps its iterator for its state dict: close() must stop its worker
    processes itself, or torchrun's SIGTERM to the process group kills them while the
    trainer still runs and the loader's SIGCHLD handler raises (seen at a preempted
    node's exit)."""
    r = reader(Numbered(), workers=2)
    r.get(0, 1)
    workers = list(r.loader._iterator._workers)
    assert workers and all(w.is_alive() for w in workers)
    r.close()
    assert not any(w.is_alive() for w in workers)


class RestartRequest(BaseException):
    """Like nvidia-resiliency-ext's RankShouldRestart: raised into the main thread
    asynchronously, wherever it happens to be."""


@pytest.mark.integration
def test_abort_kills_the_workers_and_closes_without_an_error_of_its_own(caplog):
    r = reader(Numbered(), workers=2)
    r.get(0, 1)
    workers = list(r.loader._iterator._workers)
    with caplog.at_level("WARNING", logger="ftfleet.data"):
        r.abort()
    assert not any(w.is_alive() for w in workers)
    assert "closing after a failure" not in caplog.text


@pytest.mark.integration
def test_a_restart_request_arriving_while_abort_joins_the_workers_goes_on(monkeypatch):
    """Seen in the goodput bench: the request came while the loader joined its killed
    workers, the loader's own `finally` raised over it, and abort logged that error away;
    the wrapper, never told to restart, gave the process up (a 143 s restart)."""
    r = reader(Numbered(), workers=2)
    r.get(0, 1)
    worker = r.loader._iterator._workers[0]
    join = type(worker).join

    def interrupted_join(self, timeout=None):
        join(self, timeout)
        raise RestartRequest("asynchronous")

    monkeypatch.setattr(type(worker), "join", interrupted_join)
    with pytest.raises(RestartRequest):
        r.abort()


@pytest.mark.integration
def test_a_loader_worker_drops_the_tcp_sockets_it_inherited_and_keeps_the_rest(tmp_path):
    """Run in a child: closing descriptors in the test process would close pytest's."""
    import subprocess
    import sys

    code = """
import os, socket
from ftfleet.trainer.data.loader import drop_inherited_sockets
tcp = socket.socket(); tcp.bind(("127.0.0.1", 0)); tcp.listen()
a, b = socket.socketpair()
r, w = os.pipe()
drop_inherited_sockets(0)
def alive(fd):
    try:
        os.fstat(fd); return True
    except OSError:
        return False
print(alive(tcp.fileno()), alive(a.fileno()), alive(r))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "True", "True"], out.stderr


class ParentPids:
    """Each sample is the pid of the process that read it and that process's parent."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> np.ndarray:
        return np.array([os.getpid(), os.getppid()])


def test_auto_starts_workers_from_a_server_only_where_forking_a_threaded_trainer_can_deadlock():
    """gh-112275: CPython 3.11 before 3.11.10 (this machine's 3.11.7 hit it)."""
    assert resolve_start_method("auto", (3, 11, 7)) == "forkserver"
    assert resolve_start_method("auto", (3, 11, 10)) == "fork"
    assert resolve_start_method("auto", (3, 12, 3)) == "fork"  # the trainer image's
    assert resolve_start_method("spawn", (3, 11, 7)) == "spawn"
    here = resolve_start_method("auto")
    assert GlobalBatches(ParentPids(), B, 0, 1, torch.device("cpu"), num_workers=1).start_method == here


@pytest.mark.integration
def test_loader_workers_are_forked_from_a_server_not_from_the_trainer():
    """The trainer runs threads; forking it can leave a worker deadlocked. With the
    forkserver the workers come from a server process."""
    r = GlobalBatches(ParentPids(), B, 0, 1, torch.device("cpu"), seed=5, num_workers=2, start_method="forkserver")
    try:
        pids = r.get(0, 1).data
    finally:
        r.close()
    assert os.getpid() not in pids[:, 0].tolist()
    assert os.getpid() not in pids[:, 1].tolist()  # their parent is the server

    forked = GlobalBatches(ParentPids(), B, 0, 1, torch.device("cpu"), seed=5, num_workers=2, start_method="fork")
    try:
        assert set(forked.get(0, 1).data[:, 1].tolist()) == {os.getpid()}
    finally:
        forked.close()


@pytest.mark.integration
def test_the_workers_server_freezes_what_its_preloads_imported_last(monkeypatch):
    """Its frozen objects stay out of the collector in the forked workers (shared pages
    stay shared) and in its own exit (no pass over all of torch)."""
    from multiprocessing import forkserver

    preloads = []
    monkeypatch.setattr(forkserver, "set_forkserver_preload", preloads.append)
    monkeypatch.setattr(forkserver, "ensure_running", lambda: None)
    start_worker_server("forkserver", ["my_pkg.data", "torch"])
    # The server leaves the trainer's process group first (trainer/data/server.py).
    assert preloads == [["ftfleet.trainer.data.server", "torch", "my_pkg.data", "ftfleet.trainer.data.frozen"]]

    def frozen_after(imports: str) -> int:
        code = f"import gc, torch{imports}; print(gc.get_freeze_count())"
        out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, check=True)
        return int(out.stdout)

    # torch's objects are frozen too: hundreds of thousands more than before the import.
    assert frozen_after(", ftfleet.trainer.data.frozen") > frozen_after("") + 100_000


class Unpicklable(ParentPids):
    def __init__(self):
        self.transform = lambda x: x


@pytest.mark.integration
def test_a_dataset_that_cannot_be_pickled_names_the_setting_to_change():
    r = GlobalBatches(Unpicklable(), B, 0, 1, torch.device("cpu"), seed=5, num_workers=1, start_method="forkserver")
    with pytest.raises(UserError, match=r"data.start_method=forkserver.*picklable, or set data.start_method=fork"):
        r.get(0, 1)
    forked = GlobalBatches(Unpicklable(), B, 0, 1, torch.device("cpu"), seed=5, num_workers=1, start_method="fork")
    try:
        assert forked.get(0, 1).data.shape == (B, 2)
    finally:
        forked.close()


@pytest.mark.integration
def test_the_workers_of_a_killed_trainer_exit_with_it(tmp_path):
    """Their parent is the forkserver, which lives as long as they do: without a watch on
    the trainer, a SIGKILLed trainer's workers would run (and hold its stderr) for good."""
    code = """
import os, sys, time
import torch
from ftfleet.trainer.data.loader import GlobalBatches
from tests.trainer.data.test_data import ParentPids, B
r = GlobalBatches(ParentPids(), B, 0, 1, torch.device("cpu"), seed=5, num_workers=2, start_method="forkserver")
pids = {int(r.get(i * B, i + 1).data[0, 0]) for i in range(2)}  # a batch per worker
print(" ".join(map(str, sorted(pids))), flush=True)
time.sleep(600)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert len(workers) == 2 and proc.pid not in workers
        assert all(_running(p) for p in workers)
        proc.kill()
        proc.wait(timeout=30)
        wait_for(lambda: not any(_running(p) for p in workers), timeout=20, what="the workers to exit")
    finally:
        proc.kill()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
