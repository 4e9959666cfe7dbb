"""Chunks with mappings of their own (mmapped chunks), and the pieces of a non-contiguous main arena: found
in the target's memory, page by page, where no heap holds them."""

from __future__ import annotations

import dataclasses
import struct

import numpy as np

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.locate.discovery import Discovery

from heapwalk.glibc.walk.chunks import align_chunk
from heapwalk.glibc.locate.layout import IS_MMAPPED, MALLOC_ALIGNMENT, MINSIZE, NON_MAIN_ARENA, PREV_INUSE, SIZE_BITS, Layout
from heapwalk.glibc.model import Arena, Heap, HeapState, MallocPar, MmappedChunk
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.inferior.ranges import ranges_without
from heapwalk.inferior.window import PROBE_SPAN, Window, read_window

__all__ = ["find_mmapped", "find_mmapped_in_pages", "main_regions", "with_main_regions",
           "mmapped_of_state", "mmapped_agree"]


def find_mmapped(mem: Memory, layout: Layout, regions: list[tuple[int, int]], skip: list[tuple[int, int]],
                 limit: int = 1 << 20) -> list[MmappedChunk]:
    """Mmapped chunks at the start of anonymous memory regions (and packed after each other within one).

    A mapping made for one chunk starts with its header: prev_size 0 (the
    front padding, which only memalign'd chunks have) and a size with
    IS_MMAPPED set and NON_MAIN_ARENA clear, spanning whole pages that fit in
    the region; the kernel may merge neighbouring ones into one region, and
    merges one placed right below a thread heap with the heap's first pages.
    SKIP (heaps, libc) is cut out of the regions, and what is left of each is
    looked at; chunks with front padding are not found (the totals then
    disagree with mp_, which the caller reports).
    """
    out: list[MmappedChunk] = []
    for start, end in ranges_without(regions, skip):
        at = start
        while at < end and len(out) < limit:
            chunk = _mmapped_at(mem, layout, at, end)
            if chunk is None:
                break
            out.append(chunk)
            at += chunk.span
    return out


def _mmapped_at(mem: Memory, layout: Layout, at: int, end: int) -> MmappedChunk | None:
    """The mmapped chunk whose mapping starts at AT and ends by END, if AT holds such a header: prev_size 0,
    IS_MMAPPED set, NON_MAIN_ARENA clear, a mapping of whole pages."""
    try:
        prev_size, size_field = struct.unpack("<QQ", mem.read(at, 16))
    except ReadError:
        return None
    size = size_field & ~SIZE_BITS
    if prev_size or not size_field & IS_MMAPPED or size_field & NON_MAIN_ARENA or size < MINSIZE:
        return None
    span = layout.mmapped_span(0, size)
    return MmappedChunk(at, size, span) if span % 4096 == 0 and at + span <= end else None


def find_mmapped_in_pages(mem: Memory, layout: Layout, regions: list[tuple[int, int]],
                          skip: list[tuple[int, int]], budget: int = 1 << 30) -> list[MmappedChunk]:
    """Mmapped chunks anywhere in REGIONS (less SKIP), looked for at every page: for when `find_mmapped`
    finds fewer than mp_ counts, because the kernel merged a chunk's mapping with anonymous memory below
    it (a thread's stack, say), so that it no longer starts a region.  Reads at most BUDGET bytes of
    pages; the caller keeps what it finds only if the totals then agree with mp_."""
    out: list[MmappedChunk] = []
    for start, end in ranges_without(regions, skip):
        at = (start + 4095) & ~4095
        while at + 16 <= end and budget > 0:
            budget -= 4096
            chunk = _mmapped_at(mem, layout, at, end)
            if chunk is None:
                at += 4096
            else:
                out.append(chunk)
                at += chunk.span
    return out


def _probe_main_region(mem: Memory, start: int, end: int, top: int, top_size: int) -> int | None:
    """The end of a main-arena region that starts at START (an mmap'd piece of a non-contiguous main arena):
    where its chunks reach the end of top, or two fenceposts; None if START does not hold such chunks."""
    word = Window(mem, end, PROBE_SPAN).word
    c = align_chunk(start)
    first, fenceposts = True, 0
    while c < end:
        try:
            size_field = word(c + 8)
        except ReadError:
            return None
        size = size_field & ~SIZE_BITS
        if size_field & (IS_MMAPPED | NON_MAIN_ARENA) or size < 2 * 8 or size % MALLOC_ALIGNMENT or c + size > end:
            return None
        if first and not size_field & PREV_INUSE:
            return None
        first = False
        if c == top:
            return c + size if size == top_size else None
        fenceposts = fenceposts + 1 if size < MINSIZE else 0
        c += size
        if fenceposts == 2:
            return c
    return None


def main_regions(mem: Memory, arena: Arena, regions: list[tuple[int, int]], skip: list[tuple[int, int]],
                 budget: int = 1 << 30) -> list[tuple[int, int]]:
    """The pieces [start, end) of a non-contiguous main arena (mmap'd when sbrk could not be used).

    Each piece starts a page and ends at top or with two fenceposts.  The
    kernel merges a piece with the anonymous memory next to it (another piece,
    or memory that is not the heap's), so every page of a region (SKIP, the
    thread heaps and libc, cut out) may start one: pages whose first chunk
    header cannot start a piece are passed over, read a block at a time, and
    the search ends once the pieces hold the arena's system_mem, or BUDGET
    bytes of pages have been looked at.
    """
    out: list[tuple[int, int]] = []
    held = 0
    for start, end in ranges_without(sorted(regions), skip):
        at = (start + 4095) & ~4095
        while at < end and held < arena.system_mem and budget > 0:
            at, looked = _next_piece_start(mem, at, end, budget)
            budget -= looked
            if at is None:
                break
            piece_end = _probe_main_region(mem, at, end, arena.top, arena.top_size)
            if piece_end is None:
                at += 4096
                continue
            out.append((at, piece_end))
            held += piece_end - at
            at = (piece_end + 4095) & ~4095
    return out


#: bytes of pages read at once when looking for where a piece starts
_BLOCK = 1 << 20


def _next_piece_start(mem: Memory, at: int, end: int, budget: int) -> tuple[int | None, int]:
    """The first page from AT (page-aligned) up to END whose first chunk header could start a main-arena
    piece (PREV_INUSE set, IS_MMAPPED and NON_MAIN_ARENA clear, an aligned size that fits), or None; and
    how many bytes were looked at.  Unreadable pages are passed over."""
    looked = 0
    while at < end and looked < budget:
        block = min(_BLOCK, end - at)
        data = read_window(mem, at, at + block, block)
        if len(data) < 16:
            at, looked = at + 4096, looked + 4096
            continue
        pages = np.frombuffer(data, dtype=np.uint64, count=len(data) // 8)[1::512]
        sizes = pages & np.uint64(~SIZE_BITS & 0xFFFFFFFFFFFFFFFF)
        offsets = np.arange(len(pages), dtype=np.uint64) * np.uint64(4096)
        fits = ((pages & np.uint64(PREV_INUSE)) != 0) \
            & ((pages & np.uint64(IS_MMAPPED | NON_MAIN_ARENA)) == 0) \
            & (sizes >= np.uint64(MINSIZE)) & (sizes % np.uint64(MALLOC_ALIGNMENT) == 0) \
            & (sizes <= np.uint64(end - at) - offsets)
        hits = np.flatnonzero(fits)
        if len(hits):
            return at + 4096 * int(hits[0]), looked + 4096 * (int(hits[0]) + 1)
        step = (len(data) + 4095) & ~4095
        at, looked = at + step, looked + step
    return None, looked


def with_main_regions(mem: Memory, disc: Discovery, main: Arena, arenas: list[Arena],
                      regions: list[tuple[int, int]]) -> Arena:
    """MAIN with one heap per piece of its non-contiguous memory.

    When the pieces found do not hold all of system_mem (a piece missing from
    a core, or damage), MAIN keeps the pieces found, and a finding says how
    much of its memory heapwalk could not find; with no piece found at all it
    keeps its sbrk_base..top heap when that is a heap at all.
    """
    skip = [(h.address, h.address + disc.heap_max_size) for a in arenas[1:] for h in a.heaps]
    if disc.libc_range:
        skip.append(disc.libc_range)
    pieces = main_regions(mem, main, regions, skip)
    heaps = tuple(Heap(s, e - s, e - s, main.address, 0, None) for s, e in pieces)
    shown = sum(h.size for h in heaps)
    if heaps and shown == main.system_mem:
        return dataclasses.replace(main, heaps=heaps)
    if not heaps:
        heaps = tuple(h for h in main.heaps if 0 < h.size <= main.system_mem)
        shown = sum(h.size for h in heaps)
    lost = Finding(Severity.ERROR, main.address, f"arena {main.address:#x}",
                   f"the main arena's memory is in mmap'd pieces (sbrk could not be used); the pieces heapwalk "
                   f"found hold {shown:#x} of its system_mem {main.system_mem:#x} bytes, and the rest is in pieces "
                   "missing from the target's memory or not where a piece can be told apart: their chunks "
                   "are not walked", Kind.ACCOUNTING, f"pieces of {main.system_mem:#x} bytes", f"{shown:#x}")
    return dataclasses.replace(main, heaps=heaps, findings=main.findings + (lost,))


def mmapped_of_state(mem: Memory, disc: Discovery, state: HeapState, regions: list[tuple[int, int]]
                     ) -> tuple[list[MmappedChunk], Finding | None]:
    """The mmapped chunks in REGIONS outside heaps and libc, and a warning when they do not make mp_'s
    counters."""
    skip = [(h.address, h.address + (disc.heap_max_size if not a.is_main else h.size))
            for a in state.arenas for h in a.heaps]
    if disc.libc_range:
        skip.append(disc.libc_range)
    found = find_mmapped(mem, disc.layout, regions, skip)
    mp = state.mp
    if mp is None:
        # no count to check against: of the chunks that do not start a region, keep those whose mappings end
        # it, as the kernel leaves a mapping merged with the anonymous memory below it
        taken = skip + [(c.address, c.address + c.span) for c in found]
        more = find_mmapped_in_pages(mem, disc.layout, regions, taken)
        found = sorted(found + _ending_their_ranges(more, ranges_without(regions, taken)), key=lambda c: c.address)
    if mp is not None and len(found) < (mp.get("n_mmaps") or 0):
        # some chunk does not start its region: look at every page outside the chunks found; keep what
        # that finds only when it makes the totals mp_'s
        more = find_mmapped_in_pages(mem, disc.layout, regions, skip + [(c.address, c.address + c.span) for c in found])
        if mmapped_agree(disc.layout, mp, found + more):
            found = sorted(found + more, key=lambda c: c.address)
    if mp is None or mmapped_agree(disc.layout, mp, found):
        return found, None
    grown = _overgrown(mem, disc.layout, found)
    if grown is not None and mmapped_agree(disc.layout, mp, grown[0]):
        return grown
    return found, Finding(Severity.WARNING, 0, "mmapped chunks",
                          f"found {len(found)} mmapped chunks of {sum(c.span for c in found)} bytes; mp_ counts "
                          f"{mp.get('n_mmaps')} of {mp.get('mmapped_mem')} (chunks with front padding, or "
                          "regions missing from the core, are not found)", Kind.MMAPPED)


def _overgrown(mem: Memory, layout: Layout, found: list[MmappedChunk]
               ) -> tuple[list[MmappedChunk], Finding] | None:
    """When a mmapped chunk's size was written over so that it runs over the mmapped chunks after it (their
    mappings merged with its own, as the kernel merges neighbouring ones): the chunks with that one cut back
    to where the first one inside it starts, and the error at it; None when no found chunk holds another's
    header at a page inside it that tiles it to its end."""
    for i, outer in enumerate(found):
        end = outer.address + outer.span
        inner, at = [], (outer.address + 4096 + 4095) & ~4095
        while at + 16 <= end:
            chunk = _mmapped_at(mem, layout, at, end)
            if chunk is not None and (inner or at > outer.address):
                inner.append(chunk)
                at += chunk.span
            elif inner:
                break
            else:
                at += 4096
        if not inner or at != end:
            continue
        first = inner[0]
        cut = first.address - outer.address
        fixed = dataclasses.replace(outer, size=outer.size - (outer.span - cut), span=cut)
        finding = Finding(Severity.ERROR, outer.address, "mmapped chunks",
                          f"mmapped chunk {outer.address:#x}'s size {outer.size:#x} runs over the mmapped chunk "
                          f"{first.address:#x} (size {first.size:#x}) that starts {cut:#x} bytes in: its size was "
                          f"written over (its own mapping is {cut:#x} bytes)", Kind.MMAPPED_OVERLAP,
                          f"{fixed.size:#x}", f"{outer.size:#x}")
        return sorted(found[:i] + [fixed] + inner + found[i + 1:], key=lambda c: c.address), finding
    return None


def _ending_their_ranges(chunks: list[MmappedChunk], ranges: list[tuple[int, int]]) -> list[MmappedChunk]:
    """Of CHUNKS (found at page starts), those packed against the end of the range that holds them, from the
    end down: what a mapping merged with the memory below it looks like."""
    out = []
    for start, end in ranges:
        inside = sorted((c for c in chunks if start <= c.address < end), key=lambda c: -c.address)
        for c in inside:
            if c.address + c.span != end:
                break
            out.append(c)
            end = c.address
    return out


def mmapped_agree(layout: Layout, mp: MallocPar, chunks) -> bool:
    """Do CHUNKS (mmapped chunks found in memory) make mp_'s n_mmaps and mmapped_mem?  From glibc 2.43 each
    mremap of a mmapped chunk (realloc) counts 16 bytes too many in mmapped_mem, for good: the count must
    match, and the bytes may exceed the mappings' by a multiple of 16."""
    if len(chunks) != mp.get("n_mmaps"):
        return False
    drift = (mp.get("mmapped_mem") or 0) - sum(c.span for c in chunks)
    return drift == 0 or (layout.mmap_chunk_rule_243 and drift > 0 and drift % 16 == 0)
