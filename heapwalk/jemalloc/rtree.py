"""Which extent holds an address: jemalloc's radix tree of extents maps every page of an extent to the extent's
header, whose first word's low 12 bits are the arena's index.  Used to put each region a thread cache holds
back in the arena it came from (a thread that frees another thread's allocation caches it in its own tcache),
to check that it lies in a slab of its size class, and to walk every extent (`jemalloc.extents`).

The tree's shape is the build's, set by the virtual address width jemalloc was configured for (LG_VADDR,
which its configure takes from the build machine's CPU) and its page (LG_PAGE): the tree is keyed by the page
number, split into two levels when it has at most 36 bits (the second one the longer by the odd bit), three
(the last the longest) up to 52:

- 48 bits, 4 KiB pages: two levels of 18 bits; with 64 KiB pages, two of 16; a leaf entry is one word, the
  header's address with the size class in its top 16 bits and the slab flag in bit 0 ("compact");
- 57 bits (5-level paging), 4 KiB pages: three levels of 15 bits; a leaf entry is 16 bytes, the header's
  address then a 32-bit word: in 5.2.1 the size class, then the slab flag in the next byte; in 5.3.0 the slab
  flag in bit 0, the state in bits 2-4 and the size class from bit 5.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from heapwalk.jemalloc.layout import JeLayout
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["ExtentMap", "RtreeShape", "COMPACT_48", "WIDE_57", "SHAPES", "LEAF_SHIFTS", "shape_for", "shape_keyed_by"]

_ADDRESS = (1 << 48) - 1
#: the address widths a build may be configured for, the usual first
_VADDR_BITS = (48, 57, 52)


@dataclass(frozen=True)
class RtreeShape:
    """The levels of a radix tree (bits of the page number each consumes, root first), whether its leaf
    entries are 16 bytes (an address and a word of metadata) rather than one word, and the page bits below the
    key."""

    levels: tuple[int, ...]
    wide: bool
    page_bits: int = 12
    sign_extended: bool = True      # a compact entry's bit 47 is extended upwards (where user addresses end
    #                                 below it); else the bits above 48 are zero (the 48 bits hold them all)

    @property
    def leaf_bits(self) -> int:
        return self.levels[-1]

    @property
    def leaf_shift(self) -> int:
        """The shift that keys a leaf: what the lookup code keys its cache of leaves by (address >> it)."""
        return self.page_bits + self.leaf_bits

    @property
    def entry_size(self) -> int:
        return 16 if self.wide else 8

    def leaf_of(self, address: int) -> tuple[int, int]:
        """(the address of the first page the leaf holding ADDRESS covers, ADDRESS's entry in it)."""
        span = self.leaf_shift
        return address >> span << span, (address >> self.page_bits) & ((1 << self.leaf_bits) - 1)

    def path(self, address: int) -> list[int]:
        """ADDRESS's index at each level above the leaves, root first."""
        shift = self.page_bits + sum(self.levels)
        out = []
        for bits in self.levels[:-1]:
            shift -= bits
            out.append((address >> shift) & ((1 << bits) - 1))
        return out

    def decode(self, raw: bytes, layout: JeLayout) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The (header, size class, slab) of each entry of the leaf RAW, as arrays."""
        if not self.wide:
            words = np.frombuffer(raw, dtype=np.uint64)
            low = words & np.uint64(_ADDRESS & ~layout.rtree_extent_mask)
            if not self.sign_extended:
                return low, (words >> np.uint64(48)).astype(np.int64), (words & np.uint64(1)).astype(bool)
            high = (low >> np.uint64(47)) * np.uint64(0xFFFF << 48)    # addresses above 2**47 sign-extended
            return low | high, (words >> np.uint64(48)).astype(np.int64), (words & np.uint64(1)).astype(bool)
        entries = np.frombuffer(raw, dtype=np.dtype([("edata", "<u8"), ("meta", "<u4"), ("more", "<u4")]))
        if layout.rtree_meta_packed:
            meta = entries["meta"].astype(np.int64)
            return entries["edata"], meta >> 5, (meta & 1).astype(bool)
        return entries["edata"], entries["meta"].astype(np.int64), (entries["more"] & 0xFF).astype(bool)


def shape_for(vaddr_bits: int, page_bits: int = 12, user_space_end: int = 1 << 47) -> RtreeShape:
    """The tree of a build for VADDR_BITS-bit addresses and 2**PAGE_BITS pages, on an architecture whose
    processes' addresses end at USER_SPACE_END; its entries are one word where the address leaves 16 bits above
    it for the size class."""
    key = vaddr_bits - page_bits
    levels = (key,) if key <= 10 else (key // 2, key - key // 2) if key <= 36 else (key // 3, key // 3,
                                                                                       key - 2 * (key // 3))
    return RtreeShape(levels, vaddr_bits > 48, page_bits, user_space_end <= 1 << 47)


def shape_keyed_by(shift: int, page_bits: int = 12, user_space_end: int = 1 << 47) -> RtreeShape | None:
    """The shape of a build for 2**PAGE_BITS pages whose lookup code keys its leaves by address >> SHIFT (None:
    no address width heapwalk knows gives that), on an architecture whose addresses end at USER_SPACE_END."""
    return next((s for s in (shape_for(v, page_bits, user_space_end) for v in _VADDR_BITS)
                 if s.leaf_shift == shift), None)


COMPACT_48 = shape_for(48)
WIDE_57 = shape_for(57)
#: the shape of a 4 KiB page build's tree by the shift its lookup code keys its cache of leaves with
SHAPES = {COMPACT_48.leaf_shift: COMPACT_48, WIDE_57.leaf_shift: WIDE_57}
LEAF_SHIFTS = tuple(SHAPES)


class ExtentMap:
    """Lookups of the extent, and the arena, that hold an address, with the tree's nodes and the extent headers
    read once each."""

    def __init__(self, mem: Memory, layout: JeLayout, rtree: int | None, shape: RtreeShape = COMPACT_48):
        self.mem, self.layout, self.rtree, self.shape = mem, layout, rtree, shape
        self._nodes: dict[tuple[int, ...], int] = {}
        self._arenas: dict[int, int | None] = {}
        self._leaves: dict[int, tuple[list[int], list[int], list[bool]] | None] = {}
        self._leaf_nodes: dict[int, int] = {}

    def know(self, headers: np.ndarray, arenas: np.ndarray) -> None:
        """Takes the arena of each extent whose header is at HEADERS as ARENAS says (the extents' table read their
        headers' first words already): `arena_of_entry` reads only the others."""
        self._arenas.update(zip(headers.tolist(), arenas.tolist()))

    def arena_of(self, address: int) -> int | None:
        """The index of the arena whose extent holds ADDRESS (None: no tree, no extent, or unreadable)."""
        return self.arena_of_entry(self.lookup(address))

    def arena_of_entry(self, entry: tuple[int, int, bool] | None) -> int | None:
        """The index of the arena of the extent ENTRY (`lookup`'s answer) names (None: none, or unreadable)."""
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

    def lookup_many(self, addresses: list[int]) -> list[tuple[int, int, bool] | None]:
        """`lookup` of each of ADDRESSES (a thread cache's thousands of regions): those of a leaf read whole
        answered from its columns at once, the others one by one."""
        if self.rtree is None:
            return [None] * len(addresses)
        shift, page_bits, mask = self.shape.leaf_shift, self.shape.page_bits, (1 << self.shape.leaf_bits) - 1
        out = []
        for address in addresses:
            node = self._leaf_nodes.get(address >> shift << shift)
            leaf = self._leaves.get(node) if node else None
            if leaf is None:
                out.append(self.lookup(address))
                continue
            index = (address >> page_bits) & mask
            extent = leaf[0][index]
            out.append((extent, leaf[1][index], leaf[2][index]) if extent else None)
        return out

    def _entry(self, address: int) -> tuple[int, int, bool] | None:
        base, index = self.shape.leaf_of(address)
        node = self._leaf_nodes.get(base)
        if node is None:
            node = self._leaf_nodes[base] = self._leaf_node(address)
        if not node:
            return None
        leaf = self._leaf(node)
        if leaf is not None:
            extent = leaf[0][index]
            return (extent, leaf[1][index], leaf[2][index]) if extent else None
        size = self.shape.entry_size
        headers, szind, slab = self.shape.decode(self.mem.read(node + size * index, size), self.layout)
        extent = int(headers[0])
        return (extent, int(szind[0]), bool(slab[0])) if extent else None

    def _leaf_node(self, address: int) -> int:
        """The address of the leaf that covers ADDRESS (0: none), the nodes on the way read once each."""
        node = self.rtree + self.layout.rtree_root
        path = self.shape.path(address)
        for depth, index in enumerate(path):
            key = tuple(path[:depth + 1])
            if key not in self._nodes:
                self._nodes[key] = struct.unpack("<Q", self.mem.read(node + 8 * index, 8))[0]
            node = self._nodes[key]
            if not node:
                return 0
        return node

    def _leaf(self, node: int) -> tuple[list[int], list[int], list[bool]] | None:
        """The leaf at NODE decoded whole, read once (None when it cannot be read whole: then entry by entry)."""
        if node not in self._leaves:
            try:
                raw = self.mem.read(node, self.shape.entry_size << self.shape.leaf_bits)
                self._leaves[node] = tuple(column.tolist() for column in self.shape.decode(raw, self.layout))
            except ReadError:
                self._leaves[node] = None
        return self._leaves[node]
