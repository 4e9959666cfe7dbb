"""Finding glibc's arenas when libc's own memory cannot be read.

A core cut short (by a full disk, a core size limit, a killed gcore) loses its last segments first, and
those hold libc's writable data (main_arena, mp_), the loader's list of libraries and the stacks.  The
thread arenas' heaps usually lie below, and each first heap holds its arena, whose ``next`` pointers lead
round the ring to main_arena: so the arenas, their layout family and main_arena's address are found from
the heaps alone, and the version from the layouts memory shows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from heapwalk.glibc import heuristics
from heapwalk.glibc.layout import HEAP_MAX_SIZE, SIZE_BITS, Layout, layout_for
from heapwalk.glibc.lists import plausible_arena
from heapwalk.target.memory import Memory, ReadError, u64

__all__ = ["HeapArenas", "arenas_from_heaps"]

#: sizeof(heap_info) in the glibc versions heapwalk knows (the arena follows it in a first heap)
_HEAP_INFO_SIZES = (32, 48)


@dataclass(frozen=True, slots=True)
class HeapArenas:
    """Thread arenas found by their heaps, and what they say about the rest.

    MAIN_ARENA: where the ring leaves the heaps (main_arena's address, readable or not; None when the ring
    leads only to arenas whose memory is missing); FAMILY and
    HEAP_INFO_SIZE: the layouts under which the arenas are sound; LOST: thread arenas the ring leads to whose
    memory is missing; TCACHE_CHUNK: the size of the tcache
    struct chunk that opens their heaps (None if none does); SAFE_LINKING: whether those tcaches' links are
    mangled (None when no entry tells)."""

    main_arena: int | None
    family: tuple[int, int]
    heap_info_size: int
    arenas: tuple[int, ...]
    lost: tuple[int, ...]
    tcache_chunk: int | None
    safe_linking: bool | None


def arenas_from_heaps(mem: Memory, regions: list[tuple[int, int]]) -> HeapArenas | None:
    """The thread arenas of REGIONS' 64 MiB-aligned heaps, under the first arena layout family and heap_info
    size that finds some whose ring leads out of the heaps; None when no heap holds such an arena."""
    for family in heuristics.ARENA_FAMILIES:
        for info_size in _HEAP_INFO_SIZES:
            layout = dataclasses.replace(layout_for(family), heap_info_size=info_size)
            arenas = heuristics.arenas_by_heaps(mem, layout, regions, HEAP_MAX_SIZE)
            if not arenas:
                continue
            main, lost = _ring_exits(mem, layout, arenas)
            if main is not None or lost:
                tcache_chunk = _tcache_chunk(mem, layout, arenas)
                return HeapArenas(main, family, info_size, tuple(arenas), lost, tcache_chunk,
                                  _safe_linking(mem, layout, arenas, tcache_chunk))
    return None


def _ring_exits(mem: Memory, layout: Layout, arenas: list[int]) -> tuple[int | None, tuple[int, ...]]:
    """Where the ring leaves ARENAS, followed from each of them: main_arena (None when it is readable and no
    arena, or never reached), and the thread arenas (at a heap's start) the ring leads to whose memory is
    missing."""
    known, main, lost = set(arenas), None, []
    for start in arenas:
        at = start
        for _ in range(len(arenas) + 1):
            try:
                at = u64(mem, at + layout.off_next)
            except ReadError:
                break
            if at == 0 or at % 8 or at not in known:
                break
        if at == 0 or at % 8 or at in known:
            continue
        if at % HEAP_MAX_SIZE == layout.heap_info_size:
            if at not in lost:
                lost.append(at)
        elif main is None and (not _readable(mem, at) or plausible_arena(mem, layout, at)):
            main = at
    return main, tuple(lost)


def _readable(mem: Memory, address: int) -> bool:
    try:
        mem.read(address, 8)
    except ReadError:
        return False
    return True


def _tcache_chunk(mem: Memory, layout: Layout, arenas: list[int]) -> int | None:
    """The tcache struct chunk size that opens the arenas' first heaps (the smallest, if they differ)."""
    sizes = set()
    for arena in arenas:
        first = arena - layout.heap_info_size + layout.first_chunk_offset
        try:
            size = heuristics.tcache_struct_chunk(u64(mem, first + 8) & ~SIZE_BITS)
        except ReadError:
            continue
        if size is not None:
            sizes.add(size)
    return min(sizes, default=None)


def _safe_linking(mem: Memory, layout: Layout, arenas: list[int], tcache_chunk: int | None) -> bool | None:
    """Whether the links of the tcache structs that open the arenas' heaps are mangled."""
    if tcache_chunk is None:
        return None
    shape = layout_for(heuristics.TCACHE_CHUNK_SIZES[tcache_chunk])
    structs = [arena - layout.heap_info_size + layout.first_chunk_offset + 16 for arena in arenas]
    return heuristics.tcache_safe_linking(mem, structs, shape.tcache_off_entries, shape.tcache_bins)
