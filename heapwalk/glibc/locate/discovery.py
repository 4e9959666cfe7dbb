"""Finding glibc's malloc state in a target: version, layout, main_arena, mp_, TLS offsets.

Each fact is looked for in order of trust: the user's override (``set heapwalk
...``), debug symbols (a `SymbolSource` from the gdb layer), libc's own image
(banner, exported functions, file name: needs the libc file or a live
process), and memory alone (`heapwalk.glibc.locate.heuristics`).  Every fact records how it
was found.  The layout that the version implies is then checked against memory
(arena layout from the bin-127 self-links, heap_info size from thread arena
addresses, tcache struct size from a thread's tcache chunk); where memory
disagrees, memory wins and a finding says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from heapwalk.common.findings import Fact, Finding, Severity
from heapwalk.glibc.locate import headless, heuristics
from heapwalk.glibc.locate.layout import HEAP_MAX_SIZE, Layout, UnsupportedVersion, layout_for
from heapwalk.glibc.locate.layoutcheck import confirm_layout, version_from_memory
from heapwalk.glibc.locate.mainarena import find_main_arena, heaps_evidence, main_arena_by_heaps, main_arena_gone, \
    main_memory_start, ring_of
from heapwalk.glibc.locate.mp import find_mp, heap_max_size
from heapwalk.glibc.locate.search import DiscoveryError, NoSymbols, Overrides, Search, SymbolSource, parse_version, \
    read_c_string, version_text
from heapwalk.glibc.locate.tls import find_tcache_tpoff, find_thread_arena_tpoff, safe_linking_shown
from heapwalk.inferior.elf import Mapping
from heapwalk.inferior.memory import Memory, readable

__all__ = ["Discovery", "DiscoveryError", "MallocUnused", "NoSymbols", "Overrides", "SymbolSource", "discover",
           "foreign_allocator", "main_memory_start", "parse_version", "read_c_string"]


@dataclass
class Discovery:
    """What heapwalk needs to walk the heap, with how each part was found."""

    version: tuple[int, int]
    layout: Layout
    main_arena: int | None      # None: known only to lie where the core is missing (see `headless`)
    mp_address: int | None
    tcache_tpoff: int | None
    thread_arena_tpoff: int | None
    free_list_address: int | None
    heap_max_size: int = HEAP_MAX_SIZE
    facts: list[Fact] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    version_label: str = ""
    libc_range: tuple[int, int] | None = None  # a tcache pointer in here is 2.43's "no tcache" dummy
    abort_msg_address: int | None = None       # glibc's __abort_msg: set when glibc aborts with a message
    page_size: int = 4096                      # the target's page (AT_PAGESZ): what trim and mmap round to

    def is_libc_address(self, address: int) -> bool:
        return self.libc_range is not None and self.libc_range[0] <= address < self.libc_range[1]

    def found_by(self, name: str) -> str | None:
        return next((f.found_by for f in self.facts if f.name == name), None)


class MallocUnused(DiscoveryError):
    """glibc's malloc holds nothing: main_arena was never initialised (malloc never called, or another
    allocator serves the program)."""


#: other allocators a program may be linked with or preloaded (LD_PRELOAD): mapped file name -> name
FOREIGN_ALLOCATORS = (("libjemalloc", "jemalloc"), ("libtcmalloc", "tcmalloc"), ("libmimalloc", "mimalloc"),
                      ("libhoard", "Hoard"), ("libsnmalloc", "snmalloc"))


def foreign_allocator(mappings: list[Mapping]) -> tuple[str, str] | None:
    """(allocator, mapped file) when the target maps another malloc implementation, else None."""
    for m in mappings:
        base = m.path.rsplit("/", 1)[-1]
        for prefix, name in FOREIGN_ALLOCATORS:
            if base.startswith(prefix):
                return name, m.path
    return None


def discover(mem: Memory, symbols: SymbolSource, overrides: Overrides | None = None,
             mappings: list[Mapping] | None = None, thread_pointers: list[int] | None = None,
             core: bool = False, regions: list[tuple[int, int]] | None = None) -> Discovery:
    """Locates version, layout, main_arena, mp_ and the TLS offsets of tcache and thread_arena.

    MAPPINGS (the target's address space) lets discovery find libc's image;
    THREAD_POINTERS (each thread's) lets it recover TLS offsets.
    CORE: the target is a core file, whose missing pages the debugger reads from the library files.
    REGIONS (where chunks may lie; MAPPINGS' ranges when None) lets it find thread arenas by their heaps
    when libc's memory does not show main_arena.
    """
    search = Search(mem, symbols, overrides or Overrides(), mappings or [], [f for f in thread_pointers or [] if f],
                    core, regions)
    search.locate_libc()
    version, version_how = search.version()
    try:
        layout = layout_for(version) if version is not None else None
    except UnsupportedVersion as exc:
        raise DiscoveryError(str(exc)) from None
    main_arena, family, by_heaps = _locate_main_arena(search, version, version_how)
    layout = layout or layout_for(family)
    family = family or next(f for f in heuristics.ARENA_FAMILIES if layout.version >= f)
    ring_layout = layout if layout_for(family).off_next == layout.off_next else layout_for(family)
    ring = ring_of(mem, ring_layout, main_arena) if main_arena is not None else []
    shown = _shown(search, ring, main_arena, family, layout if version else None, ring_layout, by_heaps)
    layout, label = _layout_and_label(search, version, version_how, family, shown, by_heaps)

    abort_msg = search.symbols.data_address("__abort_msg")
    if abort_msg is None and search.image is not None:
        abort_msg = search.image.dynamic_symbol("__abort_msg")
    return Discovery(version=layout.version, layout=layout, main_arena=main_arena, mp_address=shown.mp_address,
                     tcache_tpoff=shown.tcache_tpoff,
                     thread_arena_tpoff=find_thread_arena_tpoff(search, ring, layout),
                     free_list_address=search.symbols.data_address("free_list"),
                     heap_max_size=heap_max_size(search, layout, shown.mp_address, ring), facts=search.facts,
                     findings=search.findings, version_label=label, libc_range=search.libc_range(),
                     abort_msg_address=abort_msg)


def _locate_main_arena(search: Search, version: tuple[int, int] | None, version_how: str
                       ) -> tuple[int | None, tuple[int, int] | None, headless.HeapArenas | None]:
    """main_arena, the arena layout family memory shows, and the heaps that told them when libc's memory
    could not (None when it could)."""
    by_heaps = None
    try:
        main_arena, family = find_main_arena(search, version)
    except DiscoveryError as exc:
        by_heaps = main_arena_by_heaps(search, version)
        if by_heaps is None and version is None:
            raise DiscoveryError(f"cannot tell which glibc this is ({version_how}), and {exc}") from None
        if by_heaps is None:
            raise
        main_arena, family = by_heaps.main_arena, by_heaps.family
    if version is None and family is None and main_arena is not None and not readable(search.mem, main_arena):
        by_heaps = heaps_evidence(search)  # main_arena is known (a symbol) but gone: the heaps tell the layout
        if by_heaps is not None:
            family = by_heaps.family
            main_arena_gone(search, main_arena)
    if version is None and family is None:
        raise DiscoveryError(f"cannot tell which glibc this is ({version_how}) and memory shows no arena; "
                             "use 'set heapwalk glibc-version X.Y' and 'set heapwalk main-arena ADDRESS'")
    return main_arena, family, by_heaps


@dataclass(frozen=True)
class _Shown:
    """What memory shows of the layout, and where mp_ and tcache are."""

    heap_info_size: int | None
    mp_address: int | None
    mp_variant: tuple[int, int] | None
    tcache_tpoff: int | None
    tcache_chunk: int | None
    safe_linking: bool | None
    link_votes: tuple[int, int] | None = None   # the tcaches' (plain, mangled) votes behind SAFE_LINKING


def _shown(search: Search, ring: list[int], main_arena: int | None, family: tuple[int, int],
           layout: Layout | None, ring_layout: Layout, by_heaps: headless.HeapArenas | None) -> _Shown:
    """The layout evidence in memory: thread arenas' addresses, mp_, the threads' tcaches, or the heaps'."""
    heap_info_size = next((heuristics.heap_info_size_of(a) for a in ring[1:]
                           if heuristics.heap_info_size_of(a) in (32, 48)), None)
    mp_address, mp_variant = (None, None) if main_arena is None else \
        find_mp(search, main_arena, family, layout, ring_layout)
    tcache_tpoff, tcache_chunk = find_tcache_tpoff(search, layout)
    votes = safe_linking_shown(search, tcache_tpoff, tcache_chunk)
    safe_linking = None if votes is None or votes[0] == votes[1] else votes[1] > votes[0]
    if by_heaps is not None:
        heap_info_size = heap_info_size or by_heaps.heap_info_size
        tcache_chunk = tcache_chunk or by_heaps.tcache_chunk
        safe_linking = by_heaps.safe_linking if safe_linking is None else safe_linking
    return _Shown(heap_info_size, mp_address, mp_variant, tcache_tpoff, tcache_chunk, safe_linking, votes)


def _layout_and_label(search: Search, version: tuple[int, int] | None, version_how: str,
                      family: tuple[int, int], shown: _Shown, by_heaps: headless.HeapArenas | None
                      ) -> tuple[Layout, str]:
    """The layout to decode with, confirmed by memory, and the version label the output shows."""
    if version is None:
        version, label = version_from_memory(family, shown.heap_info_size, shown.tcache_chunk,
                                             shown.mp_variant, shown.safe_linking)
        if by_heaps is not None and not by_heaps.arenas:
            label = headless.heap_only_label(by_heaps)
        search.fact("glibc_version", None, f"not determined: {version_how}")
        search.fact("layout", f"glibc {label}", "memory: arena layout, heap_info size, tcache chunk size, mp_")
        search.note(Severity.INFO, 0, f"the glibc version is unknown ({version_how}); decoding with the "
                    f"glibc {label} layout that memory shows")
        known = False
    else:
        label = version_text(version)
        search.fact("glibc_version", label, version_how)
        search.fact("layout", layout_for(version).name, f"glibc {label} layout table, checked against memory")
        known = True
    # a known version's safe-linking is corrected only by decisive votes: one poisoned tcache link is a
    # finding at its entry, never a reason to doubt the version
    safe_linking = shown.safe_linking if not known or shown.link_votes is None else \
        heuristics.decisive(shown.link_votes)
    layout = confirm_layout(layout_for(version), family, shown.heap_info_size, shown.tcache_chunk,
                            safe_linking, shown.mp_variant, search, known)
    return layout, label
