"""obmalloc as decoded: each arena with its pools, and the figures ``sys._debugmallocstats()`` prints, computed
as it computes them (a pool in use counts its blocks in use and the rest of its blocks as available; every
pool not in use is an unused pool; each pool in use loses its header and the remainder of its size over its
blocks; an arena whose start is not on a pool boundary loses one pool to alignment)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from heapwalk.cpython.pools import CLASSES, HEADER, Pools, block_size, blocks_per_pool
from heapwalk.common.findings import Finding

__all__ = ["ObArena", "ObClass", "ObState", "class_rows"]


@dataclass(frozen=True)
class ObArena:
    """One arena: its index in the arena table, where it starts (as mmap returned it) and its size, its pools
    (all, carved, in use), the pools it counts free, and its bytes by what holds them."""

    index: int
    address: int
    size: int
    first_pool: int
    pools: int                 # pools it can hold
    carved: int                # pools it has carved (the others were never touched)
    used: int                  # pools with a block in use
    nfreepools: int            # pools free, as the arena table says (the header count when it was not found)
    in_use: int                # bytes of blocks in use
    free_blocks: int           # bytes of available blocks in pools in use
    headers: int
    quantization: int
    alignment: int             # bytes before its first pool
    resident: int | None = None
    free_resident: int | None = None     # resident bytes of its free pools and of its pools' free blocks
    free_by_size: tuple = ()             # (block size, available blocks) of its pools in use

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def unused_pools(self) -> int:
        return self.pools - self.used

    @property
    def balanced(self) -> bool:
        """Whether its bytes add up to its size and the table's free pool count to the headers'."""
        pool = (self.size - self.alignment) // self.pools if self.pools else 0
        parts = self.in_use + self.free_blocks + self.unused_pools * pool + self.headers + self.quantization
        return parts + self.alignment == self.size and self.nfreepools == self.unused_pools


@dataclass(frozen=True)
class ObClass:
    """One size class: the block size, pools in use, blocks in use and available in them."""

    index: int
    size: int
    pools: int
    in_use: int
    available: int


@dataclass(frozen=True)
class ObState:
    """CPython's obmalloc in one target: the interpreter found, the geometry, each arena, each class."""

    target: str
    python: str                # "CPython 3.11.2 (/usr/bin/python3.11)"
    pool_size: int
    arena_size: int
    arenas: tuple[ObArena, ...]
    classes: tuple[ObClass, ...]
    table: int | None          # where the arena table is (None: not found)
    residency: str = ""
    findings: tuple[Finding, ...] = field(default=())

    def total(self, name: str) -> int:
        """The sum of one figure of `ObArena` over the arenas."""
        return sum(getattr(a, name) for a in self.arenas)

    @property
    def mapped(self) -> int:
        return sum(a.size for a in self.arenas)

    def figures(self) -> dict:
        """The totals ``sys._debugmallocstats()`` prints, by its names."""
        return {"arenas": len(self.arenas), "arena_size": self.arena_size, "pool_size": self.pool_size,
                "bytes_in_allocated_blocks": self.total("in_use"),
                "bytes_in_available_blocks": self.total("free_blocks"),
                "unused_pools": self.total("unused_pools"),
                "bytes_lost_to_pool_headers": self.total("headers"),
                "bytes_lost_to_quantization": self.total("quantization"),
                "bytes_lost_to_arena_alignment": self.total("alignment"),
                "total": self.mapped}


def class_rows(pools: Pools) -> tuple[ObClass, ...]:
    """The size classes of POOLS (those in use counted), every class listed."""
    used = pools.take(pools.used)
    npools = np.bincount(used.szidx, minlength=CLASSES)
    blocks = np.bincount(used.szidx, weights=used.count, minlength=CLASSES).astype(np.int64)
    room = np.bincount(used.szidx, weights=blocks_per_pool(used.szidx, pools.pool_size),
                       minlength=CLASSES).astype(np.int64)
    return tuple(ObClass(i, int(block_size(i)), int(npools[i]), int(blocks[i]), int(room[i] - blocks[i]))
                 for i in range(CLASSES))


def arena_figures(pools: Pools) -> dict:
    """The bytes the pools of one arena hold by what holds them (in use, available, headers, quantization)."""
    used = pools.take(pools.used)
    size = block_size(used.szidx)
    room = blocks_per_pool(used.szidx, pools.pool_size)
    return {"used": len(used), "in_use": int((used.count * size).sum()),
            "free_blocks": int(((room - used.count) * size).sum()), "headers": HEADER * len(used),
            "quantization": int(((pools.pool_size - HEADER) % size).sum()),
            "free_by_size": tuple((int(s), int(n)) for s, n in zip(size.tolist(), (room - used.count).tolist()))}
