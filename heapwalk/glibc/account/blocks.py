"""glibc's side of the leak scan: every chunk the program holds, as the neutral `view.Blocks`.

An arena the sweep vouches for gives its in-use chunks as arrays (those the one pass kept, `ChunkWalk.used`, or
from a sweep now, `sweptchunks`); any other goes through the
careful walk, and the stretches of its heaps that walk could not pass are handed over as memory of unknown
chunks, which the scan takes as a root (whatever they point to stays reached).  The tcache structs, the
arenas, heap_info and mp_ are malloc's own and never roots; the mmapped chunks in use are roots.

A chunk's usable memory, the range a pointer into it may point to, is [chunk + 16, chunk + size + 8): its
user memory and the next chunk's prev_size field, which an in-use chunk owns.
"""

from __future__ import annotations

import numpy as np

from heapwalk.glibc.walk.chunks import Listing, Tally, extents
from heapwalk.glibc.walk.chunkwalk import walk_batches
from heapwalk.glibc.bulk.indexlists import PLAIN
from heapwalk.glibc.bulk.onepass import HEADER, TAIL, lengths_fit
from heapwalk.glibc.locate.layout import Layout
from heapwalk.glibc.model import Arena, ChunkState, HeapState
from heapwalk.glibc.bulk.sweptchunks import listing_arrays, swept_chunks
from heapwalk.inferior.memory import Memory
from heapwalk.inferior.ranges import merged, ranges_without
from heapwalk.common.view import Blocks, index_type

__all__ = ["blocks_of", "HEADER", "TAIL"]



def blocks_of(mem: Memory, layout: Layout, state: HeapState, used: dict | None = None) -> Blocks:
    """Every in-use chunk of STATE's arenas (mmapped chunks aside), and which memory is malloc's (see the
    module).  USED, when given, holds the one pass's arrays of them by arena in place of STATE's walk's, and hands
    them over: each is taken out of it and let go once copied."""
    listing, listed = None, None
    addresses, sizes, numbers, unknown = [], [], [], []
    for arena in state.arenas:
        if not arena.lists_known and not arena.heaps:
            continue
        if used is not None:
            found = used.pop(arena.address, None)
        else:
            found = state.walk.used.get(arena.address) if state.walk is not None and state.walk.used else None
        if found is None:
            if listing is None:   # every list of every arena, as the careful walk sees them: made once, if needed
                listing = Listing.of_state(state)
                listed = listing_arrays(listing)
            swept = swept_chunks(mem, layout, arena, listed)
            if swept is not None:
                rows = np.flatnonzero(swept.codes == PLAIN)
                found = swept.sweep.address[rows], swept.sizes[rows].view(np.uint64)
            else:
                found, gaps = _walked(mem, layout, arena, listing)
                unknown.extend(gaps)
        addresses.append(found[0])
        sizes.append(found[1])
        numbers.append(arena.number)
    starts = [e.start for arena in state.arenas for e in extents(arena, layout)]
    first, lengths, number = _bounds(addresses, sizes, numbers, starts)
    del addresses, sizes, numbers
    return Blocks(first, None if lengths.dtype == np.uint32 else lengths, number, HEADER, TAIL,
                  heaps=tuple(_heaps(layout, state)), private=tuple(_private(layout, state)),
                  large=tuple(merged((c.address, c.address + c.size) for c in state.mmapped)),
                  unknown=tuple(merged(unknown)), lengths=lengths)


def _bounds(addresses: list[np.ndarray], sizes: list[np.ndarray], numbers: list[int],
            starts: list[int]) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """Each arena's chunks (each arena's sorted, NUMBERS the arenas'; SIZES their sizes, uint64, or the one pass's
    lengths, `onepass.in_use_lengths`) joined in address order, as the blocks' first usable bytes, their lengths
    (`view.LENGTH_UNIT`s, uint32; or their one-past-last usable bytes, uint64, where a size is too big or damaged
    for that) and arenas (the numbers, each block's index among them: as `view.Blocks` keeps them), written
    straight into the arrays the scan keeps; each arena's arrays are let go once copied.  An arena's heaps may lie
    between another's, so each arena's run is cut at the STARTS of every heap and the pieces, which do not
    overlap, put in order; when damage makes them overlap, every block is sorted."""
    total = sum(len(a) for a in addresses)
    compact = all(lengths_fit(s) for s in sizes)
    first = np.empty(total, dtype=np.uint64)
    end = np.empty(total, dtype=np.uint32 if compact else np.uint64)
    numbered = sorted(set(numbers))
    index = np.empty(total, dtype=index_type(len(numbered)))
    cuts = np.array(sorted(starts), dtype=np.uint64)
    pieces, left = [], [0] * len(addresses)
    for i, run in enumerate(addresses):
        at = [0, *np.searchsorted(run, cuts).tolist(), len(run)]
        pieces += [(int(run[a]), i, a, b) for a, b in zip(at, at[1:]) if b > a]
        left[i] = sum(1 for a, b in zip(at, at[1:]) if b > a)
    pieces.sort()
    k = 0
    for _, i, a, b in pieces:
        n = b - a
        np.add(addresses[i][a:b], np.uint64(HEADER), out=first[k:k + n])
        end[k:k + n] = _lengths_or_ends(addresses[i][a:b], sizes[i][a:b], compact)
        index[k:k + n] = numbered.index(numbers[i])
        k += n
        left[i] -= 1
        if not left[i]:
            addresses[i] = sizes[i] = None
    if total > 1 and not bool(np.all(first[1:] > first[:-1])):
        rows = np.argsort(first, kind="stable")
        first, end, index = first[rows], end[rows], index[rows]
    return first, end, (np.array(numbered, dtype=np.int32), index)


def _lengths_or_ends(address: np.ndarray, sizes: np.ndarray, compact: bool) -> np.ndarray:
    """The chunks at ADDRESS of SIZES (or lengths, `onepass.in_use_lengths`) as `_bounds` writes them: their lengths where
    COMPACT, else their one-past-last usable bytes."""
    if sizes.dtype == np.uint32:
        return sizes if compact else address + np.uint64(HEADER) + (sizes.astype(np.uint64) << np.uint64(3))
    if compact:
        return (sizes - np.uint64(HEADER - TAIL)) >> np.uint64(3)
    return address + sizes + np.uint64(TAIL)


def _walked(mem: Memory, layout: Layout, arena: Arena, listing: Listing
            ) -> tuple[tuple[np.ndarray, np.ndarray], list[tuple[int, int]]]:
    """ARENA's in-use chunks (addresses, sizes) through the careful walk, and the stretches it could not pass."""
    acc = Tally(arena.address, arena.system_mem)
    used: list[tuple[int, int]] = []
    gaps: list[tuple[int, int]] = []
    for extent in extents(arena, layout):
        seen: list[tuple[int, int]] = []
        for batch in walk_batches(mem, extent, arena.top, listing, acc, every=True,
                                   lists_known=arena.lists_known):
            for address, size, _, st in batch:
                seen.append((address, address + max(size, 16)))
                if st is ChunkState.IN_USE:
                    used.append((address, size))
        gaps.extend(ranges_without([(extent.first, extent.end)], seen))
    used.sort()
    return (np.array([a for a, _ in used], dtype=np.uint64), np.array([s for _, s in used], dtype=np.uint64)), gaps


def _heaps(layout: Layout, state: HeapState) -> list[tuple[int, int]]:
    """The memory of every arena's heaps (each main-arena piece, each thread heap up to its size)."""
    return merged((e.start, e.end) for arena in state.arenas for e in extents(arena, layout))


def _private(layout: Layout, state: HeapState) -> list[tuple[int, int]]:
    """malloc's bookkeeping outside the heaps' chunks: main_arena, mp_, and the rest of each thread heap's
    reservation (made writable once and kept, or not yet used)."""
    out = []
    if state.main_arena is not None:
        out.append((state.main_arena, state.main_arena + layout.arena_size))
    if state.mp is not None and layout.mp_size:
        out.append((state.mp.address, state.mp.address + layout.mp_size))
    for arena in state.arenas:
        if not arena.is_main:
            out.extend((h.address, h.address + state.heap_max_size) for h in arena.heaps)
    return merged(out)
