"""jemalloc's extents as the strips of a heap map (`view.HeapStrip`): each arena's extents in address order,
a strip for each stretch of them that follows on without a gap (what the arena mapped in one piece and
split).  An extent is drawn by its state: a large allocation in use (and the padding page cache_oblivious gives
it, as headers), a slab (its regions in use first, then its free regions: their bytes are exact, their
order inside the slab is not), dirty pages (freed, resident
until decay purges them), muzzy pages (purged lazily), retained address space (mapped, not resident).  The
resident pages come from the target's residency where it is known; trim has no meaning here (the dirty and
muzzy extents are what decay would give back).  The regions threads' caches hold are drawn as such, after
what the extent holds in use (free to the program, as the report's "free: tcache" counts them); after a leak
scan, the leaked bytes of each extent are drawn as leaked (their bytes are exact, their place in a slab is
not)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from heapwalk.jemalloc.extents import ACTIVE, DIRTY, MUZZY, RETAINED, ExtentTable
from heapwalk.inferior.residency import Residency
from heapwalk.common.mapkinds import FREE, MAP_KINDS, MapKind, add_map_kind
from heapwalk.common.view import HeapStrip

__all__ = ["extent_strips", "held_bytes", "leaked_bytes", "sampled", "sampled_extents"]

#: jemalloc's kinds of run on a heap map: a slab's free regions, and the extents freed to decay or kept unmapped
for _kind in (MapKind("slab_free", "free regions in slabs", "#9467bd", "r", 130, FREE),
              MapKind("tcache_regions", "regions in thread caches", "#17becf", "c", 125, FREE),
              MapKind("dirty", "dirty pages", "#ff9896", "d", 140, FREE, True),
              MapKind("muzzy", "muzzy pages", "#c5b0d5", "m", 150, FREE, True),
              MapKind("retained", "retained (not resident)", "#e7e7e7", ",", 160, "", True)):
    add_map_kind(_kind)
KIND = {name: i for i, name in enumerate(MAP_KINDS)}
_OF_STATE = {ACTIVE: KIND["in_use"], DIRTY: KIND["dirty"], MUZZY: KIND["muzzy"], RETAINED: KIND["retained"]}


def held_bytes(table: ExtentTable) -> np.ndarray:
    """The bytes of each extent the program's allocation holds: an active slab's regions in use, an active large
    extent's usable size (its class's, or 5.3.1's page-rounded size: the rest of its pages is the page
    cache_oblivious adds), a small allocation that heap
    profiling sampled the smallest large class (it is served by such an extent, counted as one), any other
    extent's size."""
    classes = table.classes
    nbins = classes.nbins
    regions = np.array([c.size for c in classes.bins], dtype=np.int64)
    nregs = np.array([c.nregs for c in classes.bins], dtype=np.int64)
    slab = table.slab & (table.state == ACTIVE) & (table.szind < nbins)
    large = ~table.slab & (table.state == ACTIVE)     # sampled small ones too, as the smallest large class
    index = np.clip(table.szind, 0, nbins - 1)
    used = (nregs[index] - np.clip(table.nfree, 0, nregs[index])) * regions[index]
    usize = np.where(table.szind >= nbins, table.usizes(np.arange(len(table))), classes.large_size(0))
    usize = np.where(large, usize, 0)
    room = table.size - table.offset
    return np.where(slab, np.minimum(used, table.size), np.where(large, np.minimum(usize, room), table.size))


def sampled_extents(table: ExtentTable) -> np.ndarray:
    """Which active extents serve one small allocation each: those heap profiling sampled (prof:true), which
    jemalloc promotes to an extent of the smallest large class that keeps the small class's index."""
    return ~table.slab & (table.state == ACTIVE) & (table.szind < table.classes.nbins)


def sampled(table: ExtentTable) -> int:
    """How many extents heap profiling's sampled allocations hold (`sampled_extents`)."""
    return int(sampled_extents(table).sum())


def leaked_bytes(table: ExtentTable, leaked: np.ndarray | None) -> np.ndarray:
    """The bytes of each extent's allocations at the addresses LEAKED holds (the leak scan's leaked blocks, or
    the regions thread caches hold): a slab's regions, a large extent's allocation."""
    out = np.zeros(len(table), dtype=np.int64)
    if leaked is None or not len(leaked) or not len(table):
        return out
    leaked = np.asarray(leaked, dtype=np.uint64)
    rows = np.searchsorted(table.address, leaked, side="right") - 1
    inside = rows >= 0
    rows = rows[inside]
    rows = rows[leaked[inside] < table.address[rows] + table.size[rows].astype(np.uint64)]
    sizes = table.usizes(rows)
    np.add.at(out, rows, sizes)
    return out


def extent_strips(table: ExtentTable, residency: Residency | None = None, leaked: np.ndarray | None = None,
                  cached: np.ndarray | None = None) -> list[HeapStrip]:
    """Every arena's extents as strips, arena by arena, each stretch without a gap a strip; the regions at the
    addresses CACHED holds (the thread caches') are drawn as cached, the allocations at those LEAKED holds (the
    leak scan's, when it ran) as leaked."""
    out = []
    used = held_bytes(table)
    kept = np.minimum(leaked_bytes(table, cached), used)
    lost = np.minimum(leaked_bytes(table, leaked), used - kept)
    for arena in np.unique(table.arena).tolist():
        rows = np.flatnonzero(table.arena == arena)
        starts = table.address[rows]
        ends = starts + table.size[rows].astype(np.uint64)
        breaks = np.flatnonzero(starts[1:] != ends[:-1]) + 1
        for n, (lo, hi) in enumerate(zip(np.concatenate(([0], breaks)).tolist(),
                                         np.concatenate((breaks, [len(rows)])).tolist())):
            out.append(_strip(table, rows[lo:hi], used, lost, kept, arena,
                              f"jemalloc arena {arena} extents {n + 1}"))
    if residency is None:
        return out
    known = residency.covering([(s.start, s.end) for s in out])
    return [replace(s, resident=known.within(s.start, s.end).astype(np.uint64)) for s in out]


def _strip(table: ExtentTable, rows: np.ndarray, used: np.ndarray, lost: np.ndarray, kept: np.ndarray, arena: int,
           label: str) -> HeapStrip:
    """The strip of the extents ROWS (following one another): a run per extent by its state; an active one in
    up to five: the page cache_oblivious puts before a large allocation, what the program holds, what thread
    caches hold of its regions (KEPT bytes), what of it is leaked (LOST bytes), and the rest (a slab's free
    regions, a large extent's padding)."""
    starts, sizes = table.address[rows], table.size[rows].astype(np.uint64)
    offsets = table.offset[rows].astype(np.uint64)
    cached = kept[rows].astype(np.uint64)
    held = used[rows].astype(np.uint64) - cached
    gone = lost[rows].astype(np.uint64)
    kinds = np.array([_OF_STATE.get(int(s), KIND["unwalked"]) for s in table.state[rows].tolist()], dtype=np.uint8)
    rest = np.where(table.slab[rows], KIND["slab_free"], KIND["overhead"]).astype(np.uint8)
    begin = starts + offsets
    pieces = [(starts, begin, np.full(len(rows), KIND["overhead"], dtype=np.uint8)),
              (begin, begin + held - gone, kinds), (begin + held - gone, begin + held,
                                                    np.full(len(rows), KIND["leaked"], dtype=np.uint8)),
              (begin + held, begin + held + cached, np.full(len(rows), KIND["tcache_regions"], dtype=np.uint8)),
              (begin + held + cached, starts + sizes, rest)]
    run_starts = np.concatenate([p[0] for p in pieces])
    run_ends = np.concatenate([p[1] for p in pieces])
    run_kinds = np.concatenate([p[2] for p in pieces])
    keep = run_ends > run_starts
    order = np.argsort(run_starts[keep], kind="stable")
    return HeapStrip(arena, label, int(starts[0]), int(starts[-1] + sizes[-1]), run_starts[keep][order],
                     run_ends[keep][order], run_kinds[keep][order])
