"""The ``checkpoint:`` block of the trainer config: the tiers, how a save is written,
uploaded and kept, and the in-memory snapshots. Loading and type checking are
trainer/config.py's; the block validates itself."""

from __future__ import annotations

import dataclasses
import os

from ftfleet.contract import UPLOAD_MODES
from ftfleet.errors import ConfigError, require_positive
from ftfleet.trainer.checkpoint.retention import DEFAULT_SCHEDULE, parse_schedule


@dataclasses.dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    enabled: bool = True
    """Save checkpoints (restore still runs when false and load is true)."""
    dir: str = ""
    """Fast tier: a directory every rank sees (local NVMe on one node, or the FSx /
    Parallelstore / Lustre mount). Empty: <run_dir>/checkpoints. Env: FTFLEET_CKPT_DIR."""
    keep: int = 3
    """Newest checkpoints kept per tier (at least 2: the newest may still be uploading or
    fail verification, and then the one before it is the one that restores)."""
    pinned_steps: list[int] = dataclasses.field(default_factory=list)
    """Steps never deleted by retention (e.g. an evaluation point)."""
    retention: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_SCHEDULE))
    """Which checkpoints the durable tiers (the buckets) keep: rules ``<every> for <window>``
    (units m, h, d, w), the default keeping every checkpoint of the last 6 hours, the
    newest of each day for 7 days and of each week for 13 weeks. Windows end at the
    newest checkpoint; the newest checkpoint and pinned_steps are always kept; the
    bucket's lifecycle rules still move what is kept to colder storage. The fast tier
    keeps ``keep``."""
    async_save: bool | str = True
    """dcp.async_save with staging (training blocks only for the copy). False: dcp.save.
    ``auto``: each interval save in the mode measured cheaper for training (blocked time
    + the slowdown of the steps beside its background part); where cores are few, a
    background save can cost more steps than a blocking one (docs/RESILIENCE.md)."""
    thread_count: int = 2
    """DCP writer threads per rank (files per rank)."""
    direct_io: bool = True
    """Write the shards with O_DIRECT (from an aligned buffer to the device, not through
    the page cache; buffered where the file system refuses it). A checkpoint is read
    again only after a failure: cached, it takes memory from training, and filling the
    cache with fresh pages can cost more than the write itself (``bench/writer_bench.py``)."""
    incremental: bool = False
    """Do not write a tensor again whose bytes did not change since the previous checkpoint
    of this tier (frozen layers in fine-tuning, untouched buffers): the manifest references
    the earlier checkpoint's file instead, and restore, verification, upload and retention
    follow the references (trainer/checkpoint/incremental.py). Unchanged is decided by
    comparing every byte with the stored record, never by a checksum alone. The cost: a
    file may serve several checkpoints, and retention keeps a referenced checkpoint whole
    while anything references it."""
    incremental_full_every: int = 8
    """With incremental: every this many-th save writes every tensor, so references reach
    back at most this many saves (the checkpoints one lost file can take with it)."""
    uri: str = ""
    """Durable tier in the primary region, `s3://bucket/prefix` or `gs://bucket/prefix`.
    Env: FTFLEET_CKPT_URI."""
    replica_uri: str = ""
    """Read-only replica of the durable tier in another region, used to restore when the
    primary is gone. Env: FTFLEET_CKPT_REPLICA_URI."""
    upload: str = "trainer"
    """`trainer`: upload each commit to `uri`. `fsx-export`: the fast tier exports to the
    bucket itself, do not upload twice. `none`. Env: FTFLEET_CKPT_UPLOAD."""
    s3_endpoint_url: str = ""
    """S3 endpoint (tests, S3-compatible stores). Empty: AWS, or AWS_ENDPOINT_URL."""
    multipart_chunk_mb: int = 64
    """Multipart part size for object uploads, in MiB (S3 requires at least 5)."""
    transfer_workers: int = 8
    """Parallel object transfers per rank (files, and parts within a file)."""
    lease_uri: str = ""
    """The run lease (trainer/resilience/fencing/lease.py): the object that names which
    holder may commit the run, `s3://bucket/prefix/lease.json`, `gs://...`, or a local
    path. One object for the run wherever it trains (the home region's bucket). Empty: no
    lease. Env: FTFLEET_LEASE_URI."""
    lease_holder: str = ""
    """Who this trainer is to the lease (the fleet sets its stack and region). Env:
    FTFLEET_LEASE_HOLDER."""
    lease_ttl_s: float = 120.0
    """How long a renewal keeps the lease (renewed every quarter of it); another job takes
    it over 10 s after it runs out. A trainer cut off from the store stops committing
    40 s before it runs out (10 s of clock skew, 30 s for a commit's write)."""
    retries: int = 10
    """Attempts per object request (5xx, throttling and connection errors are retried)."""
    load: bool = True
    """Resume from the newest valid checkpoint found in the tiers. When committed
    checkpoints exist and none loads, the start is refused (exit 2) and nothing is
    changed; false starts from step 0 whatever is there (its saves replace those steps)."""
    load_step: int | None = None
    """Resume from exactly this step (its newest valid copy) instead of the newest."""
    force_load: bool = False
    """Load a checkpoint whose manifest names another run_id or config hash."""
    timeout_s: int = 1800
    """Timeout of checkpoint collectives (the checkpoint process groups)."""
    memory: bool = False
    """Keep in-memory snapshots: each rank's latest state in host shared memory (outlives
    the process, not the node) and a copy of the next node's (outlives the node). A
    restart restores from them when they are the newest (docs/RESILIENCE.md); the disk
    tiers stay the durable ones. How often: resilience.interval.snapshot_*."""
    memory_root: str = "/dev/shm"
    """The RAM file system of the snapshots; the run's are under <memory_root>/ftfleet-<run_id>.
    Env: FTFLEET_SHM_DIR."""
    memory_keep: int = 2
    """Snapshots kept per rank in memory, 1 or 2 (2: the newest may be torn by a kill)."""
    memory_peer_every: int = 1
    """Send the copy of a snapshot to the peer node every this many snapshots (0: never).
    The copy covers a node lost without notice (a process lost, or a node with notice,
    needs only the own snapshot, or the emergency checkpoint); it is the dear part of a
    snapshot (the whole state over the network). The own snapshot of the newest copied
    step is kept beside the newest memory_keep, so a lost node's ranks and the others
    still share a step. Under HSDP (``parallel.replicas`` > 1) a replica's own snapshot
    serves first, and 0 is enough unless every replica of a shard may go at once."""
    memory_timeout_s: float = 20.0
    """Seconds a snapshot's collective or peer copy may wait for a peer (the snapshots'
    gloo group) before it fails. A rank blocked in one cannot be interrupted, so under
    the in-process launcher keep it below ``--heartbeat-timeout``: a rank still waiting
    on a peer that is gone when a restart begins is otherwise taken for a lost one. Large
    enough for one rank's snapshot to cross the network."""
    save_from_memory: bool = True
    """With checkpoint.memory: a background save writes the in-memory snapshot of its
    step (taking one when the newest is older) instead of staging a copy of its own, so
    training blocks only for the snapshot's copy (Gemini-style two levels: the durable
    checkpoint drains from memory). The next snapshot waits for that write."""
    ranks_per_node: int = 0
    """Ranks per node for the snapshot ring (node i holds node i+1's copy). 0: torchrun's
    LOCAL_WORLD_SIZE. Smaller values simulate several nodes on one machine (tests, drills)."""

    def node_size(self, world_size: int) -> int:
        """Ranks per node for the snapshot ring: ``ranks_per_node``, else torchrun's
        LOCAL_WORLD_SIZE, else the whole world (one node)."""
        return self.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", world_size))

    def __post_init__(self) -> None:
        if self.lease_uri and not self.lease_holder:
            raise ConfigError(
                f"checkpoint.lease_uri={self.lease_uri} needs checkpoint.lease_holder: name who trains the run "
                "(the fleet sets FTFLEET_LEASE_HOLDER to its stack and region)"
            )
        if not 60.0 <= self.lease_ttl_s <= 3600.0:
            raise ConfigError(
                f"checkpoint.lease_ttl_s={self.lease_ttl_s:g}: use 60 to 3600 s (a renewal every quarter of it "
                "must leave room for 10 s of clock skew and 30 s for a commit's write)"
            )
        if self.keep < 2:
            raise ConfigError(
                f"checkpoint.keep={self.keep}: keep at least 2 checkpoints "
                "(the newest may still be uploading or fail verification)"
            )
        parse_schedule(self.retention)
        if any(s < 0 for s in self.pinned_steps):
            raise ConfigError(f"checkpoint.pinned_steps={self.pinned_steps}: steps are >= 0")
        require_positive("checkpoint.thread_count", self.thread_count)
        if self.incremental_full_every < 2:
            raise ConfigError(
                f"checkpoint.incremental_full_every={self.incremental_full_every}: use 2 or more "
                "(1 would write every tensor every time; set checkpoint.incremental=false for that)"
            )
        if not self.memory_timeout_s > 0:
            raise ConfigError(f"checkpoint.memory_timeout_s={self.memory_timeout_s}: use seconds > 0")
        require_positive("checkpoint.transfer_workers", self.transfer_workers)
        require_positive("checkpoint.retries", self.retries)
        require_positive("checkpoint.timeout_s", self.timeout_s)
        if self.multipart_chunk_mb < 5:
            raise ConfigError(
                f"checkpoint.multipart_chunk_mb={self.multipart_chunk_mb}: S3 parts are at least 5 MiB; use 5 or more"
            )
        if self.upload not in UPLOAD_MODES:
            raise ConfigError(f"checkpoint.upload={self.upload!r}: use one of {', '.join(UPLOAD_MODES)}")
        for key in ("uri", "replica_uri"):
            value = getattr(self, key)
            if value and not value.startswith(("s3://", "gs://")):
                raise ConfigError(
                    f"checkpoint.{key}={value!r}: use s3://bucket/prefix or gs://bucket/prefix (or empty for none)"
                )
        if isinstance(self.async_save, str) and self.async_save != "auto":
            raise ConfigError(f"checkpoint.async_save={self.async_save!r}: use true, false or auto")
        if self.memory_keep not in (1, 2):
            raise ConfigError(
                f"checkpoint.memory_keep={self.memory_keep}: use 1 or 2 (each is a copy of the state in RAM)"
            )
        if self.memory_peer_every < 0:
            raise ConfigError(
                f"checkpoint.memory_peer_every={self.memory_peer_every}: use 0 (no peer copies) or a count >= 1"
            )
        if self.ranks_per_node < 0:
            raise ConfigError(f"checkpoint.ranks_per_node={self.ranks_per_node}: use 0 (torchrun's) or a count >= 1")
        if self.memory and not self.memory_root:
            raise ConfigError("checkpoint.memory_root is empty: name a RAM file system such as /dev/shm")
        if self.replica_uri and not self.uri:
            raise ConfigError(
                "checkpoint.replica_uri is set but checkpoint.uri is empty: set the primary durable tier too"
            )
