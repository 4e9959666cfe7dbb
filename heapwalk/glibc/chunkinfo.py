"""Questions about single chunks: which chunks match a filter, and what is known about the chunk at an address."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from heapwalk.glibc.chunks import Chunk, Listing, Tally, extents
from heapwalk.glibc.model import FREE_STATES, ChunkState
from heapwalk.glibc.chunkwalk import walk_batches, walk_extent
from heapwalk.glibc.layout import Layout
from heapwalk.target.memory import Memory
from heapwalk.glibc.model import Arena, HeapState

__all__ = ["ChunkFilter", "chunks", "Located", "locate", "where_listed"]


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


def chunks(mem: Memory, layout: Layout, state: HeapState, flt: ChunkFilter,
           findings: list | None = None) -> Iterator[tuple[Arena, Chunk]]:
    """Every chunk of every arena (or of FLT.arena) in address order per heap, as FLT admits.

    What the walk finds wrong (and where it had to skip damage) is added to FINDINGS.
    """
    listing = Listing.of_state(state)
    for arena in state.arenas:
        if flt.arena is not None and arena.address != flt.arena:
            continue
        acc = Tally(arena.address, arena.system_mem)
        for extent in extents(arena, layout):
            # free chunks only: the walk need not hand over the in-use ones
            for batch in walk_batches(mem, extent, arena.top, listing, acc, every=not flt.free):
                for address, size, flags, st in batch:
                    chunk = Chunk(address, size, flags, st, extent.start)
                    if flt.admits(chunk):
                        yield arena, chunk
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
