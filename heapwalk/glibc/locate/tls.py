"""Finding the TLS offsets of tcache and thread_arena (symbol, malloc's GOT slot, or candidates tried on every
thread), the tcache chunk size threads show, and whether their tcache links are safe-linked."""

from __future__ import annotations

from heapwalk.common.findings import Severity
from heapwalk.glibc.locate import heuristics
from heapwalk.glibc.locate.layout import Layout, layout_for
from heapwalk.glibc.locate.search import Search
from heapwalk.inferior.memory import ReadError, u64


def _classify_tcache(search: Search, expected: set[int]):
    image = search.image

    def classify(value: int) -> str:
        if value == 0 or (image is not None and image.contains(value)):
            return "none"  # not created yet, or 2.43's read-only dummy
        if value % 16:
            return "invalid"
        size = heuristics.tcache_struct_chunk(heuristics.tcache_chunk_size(search.mem, value))
        return "valid" if size in expected else "invalid"
    return classify


def find_tcache_tpoff(search: Search, layout: Layout | None) -> tuple[int | None, int | None]:
    """tcache's TLS offset, and the tcache chunk size seen in memory (None if no thread has one)."""
    if layout is not None and not layout.has_tcache:
        return None, None
    expected = set(heuristics.TCACHE_CHUNK_SIZES)
    classify = _classify_tcache(search, expected)
    tpoff = search.symbols.tls_offset("tcache")
    how = "symbol tcache (TLS)"
    if tpoff is None and search.image is not None:
        code = search.code("malloc", 512)
        slot = search.image.code.tls_slot(*code) if code else None
        if slot is not None:
            try:
                value = u64(search.mem, slot)
                candidate = value - (1 << 64) if value >> 63 else value
                if heuristics.pick_tls_offset(search.mem, search.thread_pointers, [candidate], classify) or \
                        not search.thread_pointers:
                    tpoff, how = candidate, f"GOT slot {slot:#x} read by malloc (disassembly)"
            except ReadError:
                pass
        if tpoff is None and search.thread_pointers:
            picked = heuristics.pick_tls_offset(search.mem, search.thread_pointers,
                                                search.tls_candidates(), classify)
            if picked is not None:
                tpoff, how = picked[0], f"candidate TLS offsets tried on every thread ({picked[1]} tcaches)"
    if tpoff is None:
        search.unknown("tcache_tls_offset", "no symbol, and no candidate offset gives tcache structs")
        return None, None
    search.fact("tcache_tls_offset", tpoff, how)
    sizes = set()
    for fs in search.thread_pointers:
        try:
            value = u64(search.mem, fs + tpoff)
        except ReadError:
            continue
        if classify(value) == "valid":
            sizes.add(heuristics.tcache_struct_chunk(heuristics.tcache_chunk_size(search.mem, value)))
    if len(sizes) > 1:
        search.note(Severity.WARNING, 0, f"threads' tcache chunks have different sizes: {sorted(sizes)}")
    return tpoff, min(sizes) if sizes else None


def safe_linking_shown(search: Search, tpoff: int | None, tcache_chunk: int | None) -> tuple[int, int] | None:
    """The threads' tcaches' votes on whether links are mangled (`heuristics.tcache_link_votes`: plain, mangled),
    None when there is no tcache to ask."""
    if tpoff is None or tcache_chunk not in heuristics.TCACHE_CHUNK_SIZES:
        return None
    shape = layout_for(heuristics.TCACHE_CHUNK_SIZES[tcache_chunk])
    pointers = []
    for fs in search.thread_pointers:
        try:
            value = u64(search.mem, fs + tpoff)
        except ReadError:
            continue
        if value and value % 16 == 0 and not (search.image and search.image.contains(value)):
            pointers.append(value)
    return heuristics.tcache_link_votes(search.mem, pointers, shape.tcache_off_entries, shape.tcache_bins)


def find_thread_arena_tpoff(search: Search, ring: list[int], layout: Layout) -> int | None:
    tpoff = search.symbols.tls_offset("thread_arena")
    if tpoff is not None:
        search.fact("thread_arena_tls_offset", tpoff, "symbol thread_arena (TLS)")
        return tpoff
    if search.image is None or not search.thread_pointers:
        search.unknown("thread_arena_tls_offset", "no symbol, no libc image or no threads")
        return None
    arenas = set(ring)

    def classify(value: int) -> str:
        return "valid" if value in arenas else "none" if value == 0 else "invalid"
    picked = heuristics.pick_tls_offset(search.mem, search.thread_pointers,
                                        search.tls_candidates(), classify)
    if picked is None:
        search.unknown("thread_arena_tls_offset", "no candidate offset gives ring arenas")
        return None
    search.fact("thread_arena_tls_offset", picked[0],
                f"candidate TLS offsets tried on every thread ({picked[1]} arenas)")
    return picked[0]
