"""The global sample order: which dataset index global position i reads.

A sized dataset of n samples is read in epochs of n positions; epoch e visits every
index once, in an order fixed by (seed, e). The order is a keyed permutation computed
per position (a 4-round Feistel network over the next power of four above n, with
cycle walking), so it needs no table of n entries and any rank or worker computes any
position on its own. An unsized dataset is read in index order: position i is index i.
"""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
ROUNDS = 4


def _mix(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """splitmix64's finaliser of x ^ key (uint64 arithmetic wraps, as intended)."""
    x = x ^ key
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class GlobalOrder:
    def __init__(self, length: int | None, seed: int, shuffle: bool):
        if length is not None and length <= 0:
            raise ValueError("an empty dataset has no order")
        self.length = length
        self.seed = seed
        self.shuffle = shuffle and length is not None and length > 1
        if self.shuffle:
            self._half = max(1, ((length - 1).bit_length() + 1) // 2)
            self._mask = np.uint64((1 << self._half) - 1)
        self._keys: dict[int, np.ndarray] = {}

    def indices(self, positions: np.ndarray) -> np.ndarray:
        """Dataset indices of global positions (int64 arrays)."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.length is None:
            return positions
        epoch, offset = np.divmod(positions, self.length)
        if not self.shuffle:
            return offset
        out = np.empty_like(offset)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = self._permute(offset[sel], int(e))
        return out

    def _permute(self, j: np.ndarray, epoch: int) -> np.ndarray:
        keys = self._keys.get(epoch)
        if keys is None:
            keys = np.random.SeedSequence([self.seed, epoch, 0x0DE7]).generate_state(ROUNDS, np.uint64)
            self._keys = {epoch: keys}  # positions move forward: keep one epoch's keys
        x = j.astype(np.uint64)
        todo = np.ones(len(x), dtype=bool)
        # Cycle walking: the Feistel permutation is over [0, 4**half) >= n; re-apply it to
        # the values that land at n or above until they come back into [0, n).
        while todo.any():
            x[todo] = self._feistel(x[todo], keys)
            todo = x >= np.uint64(self.length)
        return x.astype(np.int64)

    def _feistel(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        half = np.uint64(self._half)
        left, right = x >> half, x & self._mask
        for key in keys:
            left, right = right, left ^ (_mix(right, key) & self._mask)
        return (left << half) | right
