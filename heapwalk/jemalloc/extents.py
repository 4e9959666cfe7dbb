"""Every extent of every arena, found through jemalloc's radix tree of extents: the tree maps pages of each
extent (every page of a slab, the first and last of any other) to its header, so the distinct headers the
leaves name are the extents, active or not.  A header counts only where the tree maps its own first and last
pages back to it (a leaf entry left stale names a header that no longer describes that memory).

Each extent: where its pages start, its size, where its allocation starts in them, its arena, its state
(0 active, 1 dirty, 2 muzzy, 3 retained; 5.3.0 also 4 and 5 while it is being split or merged), whether it is
a slab, its size class and, for a slab, how many regions are free.
What a heap map of jemalloc draws (`jemalloc.heapmap`), and what the arenas' page counters must add up to."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from heapwalk.common.arrays import distinct
from heapwalk.common.findings import Finding, Severity
from heapwalk.jemalloc.kinds import Kind
from heapwalk.jemalloc.layout import JeLayout
from heapwalk.jemalloc.rtree import COMPACT_48, RtreeShape
from heapwalk.jemalloc.sizeclasses import SizeClasses, size_classes
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.inferior.ranges import adjacent_runs
from heapwalk.inferior.records import read_records

__all__ = ["ExtentTable", "walk_extents", "class_sizes", "extent_runs", "ACTIVE", "DIRTY", "MUZZY", "RETAINED"]

ACTIVE, DIRTY, MUZZY, RETAINED = 0, 1, 2, 3


@dataclass(frozen=True)
class ExtentTable:
    """The extents, one entry each in parallel arrays, in address order."""

    address: np.ndarray     # uint64: where its pages start
    size: np.ndarray        # int64
    offset: np.ndarray      # int64: where its allocation starts in its first page (cache_oblivious large ones)
    arena: np.ndarray       # int32
    state: np.ndarray       # uint8
    slab: np.ndarray        # bool
    szind: np.ndarray       # int32
    nfree: np.ndarray       # int32
    header: np.ndarray      # uint64: where its header (edata_t / extent_t) is
    classes: SizeClasses = size_classes(4)  # the build's size classes, which szind indexes
    paged_large: bool = False   # large allocations are rounded up to pages, not to their class (5.3.1's
    #                             opt.disable_large_size_classes)
    large_pad: int = 4096       # the page cache_oblivious adds to each large extent (0 without it)

    def __len__(self) -> int:
        return len(self.address)

    @property
    def page(self) -> int:
        """The build's page."""
        return self.classes.page

    def usizes(self, rows: np.ndarray) -> np.ndarray:
        """The usable size of the allocation each of ROWS (active extents) holds: a slab's region size, a large
        extent's class size; where large allocations are rounded up to pages only, a large extent less the
        page cache_oblivious adds (a sampled small allocation, held by a large extent, keeps its class)."""
        rows = np.asarray(rows, dtype=np.int64)
        table = class_sizes(self.classes)
        szind = self.szind[rows]
        sizes = table[np.clip(szind, 0, len(table) - 1)]
        if self.paged_large:
            large = ~self.slab[rows] & (szind >= self.classes.nbins)
            sizes = np.where(large, np.minimum(sizes, self.size[rows] - self.large_pad), sizes)
        return sizes

    def usize(self, row: int) -> int:
        """The usable size of the allocation extent ROW holds (`usizes`)."""
        return int(self.usizes(np.array([row]))[0])

    def bytes_of(self, arena: int, state: int) -> int:
        """The bytes of ARENA's extents in STATE."""
        return int(self.size[(self.arena == arena) & (self.state == state)].sum())


def extent_runs(address: np.ndarray, size: np.ndarray) -> list[tuple[int, int, int]]:
    """The extents at ADDRESS of SIZE bytes (uint64) as runs of adjacent ones, in address order: each run's start,
    end and how many extents it is."""
    return adjacent_runs(address, address + size.astype(np.uint64))


@functools.lru_cache(maxsize=None)
def class_sizes(classes: SizeClasses) -> np.ndarray:
    """Every size class's size, by index (sz_index2size), as an array."""
    return np.array([classes.class_size(i) for i in range(classes.nbins + classes.nlextents)], dtype=np.int64)


def walk_extents(mem: Memory, layout: JeLayout, rtree: int, shape: RtreeShape = COMPACT_48
                 ) -> tuple[ExtentTable, list[Finding]]:
    """Every extent the radix tree at RTREE (of SHAPE) maps, and findings for what could not be read or does not
    agree."""
    findings: list[Finding] = []
    leaves = _leaves(mem, layout, rtree, shape, findings)
    headers = distinct(np.concatenate(list(leaves.values()) or [np.zeros(0, dtype=np.uint64)]))
    headers = headers[headers != 0]       # pages no extent holds (an entry may keep bits besides the header's)
    got = read_records(mem, headers, 24)
    for row in sorted(got.errors):
        exc = got.errors[row]
        findings.append(Finding(Severity.ERROR, exc.address, "jemalloc extents", f"cannot read the extent "
                                f"header at {int(headers[row]):#x} the radix tree names: {exc.reason}", Kind.UNMAPPED))
    bits, address, size_esn = got.data.view("<u8").T if len(headers) else (np.zeros(0, dtype=np.uint64),) * 3
    page = layout.page
    size = size_esn & np.uint64(~(page - 1) & (2 ** 64 - 1))
    last = address + size - np.uint64(page)
    fits = (size != 0) & (size <= ~address)               # the extent's last page does not wrap past 2**64
    mapped = (_maps_many(leaves, shape, address) == headers) & (_maps_many(leaves, shape, last) == headers)
    good = got.readable & fits & mapped
    stale = int(np.count_nonzero(got.readable & ~good))
    if stale:
        findings.append(Finding(Severity.WARNING, rtree, "jemalloc extents", f"{stale} extent header(s) the radix "
                                "tree names are not mapped back by their own first and last pages: left out of the "
                                "maps", Kind.ARENA))
    rows = np.flatnonzero(good)
    rows = rows[np.argsort(address[rows] & np.uint64(~(page - 1) & (2 ** 64 - 1)), kind="stable")]
    bits, address, size = bits[rows], address[rows], size[rows]
    columns = (address & np.uint64(~(page - 1) & (2 ** 64 - 1)), size, address & np.uint64(page - 1),
               bits & np.uint64(0xFFF), (bits >> np.uint64(layout.extent_state_shift)) & np.uint64(layout.extent_state_mask),
               (bits >> np.uint64(12)) & np.uint64(1), (bits >> np.uint64(layout.extent_szind_shift)) & np.uint64(0xFF),
               (bits >> np.uint64(layout.extent_nfree_shift)) & np.uint64(layout.nfree_mask), headers[rows])
    table = ExtentTable(*(np.ascontiguousarray(c).astype(t) for c, t in zip(columns, (
        np.uint64, np.int64, np.int64, np.int32, np.uint8, bool, np.int32, np.int32, np.uint64))), layout.classes)
    return table, findings


def _leaves(mem: Memory, layout: JeLayout, rtree: int, shape: RtreeShape, findings: list[Finding]
            ) -> dict[int, np.ndarray]:
    """The tree's leaves by the address of the first page each covers: each an array of the header each of its
    pages maps to (0: none)."""
    nodes = [(rtree + layout.rtree_root, 0)]       # (where a level's array is, the page-number bits above it)
    for depth, bits in enumerate(shape.levels[:-1]):
        below = []
        for at, prefix in nodes:
            try:
                words = np.frombuffer(mem.read(at, 8 << bits), dtype=np.uint64)
            except ReadError as exc:
                what = "root" if depth == 0 else f"node at {at:#x}"
                findings.append(Finding(Severity.ERROR, exc.address, "jemalloc extents", f"cannot read the radix "
                                        f"tree's {what}: {exc.reason}", Kind.UNMAPPED))
                continue
            below += [(int(words[i]), prefix << bits | i) for i in np.flatnonzero(words).tolist()]
        nodes = below
    out = {}
    span = shape.leaf_shift
    for at, prefix in nodes:
        try:
            raw = mem.read(at, shape.entry_size << shape.leaf_bits)
        except ReadError as exc:
            findings.append(Finding(Severity.ERROR, exc.address, "jemalloc extents", f"cannot read a leaf of the "
                                    f"radix tree ({at:#x}): {exc.reason}", Kind.UNMAPPED))
            continue
        out[prefix << span] = shape.decode(raw, layout)[0]
    return out


def _maps_many(leaves: dict[int, np.ndarray], shape: RtreeShape, addresses: np.ndarray) -> np.ndarray:
    """The header the tree maps each of ADDRESSES' pages to (uint64; 0 where no leaf covers it)."""
    out = np.zeros(len(addresses), dtype=np.uint64)
    if not leaves or not len(addresses):
        return out
    span = np.uint64(shape.leaf_shift)
    bases = addresses >> span << span
    index = ((addresses >> np.uint64(shape.page_bits)) & np.uint64((1 << shape.leaf_bits) - 1)).astype(np.int64)
    keys = np.array(sorted(leaves), dtype=np.uint64)
    leaf = np.searchsorted(keys, bases)
    leaf[(leaf < len(keys)) & (keys[np.minimum(leaf, len(keys) - 1)] != bases)] = len(keys)
    order = np.argsort(leaf, kind="stable")
    bounds = np.searchsorted(leaf[order], np.arange(len(keys) + 1))
    for k in range(len(keys)):
        rows = order[bounds[k]:bounds[k + 1]]
        if len(rows):
            out[rows] = leaves[int(keys[k])][index[rows]]
    return out
