"""glibc's heaps as the strips of a heap map (`view.HeapStrip`): the main arena's memory, and each heap of a
thread arena from its heap_info up to the end of its reservation, every byte given to what holds it.

An arena the decode's one pass swept gives its heaps' runs as it kept them (`ChunkWalk.chunks`, `bulk.runs`),
which the strips take as they are; when it kept none, a sweep of its own (`sweptchunks`); any other goes
through the careful walk, and what that walk cannot pass is drawn as unwalked.  Between and around the
chunks: the heap's own headers (heap_info, a thread arena's malloc_state, alignment) and fenceposts are
overhead; after a thread heap's size comes the part made writable but not used yet (mprotect_size), then the
rest of the reservation, never made writable.
What malloc_trim(0) would give back comes from the same runs through `trim.TrimSimulation` (the report's
estimate, as ranges); resident pages from the target's residency, where it is known; the chunks the leak
scan found leaked, when it ran, from its answer.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from heapwalk.glibc.walk.chunks import Extent, Listing, Tally, extents
from heapwalk.glibc.walk.chunkwalk import walk_batches
from heapwalk.glibc.locate.layout import Layout
from heapwalk.glibc.model import Arena, ChunkState, HeapState
from heapwalk.glibc.bulk.runs import FENCE_GAP, GAP, HeapRuns, tile
from heapwalk.glibc.bulk.sweepwalk import STATE_OF_CODE
from heapwalk.glibc.bulk.sweptchunks import listing_arrays, swept_chunks
from heapwalk.glibc.walk.trim import TrimSimulation, trim_settings
from heapwalk.inferior.memory import Memory
from heapwalk.inferior.residency import Residency
from heapwalk.common.mapkinds import FREE, MAP_KINDS, MapKind, add_map_kind
from heapwalk.common.view import HeapStrip

__all__ = ["heap_strips", "KIND_OF_STATE", "TRIM_BAND"]

#: glibc's kinds of run on a heap map, each chunk one run (in use, headers and damage are every allocator's)
for _kind in (MapKind("tcache", "tcache", "#9edae5", "t", 20, FREE, True),
              MapKind("fast", "fastbin", "#17becf", "f", 30, FREE, True),
              MapKind("unsorted", "unsorted", "#bcbd22", "u", 40, FREE, True),
              MapKind("small", "small bin", "#2ca02c", "s", 50, FREE, True),
              MapKind("large", "large bin", "#98df8a", "l", 60, FREE, True),
              MapKind("top", "top", "#1f77b4", "T", 70, FREE, True),
              MapKind("tcache_struct", "tcache struct", "#8c564b", "c", 80, "", True)):
    add_map_kind(_kind)
#: what the band under a glibc strip shows
TRIM_BAND = "malloc_trim(0) gives back"
KIND = {name: i for i, name in enumerate(MAP_KINDS)}
#: each chunk state's kind on the map
KIND_OF_STATE = {ChunkState.IN_USE: KIND["in_use"], ChunkState.TCACHE: KIND["tcache"], ChunkState.FAST: KIND["fast"],
                 ChunkState.UNSORTED: KIND["unsorted"], ChunkState.SMALL: KIND["small"],
                 ChunkState.LARGE: KIND["large"], ChunkState.TOP: KIND["top"],
                 ChunkState.TCACHE_STRUCT: KIND["tcache_struct"], ChunkState.FENCEPOST: KIND["overhead"],
                 ChunkState.FREE_UNLISTED: KIND["unwalked"]}
_KIND_OF_CODE = np.zeros(256, dtype=np.uint8)
for _code, _state in STATE_OF_CODE.items():
    _KIND_OF_CODE[_code] = KIND_OF_STATE[_state]
_KIND_OF_CODE[GAP], _KIND_OF_CODE[FENCE_GAP] = KIND["unwalked"], KIND["overhead"]


def heap_strips(mem: Memory, layout: Layout, state: HeapState, reserved: bool = False, leaked=None
                ) -> list[HeapStrip]:
    """Every heap of every arena of STATE as a strip, in arena order; a thread heap's strip ends where its
    memory made writable ends, unless RESERVED asks for the whole reservation (the rest is `beyond`).  Each
    strip carries the ranges malloc_trim(0) would give back and, where the target says, its resident pages;
    the chunks in use at the addresses LEAKED holds (the leak scan's, when it ran) are of kind "leaked"."""
    kept = (state.walk.chunks if state.walk is not None else None) or {}
    listings: list = []          # the state's listing, made only for an arena the walk kept no chunks of

    def listed() -> tuple:
        if not listings:
            listing = Listing.of_state(state)
            listings.extend((listing, listing_arrays(listing)))
        return listings[0], listings[1]
    out = []
    for arena in state.arenas:
        if not arena.heaps:
            continue
        heap_extents = extents(arena, layout)
        if arena.address in kept and all(e.start in kept[arena.address] for e in heap_extents):
            runs, labels_of = kept[arena.address], _KIND_OF_CODE
        else:
            runs, labels_of = _runs(heap_extents, _chunks(mem, layout, arena, *listed())), None
        strips = []
        for n, (heap, extent) in enumerate(zip(arena.heaps, heap_extents)):
            label = "main arena" if arena.is_main else f"arena {arena.number} heap {n + 1}"
            if arena.is_main:
                tail, end, beyond = [], extent.end, 0
            else:
                writable = max(extent.end, heap.address + heap.mprotect_size)
                limit = max(writable, heap.address + state.heap_max_size)
                end = limit if reserved else writable
                tail, beyond = [(writable, KIND["unused"]), (end, KIND["reserved"])], limit - end
            starts, ends, kinds = runs[extent.start].strip(tail, KIND["overhead"], labels_of)
            strips.append(HeapStrip(arena.number, label, extent.start, end, starts, ends, kinds, band=TRIM_BAND,
                                    beyond=beyond))
        out.extend(_with_trim(strips, _trimmed(mem, layout, state, arena, strips)))
    return _with_leaks(_with_residency(out, state.residency), leaked)


def _with_leaks(strips: list[HeapStrip], leaked) -> list[HeapStrip]:
    """STRIPS, with each chunk in use whose address LEAKED holds (None: no leak scan ran) made "leaked"."""
    if leaked is None or not len(leaked):
        return strips
    leaked = np.sort(np.asarray(leaked, dtype=np.uint64))
    out = []
    for strip in strips:
        rows = np.flatnonzero(strip.kinds == KIND["in_use"])
        at = np.minimum(np.searchsorted(leaked, strip.run_starts[rows]), len(leaked) - 1)
        hit = rows[leaked[at] == strip.run_starts[rows]]
        if len(hit):
            kinds = strip.kinds.copy()
            kinds[hit] = KIND["leaked"]
            strip = replace(strip, kinds=kinds)
        out.append(strip)
    return out


def _trimmed(mem: Memory, layout: Layout, state: HeapState, arena: Arena, strips: list[HeapStrip]
             ) -> np.ndarray:
    """The [start, end) ranges malloc_trim(0) would give back from ARENA, as (n, 2) uint64, sorted: its
    STRIPS' runs of free chunks as consolidation merges them, fed to `TrimSimulation`."""
    thp, contiguous = trim_settings(state.mp)
    sim = TrimSimulation(mem, layout, arena, thp, contiguous and not arena.noncontiguous, state.residency,
                         page=state.page_size)
    runnable = np.zeros(len(MAP_KINDS), dtype=bool)
    runnable[[KIND["unsorted"], KIND["small"], KIND["large"]] + ([KIND["fast"]] if layout.has_fastbins else [])] = True
    runs: list[tuple[int, int]] = []
    for strip in strips:
        last = None                      # the strip's last stretch: (first, past, start, end, whether kept in RUNS)
        for firsts, pasts in _stretches(strip.kinds, runnable):
            starts, ends = strip.run_starts[firsts], strip.run_ends[pasts - 1]
            sizes = (ends - starts).astype(np.int64)
            whole = np.flatnonzero(sizes > sim.sub_page)
            runs.extend(zip(starts[whole].tolist(), sizes[whole].tolist()))
            last = (int(firsts[-1]), int(pasts[-1]), int(starts[-1]), int(ends[-1]),
                    bool(len(whole)) and int(whole[-1]) == len(sizes) - 1)
        if last is None:
            continue
        first, past, start, end, kept = last
        if past < len(strip.kinds) and strip.kinds[past] == KIND["top"] and \
                bool((strip.kinds[first:past] == KIND["fast"]).any()):
            sim.top_start, sim.top_size = start, sim.top_size + end - start
            if kept:                     # consolidation takes the last stretch into top
                runs.pop()
    sim.take(runs, 0, 0)
    released = sorted(sim.released())
    return np.array(released, dtype=np.uint64).reshape(-1, 2)


#: runs of a strip `_stretches` looks at at once (what it makes meanwhile: a few bytes a run of them)
_STEP = 1 << 18


def _stretches(kinds: np.ndarray, runnable: np.ndarray, step: int = _STEP):
    """The stretches of consecutive runs whose KINDS RUNNABLE (a bool a kind) marks, as (firsts, pasts): each
    stretch's first run and the run past its last (int64, ascending), STEP runs at a time, each stretch given
    with the step it ends in."""
    n, carried = len(kinds), -1          # CARRIED: a stretch begun in a step before, not ended yet
    for at in range(0, n, step):
        marked = runnable[kinds[at:at + step]]
        before = np.empty(len(marked), dtype=bool)
        before[0], before[1:] = at > 0 and bool(runnable[kinds[at - 1]]), marked[:-1]
        after = np.empty(len(marked), dtype=bool)
        after[-1], after[:-1] = at + step < n and bool(runnable[kinds[at + step]]), marked[1:]
        firsts = np.flatnonzero(marked & ~before) + at
        pasts = np.flatnonzero(marked & ~after) + (at + 1)
        if carried >= 0:
            firsts = np.concatenate((np.array([carried], dtype=np.int64), firsts))
        carried = int(firsts[-1]) if len(firsts) > len(pasts) else -1
        if carried >= 0:
            firsts = firsts[:-1]
        if len(pasts):
            yield firsts, pasts


def _with_trim(strips: list[HeapStrip], released: np.ndarray) -> list[HeapStrip]:
    """STRIPS, each with the RELEASED ranges that fall in it."""
    out = []
    for strip in strips:
        inside = (released[:, 0] >= strip.start) & (released[:, 1] <= strip.end)
        out.append(replace(strip, trimmable=released[inside]))
    return out


def _with_residency(strips: list[HeapStrip], residency: Residency | None) -> list[HeapStrip]:
    """STRIPS, each with its resident runs when RESIDENCY knows them."""
    if residency is None:
        return strips
    known = residency.covering([(s.start, s.end) for s in strips])
    return [replace(s, resident=known.within(s.start, s.end).astype(np.uint64)) for s in strips]


def _chunks(mem: Memory, layout: Layout, arena: Arena, listing: Listing, listed
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ARENA's chunks: (addresses, ends, kinds), in address order; the stretches the careful walk could not
    pass are left out (drawn as unwalked)."""
    swept = swept_chunks(mem, layout, arena, listed)
    if swept is not None:
        return _in_order(swept.sweep.address, swept.sizes, swept.codes)
    rows: list[tuple[int, int, int]] = []
    acc = Tally(arena.address, arena.system_mem)
    for extent in extents(arena, layout):
        for batch in walk_batches(mem, extent, arena.top, listing, acc, every=True, lists_known=arena.lists_known):
            rows.extend((address, address + max(size, 16), KIND_OF_STATE[st]) for address, size, _, st in batch)
    rows.sort()
    return (np.array([r[0] for r in rows], dtype=np.uint64), np.array([r[1] for r in rows], dtype=np.uint64),
            np.array([r[2] for r in rows], dtype=np.uint8))


def _in_order(address: np.ndarray, sizes: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Swept chunks (addresses, sizes, listing codes as the walk left them) as (addresses, ends, kinds), in
    address order."""
    address, kinds = np.asarray(address, dtype=np.uint64), _KIND_OF_CODE[codes]
    if len(address) > 1 and not bool(np.all(address[1:] > address[:-1])):   # heaps swept out of order
        order = np.argsort(address, kind="stable")
        address, sizes, kinds = address[order], sizes[order], kinds[order]
    return address, address + np.asarray(sizes).view(np.uint64), kinds


def _runs(heap_extents: list[Extent], chunks: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[int, HeapRuns]:
    """Each of HEAP_EXTENTS' runs (by its start) from its arena's CHUNKS (addresses, ends, kinds; sorted)."""
    address, ends, kinds = chunks
    out = {}
    for extent in heap_extents:
        lo = np.searchsorted(address, np.uint64(extent.first))
        hi = np.searchsorted(address, np.uint64(extent.end))
        out[extent.start] = tile(extent.start, extent.first, extent.end, address[lo:hi], ends[lo:hi],
                                 kinds[lo:hi], KIND["unwalked"], KIND["overhead"], KIND["overhead"])
    return out
