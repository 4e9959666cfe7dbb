"""Finding glibc's arenas when libc's own memory cannot be read.

A core cut short (by a full disk, a core size limit, a killed gcore) loses its last segments first, and
those hold libc's writable data (main_arena, mp_), the loader's list of libraries and the stacks.  The
thread arenas' heaps usually lie below, and each first heap holds its arena, whose ``next`` pointers lead
round the ring to main_arena: so the arenas, their layout family and main_arena's address are found from
the heaps alone, and the version from the layouts memory shows.  The main heap, which sbrk made, is found by
its chunks (headers that lead from its start to its end) and walked without the arena's lists.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from heapwalk.glibc.locate import heuristics
from heapwalk.glibc.locate.layout import HEAP_MAX_SIZE, IS_MMAPPED, MALLOC_ALIGNMENT, MINSIZE, PREV_INUSE, SIZE_BITS, \
    Layout, layout_for
from heapwalk.glibc.locate.arenashape import plausible_arena
from heapwalk.glibc.model import Arena, BinKind, BinList, Heap
from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.inferior.memory import Memory, ReadError, readable, u64
from heapwalk.inferior.window import word_reader
from heapwalk.arch import USER_SPACE_END

#: user-space addresses with 4-level paging (48-bit) end here: a link beyond it is damage, never an arena

__all__ = ["HeapArenas", "arenas_from_heaps", "heap_only", "heap_only_label", "MainHeap", "main_heap",
           "main_arena_of_heap"]

#: sizeof(heap_info) in the glibc versions heapwalk knows (the arena follows it in a first heap)
_HEAP_INFO_SIZES = (32, 48)
#: how many sound chunk headers from a region's start make it the main heap when the core ends inside it
_MAIN_HEAP_STEPS = 64


@dataclass(frozen=True)
class HeapArenas:
    """Thread arenas found by their heaps, and what they say about the rest.

    MAIN_ARENA: where the ring leaves the heaps (main_arena's address, readable or not; None when the ring
    leads only to arenas whose memory is missing); FAMILY and HEAP_INFO_SIZE: the layouts under which the
    arenas are sound; LOST: thread arenas the ring leads to whose memory is missing; TCACHE_CHUNK: the size
    of the tcache struct chunk that opens their heaps (None if none does); SAFE_LINKING: whether those
    tcaches' links are mangled (None when no entry tells)."""

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
            arenas = [a for a in heuristics.arenas_by_heaps(mem, layout, regions, HEAP_MAX_SIZE)
                      if _bin127_empty(mem, layout, a)]
            if not arenas:
                continue
            main, lost = _ring_exits(mem, layout, arenas)
            if main is not None or lost:
                firsts = [a - layout.heap_info_size + layout.first_chunk_offset for a in arenas]
                return HeapArenas(main, family, info_size, tuple(arenas), lost, *_tcache_evidence(mem, firsts))
    return None


def heap_only(mem: Memory, regions: list[tuple[int, int]]) -> HeapArenas | None:
    """What the main heap alone says, when no thread arena is left to tell (a program that never made one):
    no arena, main_arena unknown, the tcache struct chunk opening the heap and whether its links are mangled;
    None when no region is a main heap."""
    heap = main_heap(mem, regions, [])
    if heap is None:
        return None
    first = (heap.start + MALLOC_ALIGNMENT - 1) & ~(MALLOC_ALIGNMENT - 1)
    return HeapArenas(None, (2, 27), 0, (), (), *_tcache_evidence(mem, [first]))


def heap_only_label(found: HeapArenas) -> str:
    """The glibc versions a heap without arenas can be told to be: by its tcache struct and safe-linking."""
    if found.tcache_chunk == 0x300:
        return "2.42"
    if found.tcache_chunk == 0x250:
        return "2.27-2.29"
    if found.tcache_chunk is None:
        return "2.27 or later"
    return {True: "2.32 or later", False: "2.30-2.31"}.get(found.safe_linking, "2.30 or later")


def _ring_exits(mem: Memory, layout: Layout, arenas: list[int]) -> tuple[int | None, tuple[int, ...]]:
    """Where the ring leaves ARENAS, followed from each of them: main_arena (None when it is readable and no
    arena, outside the user address space (a damaged link), or never reached), and the thread arenas (at a
    heap's start) the ring leads to whose memory is missing."""
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
        elif main is None and at < USER_SPACE_END and (not readable(mem, at) or plausible_arena(mem, layout, at)):
            main = at
    return main, tuple(lost)


def _bin127_empty(mem: Memory, layout: Layout, arena: int) -> bool:
    """Is bin 127 of ARENA, which malloc never uses, self-linked under LAYOUT (which tells one arena layout
    from another, as the looser checks of an arena's shape do not)?"""
    header = layout.bin_header(arena, 127)
    try:
        return u64(mem, header + 16) == header and u64(mem, header + 24) == header
    except ReadError:
        return False


def _tcache_evidence(mem: Memory, firsts: list[int]) -> tuple[int | None, bool | None]:
    """What the chunks at FIRSTS (each heap's first) say as tcache structs: the struct's chunk size (the
    smallest, if they differ; None when none is one) and whether their links are mangled (None: no entry
    tells)."""
    sizes = set()
    for first in firsts:
        try:
            size = heuristics.tcache_struct_chunk(u64(mem, first + 8) & ~SIZE_BITS)
        except ReadError:
            continue
        if size is not None:
            sizes.add(size)
    if not sizes:
        return None, None
    tcache_chunk = min(sizes)
    shape = layout_for(heuristics.TCACHE_CHUNK_SIZES[tcache_chunk])
    structs = [first + 16 for first in firsts]
    return tcache_chunk, heuristics.tcache_safe_linking(mem, structs, shape.tcache_off_entries, shape.tcache_bins)


@dataclass(frozen=True)
class MainHeap:
    """The main arena's sbrk heap, found by its chunks: [START, END), and its last chunk TOP; when the core
    ends inside the heap, at CUT, END is the end of the chunk the cut falls in (or the cut, at a chunk's
    start) and TOP is 0: what lies beyond is unknown."""

    start: int
    end: int
    top: int
    top_size: int
    cut: int | None = None


def main_heap(mem: Memory, regions: list[tuple[int, int]], skip: list[tuple[int, int]]) -> MainHeap | None:
    """The region of REGIONS (none of SKIP's) whose chunk headers, from its first aligned address, lead in
    sound steps exactly to its end (or, when the core ends inside it, through _MAIN_HEAP_STEPS of them to
    where it ends): the main heap, as sbrk made it; None when no region is such."""
    for start, end in regions:
        if any(a < end and start < b for a, b in skip):
            continue
        found = _chained_to_end(mem, start, end)
        if found is not None:
            return found
    return None


def _chained_to_end(mem: Memory, start: int, end: int) -> MainHeap | None:
    at = (start + MALLOC_ALIGNMENT - 1) & ~(MALLOC_ALIGNMENT - 1)
    steps, last, word = 0, 0, word_reader(mem, end)
    while at < end:
        try:
            field = word(at + 8)
        except ReadError:
            return MainHeap(start, at, 0, 0, at) if steps >= _MAIN_HEAP_STEPS else None
        size = field & ~SIZE_BITS
        if size < MINSIZE or size % MALLOC_ALIGNMENT or field & IS_MMAPPED or steps == 0 and not field & PREV_INUSE:
            return None
        if at + size > end:  # sound only when the core ends here, inside the heap's last chunk
            sound = steps >= _MAIN_HEAP_STEPS and not readable(mem, end)
            return MainHeap(start, at + size, 0, 0, end) if sound else None
        last, at, steps = at, at + size, steps + 1
    return MainHeap(start, end, last, end - last) if steps > 1 else None


def main_arena_of_heap(address: int, heap: MainHeap) -> Arena:
    """The main arena at ADDRESS (0 when unknown), whose own memory is missing, as its heap shows it: its
    top and system memory from the heap, no lists (so the walk counts free chunks as free in no list)."""
    size = heap.end - heap.start
    findings = [Finding(Severity.WARNING, heap.start, "arena 0 (main_arena)", "main_arena is not in the target's "
                        f"memory, but its heap is: found by its chunks at {heap.start:#x}-{heap.end:#x}, it is "
                        "walked without the arena's lists", Kind.UNMAPPED)]
    if heap.cut is not None:
        findings.append(Finding(Severity.ERROR, heap.cut, "arena 0 (main_arena)", f"the core ends inside the main "
                                f"heap, at {heap.cut:#x}: the heap is walked up to {heap.end:#x}, and what lies "
                                "beyond (its top, and any chunks before it) is missing", Kind.UNMAPPED))
    return Arena(address=address, number=0, is_main=True, mutex=0, flags=0, have_fastchunks=None, top=heap.top,
                 top_size=heap.top_size, last_remainder=0, next=0, next_free=0, attached_threads=None,
                 system_mem=size, max_system_mem=size, heaps=(Heap(heap.start, size, size, address, 0, None),),
                 fastbins=(), unsorted=BinList(BinKind.UNSORTED, 1, address, (), ()), bins=(),
                 findings=tuple(findings), lists_known=False)
