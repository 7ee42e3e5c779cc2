"""``ftfleet data prepare|inspect``: text files in, token shards out (docs/DATA.md).

::

    ftfleet data prepare INPUT [INPUT ...] --out DIR [--tokenizer bytes|module:callable|HF_DIR]
                         [--split file|line|paragraph] [--text-key text] [--shard-tokens N]
                         [--overwrite] [--progress | --no-progress]
    ftfleet data inspect DIR [--verify] [--json]

INPUT is a file or a directory (every file below it, in name order, hidden ones
skipped). A ``.jsonl`` file holds one document per line, in the field ``--text-key``;
any other file is UTF-8 text split into documents by ``--split``. The tokenizer is
``bytes`` (UTF-8 bytes, ids 0-255, end of text 256), an importable callable returning
an object with ``encode(text) -> ids`` and ``vocab_size`` (and ``eos_id`` or
``eos_token_id``), or a local Hugging Face tokenizer directory (needs transformers).

Bad input is one line and exit 2, before anything is written. The index is written
last and atomically, so an interrupted prepare never leaves a set a reader accepts.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ftfleet.errors import UserError

#: Inputs this large show a progress bar even when stderr is not a terminal.
LARGE_INPUT_BYTES = 64 << 20
DEFAULT_SHARD_TOKENS = 1 << 27
_OUR_FILES = re.compile(r"\.?shard-\d{5}\.(tokens|docs)(\.partial)?")


class ByteTokenizer:
    """UTF-8 bytes as ids 0-255; 256 ends a document."""

    name = "bytes"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> bytes:
        return text.encode("utf-8")


class _Adapter:
    """A user's or Hugging Face tokenizer seen through the three things prepare needs."""

    def __init__(self, name: str, tok: Any, key: str):
        self.name = name
        self._tok = tok
        size = len(tok) if hasattr(tok, "__len__") else getattr(tok, "vocab_size", None)
        if not callable(getattr(tok, "encode", None)) or not isinstance(size, int) or size <= 0:
            raise UserError(
                f"{key}: {type(tok).__name__} is not a tokenizer: it needs encode(text) -> ids and a vocab_size"
            )
        self.vocab_size = size
        eos = getattr(tok, "eos_id", getattr(tok, "eos_token_id", None))
        self.eos_id = int(eos) if isinstance(eos, int) else None

    def encode(self, text: str) -> Any:
        return self._tok.encode(text)


def load_tokenizer(spec: str) -> ByteTokenizer | _Adapter:
    key = f"--tokenizer {spec}"
    if spec in ("", "bytes"):
        return ByteTokenizer()
    if Path(spec).is_dir():
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise UserError(f"{key}: reading a Hugging Face tokenizer needs transformers; pip install it") from None
        try:
            tok = AutoTokenizer.from_pretrained(spec, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - transformers raises many kinds
            detail = (str(exc).strip().splitlines() or [""])[0]
            raise UserError(f"{key}: not a Hugging Face tokenizer directory ({type(exc).__name__}: {detail})") from None
        return _Adapter(f"hf:{Path(spec).resolve()}", tok, key)
    if ":" in spec:
        from ftfleet.errors import ConfigError
        from ftfleet.trainer.factories import import_callable

        try:
            factory = import_callable("--tokenizer", spec)
            tok = factory()
        except ConfigError as exc:
            raise UserError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - the user's factory
            raise UserError(f"{key}: calling it failed ({type(exc).__name__}: {exc})") from None
        return _Adapter(spec, tok, key)
    raise UserError(f"{key}: use bytes, module:callable, or a Hugging Face tokenizer directory")


def input_files(inputs: list[str]) -> list[Path]:
    files: list[Path] = []
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            files += sorted(
                p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.parts[-1:])
            )
        elif path.is_file():
            files.append(path)
        else:
            raise UserError(f"data prepare: {raw} does not exist; pass text files or directories")
    return files


def documents(path: Path, split: str, text_key: str) -> Iterator[tuple[str, int]]:
    """(document text, bytes of input it came from)."""
    try:
        if path.suffix == ".jsonl":
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        text = json.loads(line)[text_key]
                    except (ValueError, KeyError, TypeError):
                        raise UserError(
                            f"{path}:{lineno}: not a JSON object with a string {text_key!r}; "
                            "fix the line or pass --text-key"
                        ) from None
                    if not isinstance(text, str):
                        raise UserError(f"{path}:{lineno}: {text_key!r} is not a string")
                    yield text, len(line)
        elif split == "file":
            text = path.read_text(encoding="utf-8")
            yield text, path.stat().st_size
        else:
            with open(path, encoding="utf-8") as f:
                para: list[str] = []
                for line in f:
                    if split == "line":
                        yield line.rstrip("\n"), len(line)
                    elif line.strip():
                        para.append(line)
                    else:
                        yield "".join(para), sum(map(len, para)) + len(line)
                        para = []
                if para:
                    yield "".join(para), sum(map(len, para))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None


def prepare_output(out: Path, overwrite: bool) -> None:
    from ftfleet.trainer.checkpoint.manifest import fsync_dir
    from ftfleet.trainer.data.shards import INDEX

    if (out / INDEX).exists() and not overwrite:
        raise UserError(f"--out {out} already holds a shard set ({INDEX}); pass --overwrite to replace it")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".ftfleet-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write there ({exc.strerror}); choose a writable directory") from None
    # The index goes first, so that no reader takes it for the shards that replace it.
    if (out / INDEX).exists():
        (out / INDEX).unlink()
        fsync_dir(out)
    for f in out.iterdir():
        if _OUR_FILES.fullmatch(f.name):
            f.unlink()


def prepare(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ftfleet.trainer.data.shards import ShardWriter

    if args.shard_tokens <= 0:
        raise UserError(f"--shard-tokens {args.shard_tokens}: use a positive number of tokens")
    files = input_files(args.inputs)
    tokenizer = load_tokenizer(args.tokenizer)
    out = Path(args.out)
    prepare_output(out, args.overwrite)
    total = sum(f.stat().st_size for f in files)
    show = args.progress if args.progress is not None else (total >= LARGE_INPUT_BYTES or sys.stderr.isatty())
    writer = ShardWriter(
        out,
        vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id,
        tokenizer=tokenizer.name,
        shard_tokens=args.shard_tokens,
    )
    finished = False
    try:
        with tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            desc=f"prepare {out.name}",
            disable=not show,
            file=sys.stderr,
            mininterval=0.5 if sys.stderr.isatty() else 5.0,
        ) as bar:
            for path in files:
                for text, size in documents(path, args.split, args.text_key):
                    if text.strip():
                        writer.add(_encode(tokenizer, text, path))
                    bar.update(size)
        if writer.empty:
            raise UserError(f"data prepare: no text in {len(files)} input file(s); nothing to prepare")
        index = writer.finish()
        finished = True
    finally:
        if not finished:
            writer.abort()
            for f in out.glob(".shard-*.partial"):
                f.unlink()
    print(
        f"{out}: {index.num_tokens} tokens, {index.num_documents} documents, {len(index.shards)} shard(s) "
        f"({index.dtype}, vocabulary {index.vocab_size}, tokenizer {index.tokenizer})"
    )
    return 0


def _encode(tokenizer: Any, text: str, path: Path) -> Any:
    try:
        return tokenizer.encode(text)
    except Exception as exc:  # noqa: BLE001 - the user's tokenizer
        raise UserError(f"{path}: the tokenizer failed ({type(exc).__name__}: {exc})") from None


def inspect_set(args: argparse.Namespace) -> int:
    from ftfleet.trainer.checkpoint.manifest import checksum_file
    from ftfleet.trainer.data.shards import ShardIndex

    directory = Path(args.dir)
    index = ShardIndex.read(directory)
    bad = []
    if args.verify:
        for s in index.shards:
            for name, crc in ((s.tokens_file, s.tokens_crc32c), (s.docs_file, s.docs_crc32c)):
                path = directory / name
                if not path.is_file():
                    bad.append(f"{name}: missing")
                elif checksum_file(path).crc32c != crc:
                    bad.append(f"{name}: crc32c differs from the index")
    if args.json:
        print(json.dumps({**json.loads(index.to_json()), "problems": bad}, indent=1))
    else:
        print(
            f"{directory}: {index.num_tokens} tokens, {index.num_documents} documents, {len(index.shards)} shard(s), "
            f"{index.dtype}, vocabulary {index.vocab_size}, end of text {index.eos_id}, tokenizer {index.tokenizer}"
        )
        for problem in bad:
            print(f"  CORRUPT {problem}")
    if bad:
        print(f"error: {len(bad)} damaged file(s) in {directory}", file=sys.stderr)
        return 1
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("data", help="prepare and inspect token shards (docs/DATA.md)")
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    p = sub.add_parser("prepare", help="tokenize text files into a shard set")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text or .jsonl files, or directories of them")
    p.add_argument("--out", required=True, help="the shard directory to write (put it on the fast tier)")
    p.add_argument("--tokenizer", default="bytes", help="bytes (default), module:callable, or a HF tokenizer dir")
    p.add_argument("--split", choices=("file", "line", "paragraph"), default="file", help="what one document is")
    p.add_argument("--text-key", default="text", help="the field holding the text in .jsonl files")
    p.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard (about)")
    p.add_argument("--overwrite", action="store_true", help="replace a shard set already in --out")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"progress bar (default: on a terminal, or for inputs over {LARGE_INPUT_BYTES >> 20} MiB)",
    )
    p.set_defaults(func=prepare)
    i = sub.add_parser("inspect", help="summarize a shard set; --verify checks every CRC32C")
    i.add_argument("dir")
    i.add_argument("--verify", action="store_true")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=inspect_set)


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - `python -m` convenience
    from ftfleet.cli import main as cli

    return cli(["data", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
