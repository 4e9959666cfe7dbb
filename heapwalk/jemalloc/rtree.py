"""Which arena owns an address: jemalloc's radix tree of extents (x86-64, 48-bit addresses, two levels of 18
bits over the page number) maps every page of an extent to the extent's header, whose first word's low 12
bits are the arena's index.  Used to put each region a thread cache holds back in the arena it came from: a
thread that frees another thread's allocation caches it in its own tcache."""

from __future__ import annotations

import struct

from heapwalk.jemalloc.layout import JeLayout
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["ExtentMap"]

_LEVEL = 0x3FFFF


class ExtentMap:
    """Lookups of the arena that owns an address, with the leaves and extent headers read once each."""

    def __init__(self, mem: Memory, layout: JeLayout, rtree: int | None):
        self.mem, self.layout, self.rtree = mem, layout, rtree
        self._leaves: dict[int, int] = {}
        self._arenas: dict[int, int | None] = {}

    def arena_of(self, address: int) -> int | None:
        """The index of the arena whose extent holds ADDRESS (None: no tree, no extent, or unreadable)."""
        entry = self.lookup(address)
        if entry is None:
            return None
        extent = entry[0]
        try:
            if extent not in self._arenas:
                self._arenas[extent] = struct.unpack("<Q", self.mem.read(extent, 8))[0] & 0xFFF
        except ReadError:
            return None
        return self._arenas[extent]

    def lookup(self, address: int) -> tuple[int, int, bool] | None:
        """(extent, size class index, is a slab) the tree maps ADDRESS's page to (None: no tree, no extent,
        or unreadable)."""
        if self.rtree is None:
            return None
        try:
            return self._entry(address)
        except ReadError:
            return None

    def _entry(self, address: int) -> tuple[int, int, bool] | None:
        key = (address >> 30) & _LEVEL
        if key not in self._leaves:
            self._leaves[key] = struct.unpack("<Q", self.mem.read(self.rtree + self.layout.rtree_root + 8 * key,
                                                                  8))[0]
        leaf = self._leaves[key]
        if not leaf:
            return None
        bits, = struct.unpack("<Q", self.mem.read(leaf + 8 * ((address >> 12) & _LEVEL), 8))
        low48 = bits & (2**48 - 1)
        if low48 >> 47:
            low48 |= 0xFFFF << 48
        extent = low48 & ~self.layout.rtree_extent_mask
        return (extent, bits >> 48, bool(bits & 1)) if extent else None
