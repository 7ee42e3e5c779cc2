"""The manifest: the last file of a checkpoint, and the only thing that makes it exist.

``step-N/manifest.json`` lists every other file of the checkpoint with its size and
CRC32C, and says who wrote it (run, config hash, world size, versions). It is written
to a temporary name, fsynced, renamed over its final name and the directory fsynced, so
a reader sees either no manifest or a complete one. On load every listed file is
checked against it; a file that is missing, of another size or another checksum makes
the whole checkpoint invalid.

CRC32C (hardware-accelerated through google-crc32c, the checksum GCS and S3 also use)
detects bit flips and truncation at several GB/s; SHA-256 runs at ~0.4 GB/s on the CI
machines and would dominate the commit time of a large checkpoint.

An incremental checkpoint (``checkpoint.incremental``) also lists ``references``: files
of earlier checkpoints of the same tier holding tensors it did not write again, each with
the size and CRC32C it had when written, by step. DCP's ``.metadata`` names them as the
relative paths ``../step-N/<file>`` (:func:`reference_path`), which is where a tier keeps
them: beside the checkpoint's own directory. Verification, restore, upload and retention
follow them (:meth:`Manifest.every_file`).

A checkpoint saved at a validation step also records what the evaluation measured
(``validation``), one saved as a milestone says so (``milestone``), and the writer's
retention policy for the buckets (``retention``) goes with every checkpoint the trainer
writes: what retention keeps is decided from the manifests (ftfleet/retention.py).

No torch import here: ``ftfleet ckpt list|verify`` runs without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import google_crc32c

from ftfleet import __version__ as FTFLEET_VERSION
from ftfleet.contract import MANIFEST_NAME, parse_step_dir, split_manifest_path, step_dir_name
from ftfleet.retention import Milestone, Policy

FORMAT = "ftfleet-checkpoint/1"
#: The format of a manifest with references: a reader of FORMAT alone, which would take
#: the own files for all of them, refuses it by its format instead.
FORMAT_REFERENCES = "ftfleet-checkpoint/2"
CHECKSUM = "crc32c"
_CHUNK = 8 << 20


class ManifestError(ValueError):
    """A manifest that cannot be parsed or does not describe a checkpoint."""


@dataclasses.dataclass(frozen=True, slots=True)
class FileEntry:
    size: int
    crc32c: str  # 8 hex digits


def _metrics(data: object) -> dict[str, float]:
    """A manifest's ``validation``: metric name -> a finite number."""
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) for k, v in data.items()
    ):
        raise ManifestError(f"validation is not a mapping of names to numbers: {str(data)[:200]}")
    return {k: float(v) for k, v in data.items()}


@dataclasses.dataclass(frozen=True, slots=True)
class Manifest:
    step: int
    run_id: str
    config_hash: str
    world_size: int
    files: dict[str, FileEntry]
    torch_version: str
    ftfleet_version: str = FTFLEET_VERSION
    created_at: float = dataclasses.field(default_factory=time.time)
    format: str = FORMAT
    checksum: str = CHECKSUM
    validation: dict[str, float] | None = None
    """The metrics of the evaluation at this step, when there was one."""
    milestone: Milestone | None = None
    retention: Policy | None = None
    """The writer's retention policy for the durable tiers (what a sweep of a bucket applies)."""
    references: dict[int, dict[str, FileEntry]] = dataclasses.field(default_factory=dict)
    """Files of earlier checkpoints (step -> file name -> entry) that hold some of this
    checkpoint's tensors; every step is lower than this one's."""
    reused_bytes: int = 0
    """The bytes of this checkpoint's records in referenced files: what the save did not
    write again (the records it wrote add up to about ``total_bytes``)."""

    @property
    def total_bytes(self) -> int:
        """The bytes of this checkpoint's own files (what its save wrote)."""
        return sum(f.size for f in self.files.values())

    def every_file(self) -> dict[str, FileEntry]:
        """Every file a restore reads, by its path relative to this checkpoint's directory:
        the own files by name, the referenced ones as :func:`reference_path`."""
        out = dict(self.files)
        for step, files in self.references.items():
            for name, entry in files.items():
                out[reference_path(step, name)] = entry
        return out

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        data["files"] = {name: dataclasses.asdict(e) for name, e in sorted(self.files.items())}
        data["references"] = {
            str(step): {n: dataclasses.asdict(e) for n, e in sorted(files.items())}
            for step, files in sorted(self.references.items())
        }
        if self.references:
            data["format"] = FORMAT_REFERENCES
        else:
            del data["references"], data["reused_bytes"]
        for optional in ("validation", "milestone", "retention"):
            if data[optional] is None:
                del data[optional]
        if self.retention is not None:
            data["retention"] = self.retention.to_json()
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested past the parser's depth
            raise ManifestError(f"not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
        if not isinstance(data, dict):
            raise ManifestError("not a JSON object")
        expected = FORMAT_REFERENCES if data.get("references") else FORMAT
        if data.get("format") != expected:
            raise ManifestError(f"format {data.get('format')!r}, expected {expected!r}")
        if data.get("checksum") != CHECKSUM:
            raise ManifestError(f"checksum {data.get('checksum')!r}, expected {CHECKSUM!r}")
        try:
            files = _entries(data["files"])
            if not files:
                raise ManifestError("lists no files")
            references = {}
            for key, listed in (data.get("references") or {}).items():
                step = parse_step_dir(step_dir_name(key)) if isinstance(key, str) else None
                if step is None or step >= _int(data["step"]):
                    raise ManifestError(f"references step {key!r}: not an earlier step")
                references[step] = _entries(listed)
            manifest = cls(
                step=_int(data["step"]),
                run_id=str(data["run_id"]),
                config_hash=str(data["config_hash"]),
                world_size=_int(data["world_size"]),
                files=files,
                torch_version=str(data["torch_version"]),
                ftfleet_version=str(data["ftfleet_version"]),
                created_at=float(data["created_at"]),
                validation=_metrics(data["validation"]) if data.get("validation") is not None else None,
                milestone=Milestone.from_json(data["milestone"]) if data.get("milestone") is not None else None,
                retention=Policy.from_json(data["retention"]) if data.get("retention") is not None else None,
                references=references,
                reused_bytes=_int(data.get("reused_bytes", 0)),
            )
        # ValueError: a created_at that is no number; OverflowError: an integer past a float.
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as exc:
            if isinstance(exc, ManifestError):
                raise
            raise ManifestError(f"missing or mistyped field {str(exc)[:200]}") from None
        if manifest.world_size < 1 or not 0 <= manifest.step < 1 << 63:
            raise ManifestError(f"step {manifest.step} / world size {manifest.world_size}")
        if not math.isfinite(manifest.created_at):
            raise ManifestError(f"created_at {manifest.created_at}")
        return manifest


def _entries(listed: object) -> dict[str, FileEntry]:
    if not isinstance(listed, dict):
        raise ManifestError(f"a file list that is no mapping: {str(listed)[:200]}")
    files = {}
    for name, entry in listed.items():
        _check_name(name)
        size, crc = entry["size"], entry["crc32c"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not _is_crc(crc):
            raise ManifestError(f"bad entry for {name!r}: {entry!r}")
        files[name] = FileEntry(size, crc)
    return files


def reference_path(step: int, name: str) -> str:
    """Where DCP's metadata finds file ``name`` of checkpoint ``step`` from another
    checkpoint's directory of the same tier."""
    return f"../{step_dir_name(step)}/{name}"


def object_key(step: int, path: str) -> str:
    """The key (relative to a tier's root) of a path :meth:`Manifest.every_file` lists for
    checkpoint ``step``."""
    owner, name = split_manifest_path(path)
    return f"{step_dir_name(step if owner is None else owner)}/{name}"


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(value)
    return value


def _is_crc(value: object) -> bool:
    return isinstance(value, str) and len(value) == 8 and all(c in "0123456789abcdef" for c in value)


#: The longest file name POSIX file systems take, in bytes.
_NAME_MAX = 255


def _check_name(name: str) -> None:
    """File names are plain names inside the step directory; never a path out of it, nor
    one the OS refuses (a NUL, a name past 255 bytes or one that cannot be encoded would
    raise in the verifier instead of failing the check)."""
    if not name or "/" in name or "\\" in name or "\0" in name or name in (".", "..") or name == MANIFEST_NAME:
        raise ManifestError(f"illegal file name {name!r}")
    try:
        encoded = os.fsencode(name)
    except UnicodeError:
        raise ManifestError(f"illegal file name {name[:60]!r}: not encodable") from None
    if len(encoded) > _NAME_MAX:
        raise ManifestError(f"illegal file name {name[:60]!r}...: {len(encoded)} bytes, the limit is {_NAME_MAX}")


# ---------------------------------------------------------------------------
# Checksums and durable writes
# ---------------------------------------------------------------------------


#: Below this many bytes a buffer is copied into ``bytes`` for google_crc32c; above it,
#: the CRC is taken in place (:func:`_extend_in_place`).
_IN_PLACE_MIN = 64 << 10


def _load_in_place() -> Callable[[int, int, int], int] | None:
    """The C function ``crc32c_extend(crc, pointer, length)`` of the libcrc32c that
    google_crc32c's extension is linked against, through ctypes, which releases the GIL
    for the call. google_crc32c.extend itself accepts only ``bytes`` (a memoryview of a
    tensor's storage would have to be copied first, and copying 1 GB costs more than its
    CRC) and keeps the GIL for anything but large ``bytes``. None when that library is not
    reachable (another build of google_crc32c) or gives a wrong result on a known vector;
    the callers then copy."""
    try:
        import ctypes

        import numpy  # noqa: F401 - the buffer's address, read-only buffers included
        from google_crc32c import _crc32c

        fn = ctypes.CDLL(_crc32c.__file__).crc32c_extend
        fn.restype = ctypes.c_uint32
        fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        probe = bytes(range(256)) * 5
        if fn(7, probe, len(probe)) != google_crc32c.extend(7, probe):
            return None
        return fn
    except Exception:  # noqa: BLE001 - any failure means: copy instead
        return None


_in_place: Callable[[int, int, int], int] | None = None
_in_place_loaded = False


def _extend_in_place(crc: int, view: memoryview) -> int | None:
    global _in_place, _in_place_loaded
    if not _in_place_loaded:
        _in_place, _in_place_loaded = _load_in_place(), True
    if _in_place is None:
        return None
    import numpy

    array = numpy.frombuffer(view, dtype=numpy.uint8)  # no copy; keeps the buffer alive
    return _in_place(crc, array.ctypes.data, array.nbytes)


def crc32c_extend(crc: int, data: bytes | bytearray | memoryview) -> int:
    """``crc`` extended over the bytes of ``data`` (any C-contiguous buffer), without
    copying a large one."""
    if isinstance(data, bytes):
        return google_crc32c.extend(crc, data)
    view = memoryview(data).cast("B")
    if view.nbytes >= _IN_PLACE_MIN:
        value = _extend_in_place(crc, view)
        if value is not None:
            return value
    return google_crc32c.extend(crc, view.tobytes())


class Crc32c:
    """Incremental CRC32C; ``update`` takes any bytes-like object."""

    def __init__(self) -> None:
        self.value = 0
        self.size = 0

    def update(self, chunk: bytes | bytearray | memoryview) -> None:
        self.value = crc32c_extend(self.value, chunk)
        self.size += memoryview(chunk).nbytes

    def entry(self) -> FileEntry:
        return FileEntry(self.size, f"{self.value:08x}")


def checksum_file(path: str | os.PathLike) -> FileEntry:
    crc = Crc32c()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            crc.update(chunk)
    return crc.entry()


def checksum_stream(chunks: Iterable[bytes]) -> FileEntry:
    crc = Crc32c()
    for chunk in chunks:
        crc.update(chunk)
    return crc.entry()


def checksum_files(directory: Path, names: Iterable[str], workers: int = 4) -> dict[str, FileEntry]:
    """Checksums of several files in parallel (the CRC releases the GIL)."""
    names = list(names)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(names)))) as pool:
        return dict(zip(names, pool.map(lambda n: checksum_file(directory / n), names), strict=True))


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` so that ``path`` holds either its old content or all of ``data``."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_manifest(step_dir: Path, manifest: Manifest) -> None:
    """Commit ``step_dir``. The fsync of the tier directory makes ``step-N`` itself
    durable: it was created by a plain mkdir, and a commit that a power loss can undo
    is no commit."""
    write_atomic(step_dir / MANIFEST_NAME, manifest.to_json().encode())
    fsync_dir(step_dir.parent)


def read_manifest(step_dir: Path) -> Manifest | None:
    """The manifest of a step directory; None when there is none (uncommitted).
    Raises ManifestError for one that exists but is malformed."""
    try:
        text = (step_dir / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # a directory, a dangling or looping link, no permission
        raise ManifestError(f"cannot read it ({type(exc).__name__}: {exc.strerror or exc})") from None
    return Manifest.from_json(text)


# ---------------------------------------------------------------------------
# Verification
# ---------------------------------------------------------------------------


def check_file(path: Path, expected: FileEntry, full: bool = True, label: str | None = None) -> str | None:
    """None when ``path`` matches ``expected``, else a one-line problem naming the file
    as ``label`` (default: its name)."""
    label = label or path.name
    try:
        info = path.stat()
    except FileNotFoundError:
        return f"{label}: missing"
    except OSError as exc:
        return f"{label}: cannot read it ({type(exc).__name__}: {exc.strerror or exc})"
    if not stat.S_ISREG(info.st_mode):
        return f"{label}: not a regular file"
    size = info.st_size
    if size != expected.size:
        return f"{label}: size {size} bytes, manifest says {expected.size} (truncated or overwritten)"
    if full:
        try:
            got = checksum_file(path)
        except OSError as exc:
            return f"{label}: cannot read it ({type(exc).__name__}: {exc.strerror or exc})"
        if got.crc32c != expected.crc32c:
            return f"{label}: crc32c {got.crc32c}, manifest says {expected.crc32c} (corrupt)"
    return None


def verify_dir(
    step_dir: Path, manifest: Manifest, names: Iterable[str] | None = None, full: bool = True, workers: int = 4
) -> list[str]:
    """Problems with the files of ``manifest`` in ``step_dir``: every one it reads
    (:meth:`Manifest.every_file`; the referenced ones in the sibling directories), or the
    subset ``names``."""
    listed = manifest.every_file()
    names = sorted(listed) if names is None else list(names)
    if not names:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(names)))) as pool:
        results = pool.map(lambda n: check_file(step_dir / n, listed[n], full, n), names)
        return [r for r in results if r]


def assign_files(files: dict[str, int], world_size: int) -> list[list[str]]:
    """Split files over ranks by size, largest first onto the least-loaded rank. Every
    rank computes the same split from the same input, with no communication."""
    loads = [0] * world_size
    out: list[list[str]] = [[] for _ in range(world_size)]
    for name in sorted(files, key=lambda n: (-files[n], n)):
        r = min(range(world_size), key=lambda i: (loads[i], i))
        out[r].append(name)
        loads[r] += files[name]
    return out


def iter_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            yield chunk
