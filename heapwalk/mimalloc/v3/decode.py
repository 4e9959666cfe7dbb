"""mimalloc 3's pages decoded into the shapes the rest of heapwalk's mimalloc reads (`mimalloc.decode`): each
page, with its slices, is a unit of its own (a `MiSegment` of one page, owned by the page's thread, or by none
when the thread exited and abandoned it); the arenas' free slices and their own slices are the arenas' row."""

from __future__ import annotations

from heapwalk.common.findings import Finding, Severity
from heapwalk.inferior.memory import Memory, ReadError, hop_read, u64
from heapwalk.inferior.residency import Residency
from heapwalk.mimalloc.decode import SEGMENT, MiPage, MiSegment, MiState
from heapwalk.mimalloc.discovery import MiDiscovery
from heapwalk.mimalloc.heaps import find_heaps
from heapwalk.mimalloc.lists import walk_pages
from heapwalk.mimalloc.bits import bit_runs, bits_in
from heapwalk.mimalloc.v3.arenas import Mi3Arena
from heapwalk.mimalloc.v3.layout import Mi3Layout
from heapwalk.mimalloc.v3.state import MiState3

__all__ = ["decode_mimalloc3"]

#: the free spans of every unit (a page has none): one empty sequence for all
_NO_SPANS = ()
_FLAGS = 7          # the low bits of a page's thread id: in the full queue, has aligned, abandoned and mapped
_IN_FULL = 1


def decode_mimalloc3(mem: Memory, found: MiDiscovery, threads, description: str = "",
                     residency: Residency | None = None) -> MiState:
    """Every page of the arenas (their bitmaps of pages, or from 3.2 their heaps'), and every page taken from the
    system (the page map names them: those whose header says so), their lists walked; the heaps of THREADS and
    of the pages."""
    lay: Mi3Layout = found.layout
    findings: list[Finding] = []
    units, same = [], {}
    for arena in found.arenas:
        for first, end in bit_runs(arena.pages):
            for index in range(first, end):
                unit = _unit(mem, lay, arena.start + index * arena.block_size, arena, index, findings, same)
                if unit is not None:
                    units.append(unit)
    for at in found.os_pages:
        unit = _unit(mem, lay, at, None, 0, findings, same)
        if unit is not None:
            units.append(unit)
    units.sort(key=lambda s: s.address)
    findings += _overfull(found.arenas, units)
    heaps = find_heaps(mem, found, units, threads, findings)
    walk_pages(mem, [page for unit in units for page in unit.pages], findings)
    first = min((t for t in threads if t.thread_pointer), key=lambda t: t.number, default=None)
    return MiState3(found, units, heaps, [], findings, description, residency, first.thread_pointer if first else 0)


def _overfull(arenas, units) -> list[Finding]:
    """An arena whose pages and free slices take more than its slices (its bitmaps are damaged)."""
    out = []
    for a in arenas:
        pages = sum(u.reserved for u in units if u.arena is a)
        if pages + a.free_bytes() > a.reserved:
            out.append(Finding(Severity.ERROR, a.address, "mi_arena_t", f"arena {a.id} at {a.start:#x}: its pages "
                               f"({pages} bytes) and free slices ({a.free_bytes()}) take more than its {a.reserved} "
                               "bytes: its bitmaps are damaged, and its figures are held to its size", SEGMENT))
    return out


def _unit(mem: Memory, lay: Mi3Layout, at: int, arena: Mi3Arena | None, index: int,
          findings: list[Finding], same: dict) -> MiSegment | None:
    """The page whose mi_page_t is at AT (slice INDEX of ARENA, or memory of its own from the system) as a unit
    of one page; None, and a finding, when it cannot be read or does not hold together.  SAME keeps one object
    for each number many pages share (their sizes, counts, owners and heaps: a page's record is kept by the
    hundred thousand)."""
    info = _page_meta(mem, lay, at, arena, index, findings)
    if info is None:
        return None
    try:
        head = hop_read(mem, info, lay.page)    # not its block: the page's blocks are read once, after
    except ReadError as exc:
        findings.append(Finding(Severity.ERROR, info, "mi_page_t", f"the page at {at:#x} cannot be read ({exc})",
                                SEGMENT))
        return None
    word = lambda off: int.from_bytes(head[off:off + 8], "little")     # noqa: E731
    half = lambda off: int.from_bytes(head[off:off + 2], "little")     # noqa: E731
    u32 = lambda off: int.from_bytes(head[off:off + 4], "little")      # noqa: E731
    block = word(lay.page_block_size)
    start = {"words": info + 8 * u32(lay.page_start_field), "bytes": info + word(lay.page_start_field)}.get(
        lay.page_start, word(lay.page_start_field))
    if arena is not None:
        named, slice_index, slices = word(lay.page_memid), u32(lay.page_memid + 8), u32(lay.page_memid + 12)
        problem = None if head[lay.page_memkind] == lay.mem_arena and named == arena.address and \
            slice_index == index and 0 < slices <= arena.blocks - index else "does not name its arena and slice"
        reserved = slices * arena.block_size
        committed = bits_in(arena.committed, index, slices) * arena.block_size
    else:
        at, size = word(lay.page_memid), word(lay.page_memid + 8)
        problem = None if own_memory(lay, info, at, size) else "taken from the system, does not name its memory"
        slices, reserved = size // lay.slice_size, size
        committed = os_committed(lay, at, start, block, half(lay.page_reserved), size)
    if problem is None and not (0 < block and at <= start < at + reserved):
        problem = f"has blocks of {block} bytes from {start:#x}, outside its {reserved} bytes"
    if problem is not None:
        where = "counted as its arena's own" if arena is not None else "left out of every figure"
        findings.append(Finding(Severity.ERROR, at, "mi_page_t", f"the page at {at:#x} {problem}: its memory is "
                                f"{where}", SEGMENT))
        return None
    xthread = word(lay.page_xthread_id)
    owner = xthread & ~_FLAGS
    one = lambda v: same.setdefault(v, v)        # noqa: E731
    page = MiPage(at, 0, info, one(slices), start, one(block), one(half(lay.page_capacity)),
                  one(half(lay.page_reserved)), one(half(lay.page_used)), one(word(lay.page_heap)),
                  bool(xthread & _IN_FULL),
                  (word(lay.page_free), word(lay.page_local_free), word(lay.page_thread_free) & ~1))
    return MiSegment(at, 0 if arena is not None else 1, page.slices, 0, one(owner), 1, 0 if owner else 1, 0,
                     one(reserved), one(committed), 0, arena=arena, pages=[page], spans=_NO_SPANS)


def os_committed(lay: Mi3Layout, base: int, start: int, block: int, blocks: int, size: int) -> int:
    """What a page taken from the system (its memory from BASE, SIZE bytes; blocks of BLOCK bytes from START,
    BLOCKS of them) has committed, as mimalloc counts it: all of it; from 3.6 its slices only (not the table
    before them, nor the rounding after): for a page of many blocks the page size whose room makes that many
    blocks, for a page of one block that block and its greatest start offset (none when aligned by the system)
    in whole slices.  Held to SIZE."""
    if not lay.os_page_sizes or block <= 0:
        return size
    offset = start % lay.slice_size
    if blocks > 1:
        fit = next((p for p in lay.os_page_sizes if p > offset and (p - offset) // block == blocks), None)
        if fit is not None:
            return min(fit, size)
    aligned = start - base >= 2 * lay.slice_size
    need = block + (0 if aligned else max(offset, lay.cache_offset_max))
    return min(-(-need // lay.slice_size) * lay.slice_size, size)


def own_memory(lay: Mi3Layout, info: int, base: int, size: int) -> bool:
    """Whether a page taken from the system whose mi_page_t is at INFO names its memory (BASE, SIZE bytes):
    at its mi_page_t, or (3.6) from the aligned area whose table holds it."""
    if size <= 0 or size % lay.slice_size:
        return False
    if lay.page_meta_aligned:
        return not base % lay.page_meta_aligned and base <= info < base + min(size, lay.page_meta_aligned)
    return base == info and not info % lay.slice_size


def _page_meta(mem: Memory, lay: Mi3Layout, at: int, arena: Mi3Arena | None, index: int,
               findings: list[Finding]) -> int | None:
    """Where the mi_page_t of the page at AT is (slice INDEX of ARENA; else the page map named it): from 3.6 its
    slice's entry in its aligned area's table says (itself, or one at the page's start)."""
    if arena is None:
        return at
    if not lay.page_meta_aligned:
        return arena.page_info(index, lay.page)
    area = lay.page_meta_aligned
    entry = (at & ~(area - 1)) + (at % area >> lay.slice_shift) * lay.page
    try:
        info = u64(mem, entry)
    except ReadError as exc:
        findings.append(Finding(Severity.ERROR, entry, "mi_page_t", f"the page table entry of the page at {at:#x} "
                                f"cannot be read ({exc})", SEGMENT))
        return None
    if info not in (entry, at):
        findings.append(Finding(Severity.ERROR, entry, "mi_page_t", f"the page table entry of the page at {at:#x} "
                                f"points to {info:#x}, neither itself nor the page's start: its memory is counted as "
                                "its arena's own", SEGMENT))
        return None
    return info
