"""Token shards on disk: format ``ftfleet-tokens/1`` (the specification is docs/DATA.md).

A shard set is a directory::

    index.json            written last and atomically: its presence is the commit
    shard-00000.tokens    the token ids of whole documents, back to back (little-endian
                          uint16 or uint32, as index.json says)
    shard-00000.docs      little-endian uint64: where each document starts in the shard
    ...

The reader memory-maps the shards (the page cache of the fast tier's file system does
the rest) and serves sample ``k`` as tokens ``[k*seq_len, k*seq_len + seq_len + 1)`` of
the concatenation of every shard: the last token of one sample is the first of the
next, so every token is predicted exactly once per epoch. Documents are separated by
the tokenizer's end-of-text token when it has one; samples run across documents.

No torch here: ``ftfleet data prepare`` starts without it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from ftfleet import __version__ as FTFLEET_VERSION
from ftfleet.errors import ConfigError, UserError
from ftfleet.trainer.checkpoint.manifest import Crc32c, fsync_dir, write_atomic
from ftfleet.trainer.schemas import TokenShardsConfig

FORMAT = "ftfleet-tokens/1"
INDEX = "index.json"
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
DOCS_DTYPE = np.dtype("<u8")


def shard_names(i: int) -> tuple[str, str]:
    return f"shard-{i:05d}.tokens", f"shard-{i:05d}.docs"


def dtype_for(vocab_size: int) -> str:
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise UserError(f"a vocabulary of {vocab_size} tokens does not fit uint32 ids")


class ShardSetError(UserError):
    """A shard directory that is missing, incomplete or not of this format."""


@dataclasses.dataclass(frozen=True, slots=True)
class ShardEntry:
    tokens_file: str
    docs_file: str
    num_tokens: int
    num_documents: int
    tokens_crc32c: str
    docs_crc32c: str

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens_file,
            "docs": self.docs_file,
            "num_tokens": self.num_tokens,
            "num_documents": self.num_documents,
            "tokens_crc32c": self.tokens_crc32c,
            "docs_crc32c": self.docs_crc32c,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardEntry:
        return cls(
            str(data["tokens"]),
            str(data["docs"]),
            int(data["num_tokens"]),
            int(data["num_documents"]),
            str(data["tokens_crc32c"]),
            str(data["docs_crc32c"]),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class ShardIndex:
    dtype: str
    vocab_size: int
    eos_id: int | None
    tokenizer: str
    shards: tuple[ShardEntry, ...]
    created_at: float = 0.0
    ftfleet_version: str = FTFLEET_VERSION

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.shards)

    @property
    def num_documents(self) -> int:
        return sum(s.num_documents for s in self.shards)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT,
                "dtype": self.dtype,
                "vocab_size": self.vocab_size,
                "eos_id": self.eos_id,
                "tokenizer": self.tokenizer,
                "num_tokens": self.num_tokens,
                "num_documents": self.num_documents,
                "shards": [s.to_json() for s in self.shards],
                "created_at": self.created_at,
                "ftfleet_version": self.ftfleet_version,
            },
            indent=1,
        )

    @classmethod
    def read(cls, directory: Path) -> ShardIndex:
        path = directory / INDEX
        if not directory.is_dir():
            raise ShardSetError(f"{directory}: no such directory; write one with `ftfleet data prepare`")
        if not path.is_file():
            raise ShardSetError(
                f"{directory} has no {INDEX}: not a complete shard set (an interrupted "
                "`ftfleet data prepare`?); run the prepare again"
            )
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ShardSetError(f"{path}: unreadable ({exc}); run `ftfleet data prepare` again") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else None
            raise ShardSetError(f"{path}: format {found!r}, this ftfleet reads {FORMAT}")
        try:
            index = cls(
                dtype=str(data["dtype"]),
                vocab_size=int(data["vocab_size"]),
                eos_id=None if data.get("eos_id") is None else int(data["eos_id"]),
                tokenizer=str(data.get("tokenizer", "")),
                shards=tuple(ShardEntry.from_json(s) for s in data["shards"]),
                created_at=float(data.get("created_at", 0.0)),
                ftfleet_version=str(data.get("ftfleet_version", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ShardSetError(f"{path}: malformed ({type(exc).__name__}: {exc})") from None
        if index.dtype not in DTYPES:
            raise ShardSetError(f"{path}: token dtype {index.dtype!r}; use one of {', '.join(DTYPES)}")
        return index


class TokenShards:
    """Map-style dataset over a shard set: ``len`` samples of ``seq_len + 1`` int64 tokens."""

    def __init__(self, directory: str | os.PathLike, seq_len: int):
        self.directory = Path(directory)
        self.seq_len = seq_len
        self.index = ShardIndex.read(self.directory)
        self.vocab_size = self.index.vocab_size
        itemsize = DTYPES[self.index.dtype].itemsize
        for s in self.index.shards:
            path = self.directory / s.tokens_file
            size = path.stat().st_size if path.is_file() else None
            if size != s.num_tokens * itemsize:
                state = "missing" if size is None else f"{size} bytes, the index says {s.num_tokens * itemsize}"
                raise ShardSetError(f"{path}: {state}; the shard set is damaged, prepare it again")
        counts = np.array([s.num_tokens for s in self.index.shards], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self.num_tokens = int(self._starts[-1])
        if self.num_tokens < seq_len + 1:
            raise ShardSetError(
                f"{self.directory} holds {self.num_tokens} tokens, fewer than one sample of "
                f"seq_len + 1 = {seq_len + 1}: add text or lower data.seq_len"
            )
        self._maps: list[np.memmap] | None = None

    def __len__(self) -> int:
        return (self.num_tokens - 1) // self.seq_len

    def _shards(self) -> list[np.memmap]:
        # Opened lazily and per process: a DataLoader worker maps the files itself.
        if self._maps is None:
            dtype = DTYPES[self.index.dtype]
            self._maps = [
                np.memmap(self.directory / s.tokens_file, dtype=dtype, mode="r") if s.num_tokens else np.empty(0, dtype)
                for s in self.index.shards
            ]
        return self._maps

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Tokens ``[start, stop)`` of the concatenated stream, as int64."""
        maps = self._shards()
        out = np.empty(stop - start, dtype=np.int64)
        i = int(np.searchsorted(self._starts, start, side="right")) - 1
        pos = start
        while pos < stop:
            local = pos - int(self._starts[i])
            take = min(stop - pos, int(self._starts[i + 1]) - pos)
            out[pos - start : pos - start + take] = maps[i][local : local + take]
            pos += take
            i += 1
        return out

    def __getitem__(self, index: int) -> np.ndarray:
        if not 0 <= index < len(self):
            raise IndexError(index)
        start = index * self.seq_len
        return self.tokens(start, start + self.seq_len + 1)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = None  # a spawned worker maps the files again instead of copying them
        return state


def build(cfg: TokenShardsConfig, job) -> TokenShards:
    """``data.factory: token_shards``."""
    from ftfleet.trainer.factories import lookup

    seq_len = cfg.seq_len or int(lookup(job.model.factories["factory"].args, "seq_len", 0) or 0)
    if not seq_len:
        raise ConfigError("data.seq_len is 0 and the model section has no seq_len: set data.seq_len")
    return TokenShards(cfg.path, seq_len)


class ShardWriter:
    """Writes a shard set: documents in, shards out, the index last.

    Every shard is written under a temporary name, fsynced and renamed; the index is
    written atomically after the last. A writer killed at any point leaves no index,
    and a reader refuses a directory without one.
    """

    def __init__(self, directory: Path, *, vocab_size: int, eos_id: int | None, tokenizer: str, shard_tokens: int):
        self.directory = directory
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.tokenizer = tokenizer
        self.dtype = dtype_for(vocab_size)
        self._np_dtype = DTYPES[self.dtype]
        self.shard_tokens = shard_tokens
        self.shards: list[ShardEntry] = []
        self._file = None
        self._crc = Crc32c()
        self._docs: list[int] = []
        self._count = 0

    def add(self, ids: Any) -> int:
        """One document's token ids (the end-of-text token is appended here). Returns
        the tokens written."""
        if isinstance(ids, (bytes, bytearray, memoryview)):
            tokens = np.frombuffer(ids, dtype=np.uint8).astype(np.int64)
        else:
            tokens = np.asarray(ids, dtype=np.int64).reshape(-1)
        if self.eos_id is not None:
            tokens = np.append(tokens, self.eos_id)
        if tokens.size == 0:
            return 0
        if tokens.min() < 0 or tokens.max() >= self.vocab_size:
            bad = int(tokens.max() if tokens.max() >= self.vocab_size else tokens.min())
            raise UserError(f"the tokenizer produced id {bad}, outside its vocabulary of {self.vocab_size}")
        if self._file is None:
            self._open()
        data = tokens.astype(self._np_dtype).tobytes()
        self._file.write(data)
        self._crc.update(data)
        self._docs.append(self._count)
        self._count += tokens.size
        if self._count >= self.shard_tokens:
            self._close_shard()
        return int(tokens.size)

    @property
    def empty(self) -> bool:
        return not self.shards and self._file is None

    def _partial(self, name: str) -> Path:
        return self.directory / f".{name}.partial"

    def _open(self) -> None:
        tokens_name, _ = shard_names(len(self.shards))
        self._file = open(self._partial(tokens_name), "wb")
        self._crc = Crc32c()
        self._docs = []
        self._count = 0

    def _close_shard(self) -> None:
        tokens_name, docs_name = shard_names(len(self.shards))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        docs = np.asarray(self._docs, dtype=DOCS_DTYPE).tobytes()
        docs_crc = Crc32c()
        docs_crc.update(docs)
        with open(self._partial(docs_name), "wb") as f:
            f.write(docs)
            f.flush()
            os.fsync(f.fileno())
        os.replace(self._partial(tokens_name), self.directory / tokens_name)
        os.replace(self._partial(docs_name), self.directory / docs_name)
        self.shards.append(
            ShardEntry(
                tokens_name,
                docs_name,
                self._count,
                len(self._docs),
                f"{self._crc.value:08x}",
                f"{docs_crc.value:08x}",
            )
        )

    def finish(self) -> ShardIndex:
        """Close the last shard and commit the set by writing its index."""
        if self._file is not None:
            self._close_shard()
        fsync_dir(self.directory)
        index = ShardIndex(self.dtype, self.vocab_size, self.eos_id, self.tokenizer, tuple(self.shards), time.time())
        write_atomic(self.directory / INDEX, index.to_json().encode())
        return index

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
