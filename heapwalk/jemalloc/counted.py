"""What a build without statistics (``--disable-stats``, tikv-jemallocator's default) would have counted,
counted instead from the extents the radix tree maps: per arena, each small class's slabs (regions in use from
each slab's free count, slabs not full), each large class's allocations alive, and the free extents of each
page size class (binned as jemalloc bins
it).  The counts of operations (allocations, frees, fills, flushes, purges) are not in memory: they stay None.

On a build with statistics the same counts equal the statistics (tests/test_jemalloc_nostats.py holds them
so), which is what makes them trustworthy where there are none."""

from __future__ import annotations

import numpy as np

from heapwalk.jemalloc.extents import ACTIVE, DIRTY, MUZZY, RETAINED, ExtentTable, class_sizes
from heapwalk.jemalloc.model import JeBin, JeExtents, JeLarge, JeState

__all__ = ["count_bins", "count_large", "count_extents", "regions_held"]


def count_bins(table: ExtentTable, arena: int, slabcur: frozenset[int] = frozenset()) -> tuple[JeBin, ...]:
    """ARENA's small classes counted from its active slabs: regions in use, slabs, slabs not full (the slab each
    bin allocates from now, whose headers are SLABCUR, is not among those jemalloc calls not full)."""
    classes = table.classes
    mine = (table.arena == arena) & (table.state == ACTIVE) & table.slab & (table.szind < classes.nbins)
    index = table.szind[mine]
    nregs = np.array([c.nregs for c in classes.bins], dtype=np.int64)
    nfree = np.clip(table.nfree[mine].astype(np.int64), 0, nregs[index])
    used = np.bincount(index, weights=nregs[index] - nfree, minlength=classes.nbins).astype(np.int64)
    slabs = np.bincount(index, minlength=classes.nbins)
    current = np.isin(table.header[mine], np.array(sorted(slabcur), dtype=np.uint64))
    nonfull = np.bincount(index[(nfree > 0) & ~current], minlength=classes.nbins)
    return tuple(JeBin(i, c.size, c.nregs, None, None, None, int(used[i]), None, None, None, None, int(slabs[i]),
                       int(nonfull[i]), c.pages) for i, c in enumerate(classes.bins))


def count_large(table: ExtentTable, arena: int) -> tuple[JeLarge, ...]:
    """ARENA's large classes: the active extents of each (a small allocation heap profiling sampled is served by
    an extent of the smallest large class, and counts as one)."""
    classes = table.classes
    mine = np.flatnonzero((table.arena == arena) & (table.state == ACTIVE) & ~table.slab)
    index = np.maximum(table.szind[mine] - classes.nbins, 0)
    live = np.bincount(index, minlength=classes.nlextents)
    active = np.bincount(index, weights=table.usizes(mine), minlength=classes.nlextents).astype(np.int64) \
        if table.paged_large else None
    return tuple(JeLarge(classes.large_size(i), None, None, None, None, live=int(live[i]),
                         active_bytes=None if active is None else int(active[i]))
                 for i in range(classes.nlextents))


def count_extents(table: ExtentTable, arena: int, large_pad: int | None = None) -> tuple[JeExtents, ...]:
    """ARENA's dirty, muzzy and retained extents by page size class: how many, and their bytes.  jemalloc bins an
    extent by the largest class that fits in it less LARGE_PAD (the page cache_oblivious adds to each large
    allocation; the table's by default), rounded up to a class again: with the pad, the class after the largest one a page smaller
    than the extent."""
    large_pad = table.large_pad if large_pad is None else large_pad
    sizes = np.array(table.classes.page_sizes(), dtype=np.int64)
    counted = []
    for state in (DIRTY, MUZZY, RETAINED):
        mine = (table.arena == arena) & (table.state == state)
        if large_pad:
            index = np.searchsorted(sizes + large_pad, table.size[mine], side="right")
        else:
            index = np.searchsorted(sizes, table.size[mine], side="right") - 1
        index = np.clip(index, 0, len(sizes) - 1)
        counted.append((np.bincount(index, minlength=len(sizes)),
                        np.bincount(index, weights=table.size[mine], minlength=len(sizes)).astype(np.int64)))
    (nd, bd), (nm, bm), (nr, br) = counted
    return tuple(JeExtents(int(nd[i]), int(nm[i]), int(nr[i]), int(bd[i]), int(bm[i]), int(br[i]))
                 for i in range(len(sizes)))


def regions_held(state: JeState) -> dict[int, dict[int, int]]:
    """What the program holds, by arena and size class (arena -> {class size: regions}; a large allocation by
    its own size where large allocations are rounded up to pages only, 5.3.1): each arena's regions in use and
    large allocations, less the regions the thread caches hold and jemalloc's own allocations for its
    threads (`JeThread.internal`); empty when the extents are not known."""
    table = state.extents
    if table is None or not len(table):
        return {}
    classes = table.classes
    nclasses = classes.nbins + classes.nlextents
    nregs = np.array([c.nregs for c in classes.bins] + [1], dtype=np.int64)
    small = table.slab & (table.szind < classes.nbins)
    index = np.where(small, table.szind, np.clip(table.szind, classes.nbins, nclasses - 1)).astype(np.int64)
    count = np.where(small, nregs[np.minimum(table.szind, classes.nbins)] - np.maximum(table.nfree, 0), 1)
    count = np.where(table.state == ACTIVE, count, 0)
    taken = [address for t in state.threads for address in t.internal] + list(state.cached)
    rows = np.array([r for r in _extent_rows(table, taken) if r >= 0], dtype=np.int64)
    count = count - np.bincount(rows, minlength=len(table))[:len(table)] * (table.state == ACTIVE)
    size = class_sizes(classes)[index]
    if table.paged_large:
        size = np.where(small, size, table.usizes(np.arange(len(table))))
    live = count > 0
    keys, where = np.unique(np.stack([table.arena[live].astype(np.int64), size[live]]), axis=1, return_inverse=True)
    totals = np.bincount(where.reshape(-1), weights=count[live]).astype(np.int64)
    out: dict[int, dict[int, int]] = {}
    for (arena, held), total in zip(keys.T.tolist(), totals.tolist()):
        out.setdefault(arena, {})[held] = out.get(arena, {}).get(held, 0) + total
    return out


def _extent_rows(table: ExtentTable, addresses: list[int]) -> list[int]:
    """The row of the extent holding each address (-1: none)."""
    if not addresses:
        return []
    at = np.array(addresses, dtype=np.uint64)
    rows = np.searchsorted(table.address, at, side="right") - 1
    ends = table.address + table.size.astype(np.uint64)
    inside = (rows >= 0) & (at < ends[np.maximum(rows, 0)])
    return np.where(inside, rows, -1).tolist()
