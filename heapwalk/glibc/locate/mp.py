"""Finding mp_ (malloc_par) and the thread-arena heap size it implies, with no field expected to hold its
default: anchored by main_arena and malloc_stats' code."""

from __future__ import annotations

import struct

from heapwalk.common.findings import Severity
from heapwalk.glibc.locate import heuristics, mpshape
from heapwalk.glibc.locate.layout import HEAP_MAX_SIZE, Layout
from heapwalk.glibc.locate.mainarena import main_memory_start
from heapwalk.glibc.locate.search import Search
from heapwalk.inferior.memory import ReadError, u64


def _mp_anchors(search: Search, main_arena: int, ring_layout: Layout) -> mpshape.MpAnchors:
    """What main_arena and libc's code say about mp_, before mp_ is found."""
    top = start = None
    try:
        top = u64(search.mem, main_arena + ring_layout.off_top)
        flags = struct.unpack("<i", search.mem.read(main_arena + ring_layout.off_flags, 4))[0]
        system_mem = u64(search.mem, main_arena + ring_layout.off_system_mem)
        start = main_memory_start(search.mem, main_arena, top, flags, system_mem, ring_layout)
    except ReadError:
        pass
    code = search.code("malloc_stats", 160)
    loads = frozenset(r.target for r in search.image.code.address_refs(*code) if not r.computes) if code \
        else frozenset()
    return mpshape.MpAnchors(main_start=start, main_top=top, stats_loads=loads)


def find_mp(search: Search, main_arena: int, family: tuple[int, int], layout: Layout | None,
             ring_layout: Layout) -> tuple[int | None, tuple[int, int] | None]:
    """mp_'s address and the mp_ layout variant memory matched (None if memory did not tell).

    No field is expected to hold glibc's default: a candidate is pinned down by what agrees with it
    (`mpshape.mp_evidence`), and the facts say which of its fields nothing confirmed."""
    variants = list(heuristics.MP_FOR_FAMILY[family])
    if layout is not None:
        own = next(v for v in heuristics.MP_VARIANTS if layout.version >= v)
        variants = [own] + [v for v in variants if v != own]
    anchors = _mp_anchors(search, main_arena, ring_layout)
    symbol = search.symbols.data_address("mp_")
    if symbol is not None:
        search.fact("mp_", symbol, "symbol mp_")
        fits = mpshape.mp_variant_at(search.mem, symbol, variants, anchors)
        if fits is None:
            search.note(Severity.WARNING, symbol, "the mp_ symbol's memory fits no malloc_par layout: its "
                        "counters are out of range (damaged?)")
        return symbol, fits.variant if fits else None
    if search.image is None:
        search.unknown("mp_", "no libc image")
        return None, None
    found = mpshape.find_mp(search.mem, search.image, main_arena, variants, anchors)
    if found is None:
        search.unknown("mp_", "no malloc_par-shaped data near main_arena")
        return None, None
    if found.evidence:
        how = "malloc_par near main_arena: " + "; ".join(found.evidence)
    else:
        how = ("the malloc_par-shaped data nearest main_arena; nothing else in memory confirms it (the main "
               "arena is not contiguous and libc's code is not readable)")
    search.fact("mp_", found.address, how)
    return found.address, found.variant


def heap_max_size(search: Search, layout: Layout, mp_address: int | None, ring: list[int]) -> int:
    """The size and alignment of thread-arena heaps: 64 MiB, or 4 x hp_pagesize on 2.35-2.41 with hugetlb."""
    offset = layout.mp.get("hp_pagesize")      # (memory may show an mp_ layout without it)
    if layout.heaps_by_hugepages and mp_address is not None and offset is not None:
        try:
            hp = u64(search.mem, mp_address + offset)
        except ReadError:
            hp = None
        if hp:
            search.fact("heap_max_size", 4 * hp, f"4 x mp_.hp_pagesize ({hp:#x})")
            return 4 * hp
        if hp == 0:
            search.fact("heap_max_size", HEAP_MAX_SIZE, "mp_.hp_pagesize is 0: HEAP_MAX_SIZE")
            return HEAP_MAX_SIZE
    search.fact("heap_max_size", HEAP_MAX_SIZE, f"HEAP_MAX_SIZE of glibc {layout.version[0]}.{layout.version[1]}")
    return HEAP_MAX_SIZE
