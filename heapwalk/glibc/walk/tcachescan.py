"""tcache structs found without TLS.

A thread reaches its tcache through a TLS variable.  When a core holds no
copy of a thread's TLS (gcore wrote its stack, where a thread's TLS lives,
as zeros, or left it out), that pointer is gone, but the
tcache_perthread_struct itself is still an in-use chunk of the arena the
thread first allocated from.  This module walks the arenas' chunks and keeps
each in-use chunk of the struct's size whose contents decode as a sound
tcache: counts within the fill count, every list as long as its count and
made of chunks of its bin's size that no bin holds.

An empty tcache of glibc before 2.42 is all zeros, as is much program data.
Such a chunk is taken only where a tcache struct sits when a thread creates
its arena (the arena's first chunk); elsewhere it is counted as ambiguous.
"""

from __future__ import annotations

from dataclasses import dataclass

from heapwalk.glibc.walk.chunks import Listing, Tally, extents
from heapwalk.glibc.model import ChunkState
from heapwalk.glibc.walk.chunkwalk import walk_extent
from heapwalk.glibc.locate.layout import SIZE_BITS, Layout
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.glibc.model import Arena, Tcache
from heapwalk.glibc.walk.lists import walk_tcache

__all__ = ["TcacheScan", "scan_tcaches"]

#: malloc hands out a whole free chunk when the rest would be under MINSIZE, so the struct's chunk may be larger
_SLACK = 32


@dataclass(frozen=True)
class TcacheScan:
    """What a scan found: sound tcache structs, and all-zero chunks that may be empty tcaches."""

    tcaches: tuple[Tcache, ...]
    ambiguous: int


def scan_tcaches(mem: Memory, layout: Layout, arenas: list[Arena], listing: Listing,
                 fill: int | None, known: set[int]) -> TcacheScan:
    """Every tcache struct in ARENAS' heaps except those at KNOWN (user addresses), by a walk of their chunks.

    LISTING holds the chunks the free lists and known tcaches hold (`chunks.Listing.of_state`); FILL is
    mp_.tcache_count.  Walk findings are not kept: the accounting walk reports the same ones.
    """
    if not layout.has_tcache:
        return TcacheScan((), 0)
    fill = fill if fill is not None else layout.tcache_fill_count
    size = layout.tcache_chunk_size
    found: list[Tcache] = []
    ambiguous = 0
    claimed = listing.addresses()  # chunks that lists hold, and then those of the tcaches found so far
    for arena in arenas:
        first = True
        for extent in extents(arena, layout):
            scratch = Tally(arena.address, 0)
            for chunk in walk_extent(mem, extent, arena.top, listing, scratch):
                at_start, first = first, False
                if chunk.state is not ChunkState.IN_USE or not size <= chunk.size < size + _SLACK:
                    continue
                user = chunk.address + 16
                if user in known or chunk.address in claimed:
                    continue
                tcache = _sound(mem, layout, user, fill, claimed)
                if tcache is None:
                    continue
                if not tcache.bins and not layout.tcache_counts_down and not at_start:
                    ambiguous += 1
                    continue
                claimed.update(e - 16 for b in tcache.bins for e in b.entries)
                found.append(Tcache(tcache.address, tcache.bins, tcache.findings, arena.address))
    return TcacheScan(tuple(found), ambiguous)


def _sound(mem: Memory, layout: Layout, user: int, fill: int, claimed: set[int]) -> Tcache | None:
    """The struct at USER decoded, when it is a tcache glibc could have left (empty, or with sound lists
    whose entries are in no list of CLAIMED); else None."""
    try:
        raw = mem.read(user, layout.tcache_struct_size)
    except ReadError:
        return None
    tcache = walk_tcache(mem, layout, user, fill)
    if tcache.findings:
        return None
    if not tcache.bins:
        return tcache if layout.tcache_counts_down or not any(raw) else None
    for b in tcache.bins:
        if not b.complete or b.count > fill and b.index < 64:
            return None
        for entry in b.entries:
            chunk = entry - 16
            if entry % 16 or chunk in claimed:
                return None
            if b.index < 64:
                try:
                    if u64(mem, chunk + 8) & ~SIZE_BITS != b.chunk_size:
                        return None
                except ReadError:
                    return None
    return tcache
