"""Questions about single chunks: which chunks match a filter, and what is known about the chunk at an address."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from heapwalk.glibc.walk.chunks import Chunk, Listing, Tally, extents
from heapwalk.glibc.model import FREE_STATES, ChunkState
from heapwalk.glibc.walk.chunkwalk import walk_batches, walk_extent
from heapwalk.glibc.locate.layout import Layout
from heapwalk.glibc.bulk.sweptchunks import Sweeper, listing_arrays, swept_chunks
from heapwalk.inferior.memory import Memory
from heapwalk.glibc.model import Arena, HeapState

__all__ = ["ChunkFilter", "chunks", "matching", "Matches", "Located", "locate", "where_listed"]


@dataclass(frozen=True)
class ChunkFilter:
    """Which chunks `chunks` yields: an arena, free or used only, a size range (chunk sizes, flags masked)."""

    arena: int | None = None
    free: bool = False
    used: bool = False
    min_size: int = 0
    max_size: int | None = None

    def admits(self, chunk: Chunk) -> bool:
        if self.free and chunk.state not in FREE_STATES:
            return False
        if self.used and chunk.state not in (ChunkState.IN_USE, ChunkState.TCACHE_STRUCT):
            return False
        return chunk.size >= self.min_size and (self.max_size is None or chunk.size <= self.max_size)


class Matches:
    """Some chunks of one arena that a filter admits: how many, their bytes, and the chunks themselves."""

    def __init__(self, arena: Arena, count: int, total: int, rows):
        self.arena, self.count, self.total, self._rows = arena, count, total, rows

    def chunks(self, limit: int | None = None) -> Iterator[Chunk]:
        """The chunks in address order, the first LIMIT of them when given."""
        return self._rows(limit)


def chunks(mem: Memory, layout: Layout, state: HeapState, flt: ChunkFilter,
           findings: list | None = None) -> Iterator[tuple[Arena, Chunk]]:
    """Every chunk of every arena (or of FLT.arena) in address order per heap, as FLT admits.

    What the walk finds wrong (and where it had to skip damage) is added to FINDINGS.
    """
    for matches in matching(mem, layout, state, flt, findings):
        for chunk in matches.chunks():
            yield matches.arena, chunk


def matching(mem: Memory, layout: Layout, state: HeapState, flt: ChunkFilter,
             findings: list | None = None) -> Iterator[Matches]:
    """The chunks `chunks` yields, a batch at a time, counted and summed without making each one an object:
    an arena the sweep vouches for (`sweptchunks`) is one batch, the careful walk's batches otherwise."""
    listing = Listing.of_state(state)
    arenas = [arena for arena in state.arenas if flt.arena is None or arena.address == flt.arena]
    sweeper = Sweeper(mem, layout)         # each next arena swept ahead while this one is listed
    try:
        if arenas:
            sweeper.start(arenas[0])       # beside the listing's arrays
        listed = listing_arrays(listing) if arenas else None
        for i, arena in enumerate(arenas):
            if i + 1 < len(arenas):
                sweeper.start(arenas[i + 1])
            swept = swept_chunks(mem, layout, arena, listed, sweeper)
            if swept is not None:
                rows = swept.select(flt.free, flt.used, flt.min_size, flt.max_size)
                if len(rows):
                    yield Matches(arena, len(rows), int(swept.sizes[rows].sum()),
                                  lambda limit, swept=swept, rows=rows: swept.chunks(rows[:limit]))
                continue
            yield from _walked(mem, layout, arena, listing, flt, findings)
    finally:
        sweeper.close()


def _walked(mem: Memory, layout: Layout, arena: Arena, listing: Listing, flt: ChunkFilter,
            findings: list | None) -> Iterator[Matches]:
    """ARENA's chunks that FLT admits, through the careful walk, a batch at a time."""
    acc = Tally(arena.address, arena.system_mem)
    for extent in extents(arena, layout):
        # free chunks only: the walk need not hand over the in-use ones
        for batch in walk_batches(mem, extent, arena.top, listing, acc, every=not flt.free):
            admitted = [chunk for chunk in (Chunk(address, size, flags, st, extent.start)
                                            for address, size, flags, st in batch) if flt.admits(chunk)]
            if admitted:
                yield Matches(arena, len(admitted), sum(c.size for c in admitted),
                              lambda limit, admitted=admitted: iter(admitted[:limit]))
    if findings is not None:
        findings.extend(acc.findings)


@dataclass(frozen=True)
class Located:
    """The chunk holding an address: its arena, the chunk, its neighbours in the walk, and where it is listed."""

    arena: Arena
    chunk: Chunk
    previous: Chunk | None
    following: Chunk | None
    listed: str | None


def locate(mem: Memory, layout: Layout, state: HeapState, address: int) -> Located | None:
    """The chunk whose memory (header included) holds ADDRESS, or None outside every arena's heaps."""
    listing = Listing.of_state(state)
    for arena in state.arenas:
        for extent in extents(arena, layout):
            if not extent.start <= address < extent.end:
                continue
            acc = Tally(arena.address, arena.system_mem)
            previous = found = None
            for chunk in walk_extent(mem, extent, arena.top, listing, acc):
                if found is not None:
                    return Located(arena, found, previous, chunk, where_listed(state, found.address))
                if chunk.address <= address < chunk.address + chunk.size:
                    found = chunk
                    continue
                previous = chunk
            if found is not None:
                return Located(arena, found, previous, None, where_listed(state, found.address))
            return None
    return None


def where_listed(state: HeapState, chunk: int) -> str | None:
    """'fastbin 3 of arena 0', 'tcache bin 5 of thread 2', ... for a chunk in a list; None otherwise."""
    for arena in state.arenas:
        for lst in arena.free_lists():
            if chunk in lst.chunks:
                name = {"fast": "fastbin", "unsorted": "unsorted bin"}.get(lst.kind.value, f"{lst.kind.value} bin")
                index = "" if lst.kind.value == "unsorted" else f" {lst.index}"
                return f"{name}{index} of arena {arena.number}, position {lst.chunks.index(chunk) + 1} of {lst.count}"
    for owner, tcache in state.tcaches():
        if tcache.address - 16 == chunk:
            return f"the tcache struct of {owner}"
        for b in tcache.bins:
            if chunk + 16 in b.entries:
                return (f"tcache bin {b.index} of {owner}, position "
                        f"{b.entries.index(chunk + 16) + 1} of {len(b.entries)}")
    return None
