"""Finding main_arena: by override, symbol, the bin-127 scan of libc's data or malloc_trim's code, or, when
libc's memory is gone, through the ring of the thread arenas found by their heaps; and the arena ring and the
start of the main arena's memory read from it."""

from __future__ import annotations

from heapwalk.common.findings import Severity
from heapwalk.glibc.locate import headless, heuristics
from heapwalk.glibc.locate.layout import Layout, UnsupportedVersion, layout_for
from heapwalk.glibc.locate.arenashape import plausible_arena
from heapwalk.glibc.locate.search import DiscoveryError, Search
from heapwalk.inferior.memory import Memory, ReadError, readable, u64


def ring_of(mem: Memory, layout: Layout, main_arena: int) -> list[int]:
    ring = [main_arena]
    for _ in range(1 << 12):
        try:
            nxt = u64(mem, ring[-1] + layout.off_next)
        except ReadError:
            break
        if nxt in (0, main_arena) or nxt in ring:
            break
        ring.append(nxt)
    return ring


def find_main_arena(search: Search, version: tuple[int, int] | None) -> tuple[int, tuple[int, int] | None]:
    """main_arena's address and, when memory shows it, the arena layout family."""
    scanned = heuristics.find_main_arena(search.mem, search.image, version) if search.image else None
    if search.overrides.main_arena is not None:
        search.fact("main_arena", search.overrides.main_arena, "set heapwalk main-arena")
        return search.overrides.main_arena, scanned.family if scanned and \
            scanned.address == search.overrides.main_arena else None
    symbol = search.symbols.data_address("main_arena")
    if symbol is not None:
        search.fact("main_arena", symbol, "symbol main_arena")
        if scanned is not None and scanned.address != symbol:
            search.note(Severity.WARNING, symbol, f"the bin-127 scan found main_arena at {scanned.address:#x}, "
                        "not where the symbol says; using the symbol")
            return symbol, None
        return symbol, scanned.family if scanned else None
    if scanned is not None:
        search.fact("main_arena", scanned.address, "bin-127 self-link scan of libc's writable segment, "
                    f"arena ring of {len(scanned.ring)} closes")
        target = trim_target(search)
        if target is not None and target != scanned.address:
            search.note(Severity.WARNING, scanned.address, f"malloc_trim refers to {target:#x}, not to the "
                        f"main_arena found in memory ({scanned.address:#x}); using memory")
        return scanned.address, scanned.family
    target = trim_target(search)
    if target is not None and version is not None and _could_be_main_arena(search.mem, version, target):
        search.fact("main_arena", target, "first address computed by malloc_trim (disassembly)")
        return target, None
    raise DiscoveryError("cannot find main_arena: no libc debug symbols, no self-linked bin 127 in libc's "
                         "writable memory (is malloc initialised? is this glibc?), and libc's code is not "
                         "readable; use 'set heapwalk main-arena ADDRESS'")


def _could_be_main_arena(mem: Memory, version: tuple[int, int], address: int) -> bool:
    """Whether ADDRESS, which libc's code names, holds an arena of glibc VERSION's shape, or is not in memory
    to tell (a core without libc's data)."""
    if not readable(mem, address):
        return True
    try:
        return plausible_arena(mem, layout_for(version), address)
    except UnsupportedVersion:
        return False


def trim_target(search: Search) -> int | None:
    """The first address malloc_trim computes (relative to the program counter): main_arena.  Builds schedule it from 32
    bytes in (Debian's) to 94 (a gcc 12 build of 2.39), so 128 bytes are read."""
    code = search.code("malloc_trim", 128)
    return search.image.code.first_address(*code) if code else None


def main_arena_by_heaps(search: Search, version: tuple[int, int] | None) -> headless.HeapArenas | None:
    """main_arena's address from the ring of the thread arenas found by their heaps, when libc's memory does
    not show it (a core cut short before libc's segments); None when no heap holds an arena, or the
    overrides name main_arena."""
    if search.overrides.main_arena is not None:
        return None
    found = heaps_evidence(search)
    if found is None:
        return None
    if found.main_arena is None:
        search.unknown("main_arena", f"the ring of the {len(found.arenas)} thread arena(s) found by their heaps "
                       "leads only to arenas whose memory is missing" if found.arenas else
                       "libc's memory is missing, and no thread arena is left to lead to it")
        search.note(Severity.ERROR, 0, "main_arena is not found: libc's memory is missing (a truncated core?), "
                    + ("and the ring of the thread arenas found by their heaps leads only to arenas whose memory "
                       "is missing too; those found are decoded" if found.arenas else "and no thread arena is "
                       "left to lead to it") + "; the main heap is walked without the arena's lists, when it is "
                    "found by its chunks")
        present = True
    else:
        present = readable(search.mem, found.main_arena)
        search.fact("main_arena", found.main_arena, f"the ring of the {len(found.arenas)} thread arena(s) found "
                    "by their heaps" + ("" if present else " (main_arena itself is not in the target's memory)"))
    if not present:
        main_arena_gone(search, found.main_arena)
    for arena in found.lost:
        search.note(Severity.ERROR, arena, "this thread arena, which the ring leads to, is not in the target's "
                    "memory (a truncated core?): it is not decoded")
    return found


def main_arena_gone(search: Search, address: int) -> None:
    search.note(Severity.ERROR, address, "main_arena is not in the target's memory (libc's writable data is "
                "missing: a truncated core?): the thread arenas found by their heaps are decoded, and the main "
                "heap is walked without the arena's lists, when it is found by its chunks")


def heaps_evidence(search: Search) -> headless.HeapArenas | None:
    """The thread arenas found by their heaps, or else the main heap found by its chunks (None: neither)."""
    return headless.arenas_from_heaps(search.mem, search.regions) or headless.heap_only(search.mem, search.regions)


def main_memory_start(mem: Memory, main_arena: int, top: int, flags: int, system_mem: int,
                      layout: Layout) -> int | None:
    """Where the main arena's sbrk memory starts (what mp_.sbrk_base holds), from main_arena alone: 0 when it
    never grew, else its top's end minus system_mem (glibc counts every byte from the first break, foreign
    sbrk included, and systrim takes back what it releases); None when the arena is not contiguous (its
    memory is in mmap'd pieces), or top is unreadable or damaged (no chunk's size, or what it says leads
    to no memory)."""
    if flags & 2:  # NONCONTIGUOUS_BIT
        return None
    if system_mem == 0:
        return 0
    try:
        top_size = u64(mem, top + 8) & ~7
    except ReadError:
        return None
    start = top + top_size - system_mem
    if top_size < 4 * 8 or top_size % 16 or not 0 < start <= top:
        return None
    try:
        mem.read(start, 8)
    except ReadError:
        return None
    return start
