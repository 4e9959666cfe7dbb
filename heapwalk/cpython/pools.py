"""obmalloc's pools found by their headers: every pool-aligned page of the memory scanned whose first 48 bytes
read as a pool header (a size class below 32, the largest offset that class allows, a next offset on a block
boundary, a block count the pool can hold, a free list head inside the pool), at each pool size CPython has
used (4 KiB before 3.10, 16 KiB on 64-bit builds since).  Pure numpy over bulk reads.

A pool's header, on 64-bit builds of every version since 3.8: the count of blocks in use (a 4-byte unsigned in an
8-byte slot), the free list's head, the next and previous pool of its list, the index of its arena in the
arena table, its size class, the offset of its first never-used block and the largest that offset may be.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from heapwalk.inferior.elf import readable_runs
from heapwalk.inferior.memory import Memory

__all__ = ["HEADER", "ALIGNMENT", "CLASSES", "POOL_SIZES", "Pools", "find_pools", "block_size", "blocks_per_pool"]

#: bytes of a pool's header, rounded up to the block alignment (POOL_OVERHEAD)
HEADER = 48
#: bytes between size classes, and a block's alignment
ALIGNMENT = 16
#: size classes: blocks of 16, 32, ... 512 bytes
CLASSES = 32
#: the pool sizes CPython's 64-bit builds use: 4 KiB (up to 3.9), 16 KiB (3.10 on, with the radix tree)
POOL_SIZES = (4096, 16384)
_PAGE = 4096
_WINDOW = 8 << 20
#: an arena index past this is not one (the arena table would take gigabytes)
_MAX_INDEX = 1 << 24


def block_size(szidx) -> np.ndarray:
    """The block size of size class SZIDX (an array or an int)."""
    return (np.asarray(szidx, dtype=np.int64) + 1) * ALIGNMENT


def blocks_per_pool(szidx, pool_size: int) -> np.ndarray:
    """How many blocks of class SZIDX one pool holds (NUMBLOCKS)."""
    return (pool_size - HEADER) // block_size(szidx)


@dataclass(frozen=True)
class Pools:
    """Every pool header found, sorted by address, as arrays: its fields as the header holds them."""

    pool_size: int
    address: np.ndarray        # uint64
    count: np.ndarray          # int64: blocks in use
    freeblock: np.ndarray      # uint64: the free list's head (0: none)
    nextpool: np.ndarray       # uint64
    arena: np.ndarray          # int64: the arena's index in the arena table
    szidx: np.ndarray          # int64
    nextoffset: np.ndarray     # int64

    def __len__(self) -> int:
        return len(self.address)

    @property
    def used(self) -> np.ndarray:
        """Which pools hold a block in use (the others are empty: on their arena's free pool list)."""
        return self.count > 0

    def take(self, rows) -> "Pools":
        """The pools at ROWS (a mask or indices)."""
        return Pools(self.pool_size, self.address[rows], self.count[rows], self.freeblock[rows],
                     self.nextpool[rows], self.arena[rows], self.szidx[rows], self.nextoffset[rows])


def find_pools(mem: Memory, ranges: Iterable[tuple[int, int]]) -> Pools | None:
    """The pool headers in RANGES (each read in bulk, what cannot be read left out), at the pool size that has
    the most of them; None when there are none."""
    found = {size: [] for size in POOL_SIZES}
    for base, words in _pages(mem, ranges):
        addresses = base + np.arange(len(words), dtype=np.uint64) * np.uint64(_PAGE)
        for size in POOL_SIZES:
            at = (addresses % np.uint64(size)) == 0
            ok = _is_header(words[at], addresses[at], size)
            if ok.any():
                found[size].append((addresses[at][ok], words[at][ok]))
    size = max(POOL_SIZES, key=lambda s: sum(len(a) for a, _ in found[s]))
    if not found[size]:
        return None
    address = np.concatenate([a for a, _ in found[size]])
    words = np.concatenate([w for _, w in found[size]])
    order = np.argsort(address, kind="stable")
    address, words = address[order], words[order]
    low, high = _halves(words[:, 4])
    nextoffset, _ = _halves(words[:, 5])
    return Pools(size, address, _halves(words[:, 0])[0], words[:, 1].copy(), words[:, 2].copy(), low, high,
                 nextoffset)


def _pages(mem: Memory, ranges: Iterable[tuple[int, int]]) -> Iterator[tuple[int, np.ndarray]]:
    """(address, the first six words of each page) for the whole pages of RANGES that can be read, a window at
    a time."""
    for start, end in ranges:
        lo, hi = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
        for at in range(lo, hi, _WINDOW):
            for base, data in readable_runs(mem, at, min(_WINDOW, hi - at)):
                pages = len(data) // _PAGE
                if pages:
                    words = np.frombuffer(data, dtype=np.uint64, count=pages * _PAGE // 8)
                    yield base, words.reshape(pages, _PAGE // 8)[:, :6]


def _halves(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The low and high 4-byte halves of each 8-byte word, as int64."""
    return (words & np.uint64(0xFFFFFFFF)).astype(np.int64), (words >> np.uint64(32)).astype(np.int64)


def _is_header(words: np.ndarray, addresses: np.ndarray, size: int) -> np.ndarray:
    """Which rows of WORDS (six words from a pool-aligned ADDRESS) read as the header of a pool of SIZE bytes."""
    if not len(words):
        return np.zeros(0, dtype=bool)
    count = _halves(words[:, 0])[0]
    arena, szidx = _halves(words[:, 4])
    nextoffset, maxnext = _halves(words[:, 5])
    ok = (szidx < CLASSES) & (arena < _MAX_INDEX)
    block = block_size(np.where(ok, szidx, 0))
    ok &= maxnext == size - block
    ok &= (nextoffset >= HEADER) & (nextoffset <= maxnext + block) & ((nextoffset - HEADER) % block == 0)
    ok &= count <= (nextoffset - HEADER) // block
    head = words[:, 1]
    inside = (head >= addresses + np.uint64(HEADER)) & (head < addresses + np.uint64(size))
    offset = (head - addresses).astype(np.int64)
    ok &= (head == 0) | (inside & ((offset - HEADER) % block == 0))
    return ok
