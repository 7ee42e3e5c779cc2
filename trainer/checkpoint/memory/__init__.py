"""The host-memory tier of checkpoints: snapshots of each rank's state in shared memory.

* ``format.py``: the snapshot file (header and raw tensor bytes), written and read;
* ``tier.py``: the tier, its directories of own and held snapshots;
* ``peers.py``: the ring of peer copies, the replicas of a shard (HSDP), and moving
  bytes between ranks;
* ``snapshots.py``: taking and restoring snapshots during training, from this node's
  memory or a peer's.
"""

from ftfleet.trainer.checkpoint.memory.format import (
    ALIGN,
    MAGIC,
    READ_SLICE,
    TENSOR,
    SnapshotMismatch,
    Staged,
    Stager,
    buffer_reader,
    check,
    copy_into,
    decode,
    encode,
    merge_views,
    prepare,
    snapshot_file,
    views,
)
from ftfleet.trainer.checkpoint.memory.peers import EMPTY, Message, Ring, exchange, replica_sets
from ftfleet.trainer.checkpoint.memory.tier import MemoryTier, reserve_files

__all__ = [
    "ALIGN",
    "EMPTY",
    "MAGIC",
    "READ_SLICE",
    "TENSOR",
    "MemoryTier",
    "Message",
    "Ring",
    "SnapshotMismatch",
    "Staged",
    "Stager",
    "buffer_reader",
    "check",
    "copy_into",
    "decode",
    "encode",
    "exchange",
    "merge_views",
    "prepare",
    "replica_sets",
    "reserve_files",
    "snapshot_file",
    "views",
]
