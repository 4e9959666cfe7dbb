"""Finding glibc's malloc state in a target: version, layout, main_arena, mp_, TLS offsets.

Each fact is looked for in order of trust: the user's override (``set heapwalk
...``), debug symbols (a `SymbolSource` from the gdb layer), libc's own image
(banner, exported functions, file name: needs the libc file or a live
process), and memory alone (`heapwalk.glibc.heuristics`).  Every fact records how it
was found.  The layout that the version implies is then checked against memory
(arena layout from the bin-127 self-links, heap_info size from thread arena
addresses, tcache struct size from a thread's tcache chunk); where memory
disagrees, memory wins and a finding says so.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from dataclasses import dataclass, field
from typing import Protocol

from heapwalk.glibc import headless, heuristics
from heapwalk.target import x86
from heapwalk.target.elf import LIBC_FILE_NAME, PF_W, PT_LOAD, LibcImage, Mapping, find_libc, sole_file
from heapwalk.glibc.layout import HEAP_MAX_SIZE, Layout, UnsupportedVersion, layout_for
from heapwalk.target.memory import Memory, ReadError, readable, u64
from heapwalk.findings import Fact, Finding, Kind, Severity

__all__ = ["MallocUnused", "foreign_allocator", "SymbolSource", "NoSymbols", "Overrides", "Discovery", "DiscoveryError", "discover", "main_memory_start", "parse_version",
           "read_c_string"]


class DiscoveryError(Exception):
    """glibc's malloc state could not be located; the message says what is missing."""


class SymbolSource(Protocol):
    """Answers from debug information, or None when it has no answer."""

    def data_address(self, name: str) -> int | None:
        """Address of libc's data object NAME (main_arena, mp_, free_list, __libc_version)."""

    def tls_offset(self, name: str) -> int | None:
        """Offset of libc's TLS variable NAME from a thread's $fs_base (tcache, thread_arena)."""

    def libc_file(self) -> tuple[str, str | None] | None:
        """(path, build-id) of the libc file the debugger loaded, whose symbols these are; None if none."""


class NoSymbols:
    """A SymbolSource that knows nothing."""

    def data_address(self, name: str) -> int | None:
        return None

    def tls_offset(self, name: str) -> int | None:
        return None

    def libc_file(self) -> tuple[str, str | None] | None:
        return None


class _Refusing:
    """Memory with some ranges taken away: reads that touch them fail (pages a core lacks, which gdb would
    fill from a library file that is not the one the process ran)."""

    def __init__(self, mem: Memory, ranges: list[tuple[int, int]], reason: str):
        self._mem, self._ranges, self._reason = mem, ranges, reason

    def read(self, address: int, size: int) -> bytes:
        for start, end in self._ranges:
            if address < end and start < address + size:
                raise ReadError(address, size, self._reason)
        return self._mem.read(address, size)


@dataclass
class Overrides:
    """Values the user set with ``set heapwalk ...``; None means discover."""

    glibc_version: tuple[int, int] | None = None
    main_arena: int | None = None


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


_VERSION = re.compile(rb"(\d+)\.(\d+)")


def parse_version(text: str | bytes) -> tuple[int, int]:
    """'2.36' (or 'GNU C Library ... release version 2.36.') -> (2, 36)."""
    if isinstance(text, str):
        text = text.encode()
    m = re.search(rb"release version (\d+)\.(\d+)", text) or _VERSION.search(text)
    if not m:
        raise ValueError(f"no glibc version in {text[:60]!r}")
    return int(m.group(1)), int(m.group(2))


def read_c_string(mem: Memory, address: int, limit: int = 256) -> bytes:
    """The NUL-terminated string at ADDRESS (at most LIMIT bytes)."""
    out = bytearray()
    while len(out) < limit:
        chunk = mem.read(address + len(out), 16)
        nul = chunk.find(b"\0")
        if nul >= 0:
            return bytes(out + chunk[:nul])
        out += chunk
    return bytes(out)


def _version_text(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


class _Search:
    """State shared by the discovery steps: what is known so far, and the facts and findings recorded."""

    def __init__(self, mem: Memory, symbols: SymbolSource, overrides: Overrides, mappings: list[Mapping],
                 fs_bases: list[int], core: bool = False, regions: list[tuple[int, int]] | None = None):
        self.mem = mem
        self.regions = regions if regions is not None else [(m.start, m.end) for m in mappings]
        self.core = core
        self.foreign_libc_file = False   # gdb loaded another build of libc than the process ran
        self.symbols = symbols
        self.overrides = overrides
        self.mappings = mappings
        self.fs_bases = fs_bases
        self.facts: list[Fact] = []
        self.findings: list[Finding] = []
        self.image: LibcImage | None = None
        self.libc_problem = "no libc.so.6 among the mappings (a static binary?)"  # why image is None
        self._tls_candidates: list[int] | None = None

    def libc_range(self) -> tuple[int, int] | None:
        loads = [s for s in self.image.segments if s.type == 1] if self.image else []
        return (min(s.address for s in loads), max(s.end for s in loads)) if loads else None

    def tls_candidates(self) -> list[int]:
        """Candidate TLS offsets from libc's writable segments, scanned once for tcache and thread_arena."""
        if self._tls_candidates is None:
            self._tls_candidates = heuristics.tls_candidates(self.mem, self.image)
        return self._tls_candidates

    def fact(self, name: str, value, how: str) -> None:
        self.facts.append(Fact(name, value, how))

    def note(self, severity: Severity, address: int, message: str) -> None:
        self.findings.append(Finding(severity, address, "discovery", message, Kind.DISCOVERY))

    def unknown(self, name: str, why: str) -> None:
        self.facts.append(Fact(name, None, f"not determined: {why}"))

    def code(self, function: str, size: int = 256) -> tuple[bytes, int] | None:
        """(first SIZE bytes, address) of libc's exported FUNCTION, if its code is readable."""
        if self.image is None:
            return None
        address = self.image.dynamic_symbol(function)
        if address is None:
            return None
        try:
            return self.mem.read(address, size), address
        except ReadError:
            return None

    # -- libc ---------------------------------------------------------------------------------------------

    def locate_libc(self) -> None:
        found = find_libc(self.mappings)
        how = "mappings"
        if found is None:
            found = sole_file(self.mappings)
            how = "mappings: the only file mapped, a statically linked program"
        if found is None and self.core and not self.mappings:
            self.libc_problem = "the core records no mapped files (its notes are missing: a truncated core?)"
            self.unknown("libc", self.libc_problem)
            return
        if found is None:
            self.libc_problem = "no libc.so.6 or libc-2.NN.so among the mappings (static binary?)"
            self.unknown("libc", self.libc_problem)
            return
        base, path = found
        try:
            self.image = LibcImage.read(self.mem, base, path)
        except ReadError as exc:
            self.libc_problem = (f"libc ({path}) is mapped at {base:#x}, but its ELF header there is unreadable "
                                 f"({exc.reason})")
            self.unknown("libc", self.libc_problem)
            return
        self.fact("libc", {"base": base, "path": path}, how)
        build_id = self.image.build_id()
        if build_id:
            self.fact("libc_build_id", build_id, "note in libc's first page")
            self.check_libc_file(base, build_id)

    def check_libc_file(self, base: int, build_id: str) -> None:
        """Stops trusting a libc file the debugger loaded that is another build than the process ran (a core
        opened on a machine with another glibc, or a live process whose libc was upgraded on disk): its
        symbols would point at the wrong places and, in a core, the pages it fills in would be another
        libc's."""
        loaded = self.symbols.libc_file()
        if loaded is None or not loaded[1] or loaded[1] == build_id:
            return
        path, file_id = loaded
        self.symbols = NoSymbols()
        self.foreign_libc_file = True
        what = "its symbols"
        if self.core:
            first_page = base + 0x1000
            kept = [(max(s.address, first_page), s.end) for s in self.image.segments
                    if s.type == PT_LOAD and not s.flags & PF_W and s.end > first_page]
            self.mem = _Refusing(self.mem, kept, f"{path} is not the libc the process ran")
            self.image = LibcImage.read(self.mem, base, self.image.path)
            what = "its symbols and the read-only pages it would fill in"
        self.note(Severity.WARNING, base, f"the libc file gdb loaded ({path}, build-id {file_id}) is not the one "
                  f"the process ran (build-id {build_id}): {what} are not used; open the target with the "
                  "process's own libc (heapwalk report --sysroot DIR, or 'set sysroot' / 'set solib-search-path' "
                  "in gdb before loading the core)")

    # -- version ------------------------------------------------------------------------------------------

    def version(self) -> tuple[tuple[int, int] | None, str]:
        """The glibc version and how it was found, or (None, why not)."""
        if self.overrides.glibc_version:
            return self.overrides.glibc_version, "set heapwalk glibc-version"
        address = self.symbols.data_address("__libc_version")
        if address is not None:
            try:
                return parse_version(read_c_string(self.mem, address)), "symbol __libc_version"
            except (ReadError, ValueError):
                pass
        if self.image is None:
            return None, self.libc_problem
        banner = self.image.find_bytes(b"GNU C Library ")
        if banner is not None and b"release version " in banner[1]:
            try:
                return parse_version(banner[1]), f"banner in libc's read-only data at {banner[0]:#x}"
            except ValueError:
                pass
        code = self.code("gnu_get_libc_version", 16)
        if code is not None:
            target = x86.first_lea(*code)
            if target is not None:
                try:
                    return parse_version(read_c_string(self.mem, target, 16)), \
                        f"string returned by gnu_get_libc_version at {target:#x}"
                except (ReadError, ValueError):
                    pass
        m = LIBC_FILE_NAME.search(self.image.path)
        if m and m.group(1):
            return (int(m.group(1)), int(m.group(2))), f"file name {self.image.path}"
        if self.foreign_libc_file:
            return None, "libc's read-only pages are not in the core and the libc file gdb has is another build"
        return None, "libc's read-only pages are not in the core and its file is not available"


_LAYOUT_PARTS = {"heap_info_size": "heap_info size", "safe_linking": "safe-linking", "mp": "mp_ layout",
                 "mp_size": "mp_ layout", **{n: "tcache layout" for n in ("tcache_bins", "tcache_count_size",
                                                                          "tcache_off_entries", "tcache_struct_size",
                                                                          "tcache_counts_down")}}


def _confirm_layout(layout: Layout, family: tuple[int, int], heap_info_size: int | None,
                    tcache_chunk: int | None, safe_linking: bool | None, mp_variant: tuple[int, int] | None,
                    search: _Search, version_known: bool) -> Layout:
    """LAYOUT corrected by what memory shows; each correction of a known version is a finding."""
    changes: dict = {}
    if safe_linking is not None and safe_linking != layout.safe_linking:
        changes["safe_linking"] = safe_linking
    if mp_variant is not None and layout_for(mp_variant).mp != layout.mp:
        changes.update(mp=layout_for(mp_variant).mp, mp_size=layout_for(mp_variant).mp_size)
    if layout_for(family).off_bins != layout.off_bins or layout_for(family).off_next != layout.off_next:
        fam = layout_for(family)
        changes.update({f.name: getattr(fam, f.name) for f in dataclasses.fields(Layout)
                        if f.name.startswith("off_") or f.name in ("arena_size", "nfastbins")})
    if heap_info_size in (32, 48) and heap_info_size != layout.heap_info_size:
        changes["heap_info_size"] = heap_info_size
    if tcache_chunk in heuristics.TCACHE_CHUNK_SIZES and tcache_chunk != layout.tcache_chunk_size:
        t = layout_for(heuristics.TCACHE_CHUNK_SIZES[tcache_chunk])
        for name in ("tcache_bins", "tcache_count_size", "tcache_off_entries", "tcache_struct_size",
                     "tcache_counts_down"):
            changes[name] = getattr(t, name)
    if not changes:
        return layout
    if version_known:
        parts = ", ".join(sorted({_LAYOUT_PARTS.get(name, "arena layout") for name in changes}))
        search.note(Severity.WARNING, 0, f"memory contradicts the glibc {_version_text(layout.version)} layout "
                    f"({parts}); decoding with what memory shows (a distribution backport?)")
    return dataclasses.replace(layout, **changes)


def _version_from_memory(family: tuple[int, int], heap_info_size: int | None, tcache_chunk: int | None,
                         mp_variant: tuple[int, int] | None, safe_linking: bool | None
                         ) -> tuple[tuple[int, int], str]:
    """A representative version for what memory shows, and the range it stands for."""
    if family >= (2, 43):
        return (2, 43), "2.43+"
    if family < (2, 27):
        return family, "2.17-2.22" if family < (2, 23) else "2.23-2.26"
    if tcache_chunk == 0x300:
        return (2, 42), "2.42"
    if heap_info_size == 48 or (mp_variant is not None and mp_variant >= (2, 35)):
        return (2, 41), "2.35-2.41"
    if tcache_chunk == 0x250:
        return (2, 29), "2.27-2.29"
    if safe_linking is False:
        return (2, 31), "2.30-2.31"
    if safe_linking:
        return (2, 34), "2.32-2.34"
    return (2, 34), "2.30-2.34"


def discover(mem: Memory, symbols: SymbolSource, overrides: Overrides | None = None,
             mappings: list[Mapping] | None = None, fs_bases: list[int] | None = None,
             core: bool = False, regions: list[tuple[int, int]] | None = None) -> Discovery:
    """Locates version, layout, main_arena, mp_ and the TLS offsets of tcache and thread_arena.

    MAPPINGS (the target's address space) lets discovery find libc's image;
    FS_BASES (each thread's thread pointer) lets it recover TLS offsets.
    CORE: the target is a core file, whose missing pages the debugger reads from the library files.
    REGIONS (where chunks may lie; MAPPINGS' ranges when None) lets it find thread arenas by their heaps
    when libc's memory does not show main_arena.
    """
    search = _Search(mem, symbols, overrides or Overrides(), mappings or [], [f for f in fs_bases or [] if f],
                     core, regions)
    search.locate_libc()
    version, version_how = search.version()
    known = version is not None
    if known:
        try:
            layout = layout_for(version)
        except UnsupportedVersion as exc:
            raise DiscoveryError(str(exc)) from None

    by_heaps = None
    try:
        main_arena, family = _find_main_arena(search, version)
    except DiscoveryError as exc:
        by_heaps = _main_arena_by_heaps(search, version)
        if by_heaps is None and version is None:
            raise DiscoveryError(f"cannot tell which glibc this is ({version_how}), and {exc}") from None
        if by_heaps is None:
            raise
        main_arena, family = by_heaps.main_arena, by_heaps.family
    if version is None and family is None and main_arena is not None and not readable(mem, main_arena):
        by_heaps = _heaps_evidence(search)  # main_arena is known (a symbol) but gone: the heaps tell the layout
        if by_heaps is not None:
            family = by_heaps.family
            _main_arena_gone(search, main_arena)
    if version is None and family is None:
        raise DiscoveryError(f"cannot tell which glibc this is ({version_how}) and memory shows no arena; "
                             "use 'set heapwalk glibc-version X.Y' and 'set heapwalk main-arena ADDRESS'")
    if version is None:
        layout = layout_for(family)
    family = family or next(f for f in heuristics.ARENA_FAMILIES if layout.version >= f)
    ring_layout = layout if layout_for(family).off_next == layout.off_next else layout_for(family)
    ring = _ring(mem, ring_layout, main_arena) if main_arena is not None else []
    heap_info_size = next((heuristics.heap_info_size_of(a) for a in ring[1:]
                           if heuristics.heap_info_size_of(a) in (32, 48)), None)

    mp_address, mp_variant = (None, None) if main_arena is None else \
        _find_mp(search, main_arena, family, layout if version else None, ring_layout)
    tcache_tpoff, tcache_chunk = _find_tcache_tpoff(search, layout if version else None)
    safe_linking = _safe_linking(search, tcache_tpoff, tcache_chunk)
    if by_heaps is not None:
        heap_info_size = heap_info_size or by_heaps.heap_info_size
        tcache_chunk = tcache_chunk or by_heaps.tcache_chunk
        safe_linking = by_heaps.safe_linking if safe_linking is None else safe_linking
    if version is None:
        version, label = _version_from_memory(family, heap_info_size, tcache_chunk, mp_variant, safe_linking)
        if by_heaps is not None and not by_heaps.arenas:
            label = headless.heap_only_label(by_heaps)
        layout = layout_for(version)
        search.fact("glibc_version", None, f"not determined: {version_how}")
        search.fact("layout", f"glibc {label}", "memory: arena layout, heap_info size, tcache chunk size, mp_")
        search.note(Severity.INFO, 0, f"the glibc version is unknown ({version_how}); decoding with the "
                    f"glibc {label} layout that memory shows")
    else:
        label = _version_text(version)
        search.fact("glibc_version", label, version_how)
        search.fact("layout", layout.name, f"glibc {label} layout table, checked against memory")
    layout = _confirm_layout(layout, family, heap_info_size, tcache_chunk, safe_linking, mp_variant, search, known)

    thread_arena_tpoff = _find_thread_arena_tpoff(search, ring, layout)
    free_list = search.symbols.data_address("free_list")
    heap_max = _heap_max_size(search, layout, mp_address, ring)
    abort_msg = search.symbols.data_address("__abort_msg")
    if abort_msg is None and search.image is not None:
        abort_msg = search.image.dynamic_symbol("__abort_msg")
    return Discovery(version=layout.version, layout=layout, main_arena=main_arena, mp_address=mp_address,
                     tcache_tpoff=tcache_tpoff, thread_arena_tpoff=thread_arena_tpoff,
                     free_list_address=free_list, heap_max_size=heap_max, facts=search.facts,
                     findings=search.findings, version_label=label, libc_range=search.libc_range(),
                     abort_msg_address=abort_msg)


def _ring(mem: Memory, layout: Layout, main_arena: int) -> list[int]:
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


def _find_main_arena(search: _Search, version: tuple[int, int] | None) -> tuple[int, tuple[int, int] | None]:
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
        code = search.code("malloc_trim", 64)
        target = x86.first_lea(*code) if code else None
        if target is not None and target != scanned.address:
            search.note(Severity.WARNING, scanned.address, f"malloc_trim refers to {target:#x}, not to the "
                        f"main_arena found in memory ({scanned.address:#x}); using memory")
        return scanned.address, scanned.family
    code = search.code("malloc_trim", 64)
    target = x86.first_lea(*code) if code else None
    if target is not None and version is not None:
        search.fact("main_arena", target, "first address computed by malloc_trim (disassembly)")
        return target, None
    raise DiscoveryError("cannot find main_arena: no libc debug symbols, no self-linked bin 127 in libc's "
                         "writable memory (is malloc initialised? is this glibc?), and libc's code is not "
                         "readable; use 'set heapwalk main-arena ADDRESS'")


def _main_arena_by_heaps(search: _Search, version: tuple[int, int] | None) -> headless.HeapArenas | None:
    """main_arena's address from the ring of the thread arenas found by their heaps, when libc's memory does
    not show it (a core cut short before libc's segments); None when no heap holds an arena, or the
    overrides name main_arena."""
    if search.overrides.main_arena is not None:
        return None
    found = _heaps_evidence(search)
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
        _main_arena_gone(search, found.main_arena)
    for arena in found.lost:
        search.note(Severity.ERROR, arena, "this thread arena, which the ring leads to, is not in the target's "
                    "memory (a truncated core?): it is not decoded")
    return found


def _main_arena_gone(search: _Search, address: int) -> None:
    search.note(Severity.ERROR, address, "main_arena is not in the target's memory (libc's writable data is "
                "missing: a truncated core?): the thread arenas found by their heaps are decoded, and the main "
                "heap is walked without the arena's lists, when it is found by its chunks")


def _heaps_evidence(search: _Search) -> headless.HeapArenas | None:
    """The thread arenas found by their heaps, or else the main heap found by its chunks (None: neither)."""
    return headless.arenas_from_heaps(search.mem, search.regions) or headless.heap_only(search.mem, search.regions)


def _mp_anchors(search: _Search, main_arena: int, ring_layout: Layout) -> heuristics.MpAnchors:
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
    loads = frozenset(r.target for r in x86.rip_loads(*code) if r.opcode == x86.MOV) if code else frozenset()
    return heuristics.MpAnchors(main_start=start, main_top=top, stats_loads=loads)


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


def _find_mp(search: _Search, main_arena: int, family: tuple[int, int], layout: Layout | None,
             ring_layout: Layout) -> tuple[int | None, tuple[int, int] | None]:
    """mp_'s address and the mp_ layout variant memory matched (None if memory did not tell).

    No field is expected to hold glibc's default: a candidate is pinned down by what agrees with it
    (`heuristics.mp_evidence`), and the facts say which of its fields nothing confirmed."""
    variants = list(heuristics.MP_FOR_FAMILY[family])
    if layout is not None:
        own = next(v for v in heuristics.MP_VARIANTS if layout.version >= v)
        variants = [own] + [v for v in variants if v != own]
    anchors = _mp_anchors(search, main_arena, ring_layout)
    symbol = search.symbols.data_address("mp_")
    if symbol is not None:
        search.fact("mp_", symbol, "symbol mp_")
        fits = heuristics.mp_variant_at(search.mem, symbol, variants, anchors)
        if fits is None:
            search.note(Severity.WARNING, symbol, "the mp_ symbol's memory fits no malloc_par layout: its "
                        "counters are out of range (damaged?)")
        return symbol, fits.variant if fits else None
    if search.image is None:
        search.unknown("mp_", "no libc image")
        return None, None
    found = heuristics.find_mp(search.mem, search.image, main_arena, variants, anchors)
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


def _classify_tcache(search: _Search, expected: set[int]):
    image = search.image

    def classify(value: int) -> str:
        if value == 0 or (image is not None and image.contains(value)):
            return "none"  # not created yet, or 2.43's read-only dummy
        if value % 16:
            return "invalid"
        size = heuristics.tcache_struct_chunk(heuristics.tcache_chunk_size(search.mem, value))
        return "valid" if size in expected else "invalid"
    return classify


def _find_tcache_tpoff(search: _Search, layout: Layout | None) -> tuple[int | None, int | None]:
    """tcache's TLS offset, and the tcache chunk size seen in memory (None if no thread has one)."""
    if layout is not None and not layout.has_tcache:
        return None, None
    expected = set(heuristics.TCACHE_CHUNK_SIZES)
    classify = _classify_tcache(search, expected)
    tpoff = search.symbols.tls_offset("tcache")
    how = "symbol tcache (TLS)"
    if tpoff is None and search.image is not None:
        code = search.code("malloc", 512)
        slot = x86.tls_got_slot(*code) if code else None
        if slot is not None:
            try:
                value = u64(search.mem, slot)
                candidate = value - (1 << 64) if value >> 63 else value
                if heuristics.pick_tls_offset(search.mem, search.fs_bases, [candidate], classify) or \
                        not search.fs_bases:
                    tpoff, how = candidate, f"GOT slot {slot:#x} read by malloc (disassembly)"
            except ReadError:
                pass
        if tpoff is None and search.fs_bases:
            picked = heuristics.pick_tls_offset(search.mem, search.fs_bases,
                                                search.tls_candidates(), classify)
            if picked is not None:
                tpoff, how = picked[0], f"candidate TLS offsets tried on every thread ({picked[1]} tcaches)"
    if tpoff is None:
        search.unknown("tcache_tls_offset", "no symbol, and no candidate offset gives tcache structs")
        return None, None
    search.fact("tcache_tls_offset", tpoff, how)
    sizes = set()
    for fs in search.fs_bases:
        try:
            value = u64(search.mem, fs + tpoff)
        except ReadError:
            continue
        if classify(value) == "valid":
            sizes.add(heuristics.tcache_struct_chunk(heuristics.tcache_chunk_size(search.mem, value)))
    if len(sizes) > 1:
        search.note(Severity.WARNING, 0, f"threads' tcache chunks have different sizes: {sorted(sizes)}")
    return tpoff, min(sizes) if sizes else None


def _safe_linking(search: _Search, tpoff: int | None, tcache_chunk: int | None) -> bool | None:
    """Whether memory shows mangled tcache links (None if no thread's tcache holds an entry)."""
    if tpoff is None or tcache_chunk not in heuristics.TCACHE_CHUNK_SIZES:
        return None
    shape = layout_for(heuristics.TCACHE_CHUNK_SIZES[tcache_chunk])
    pointers = []
    for fs in search.fs_bases:
        try:
            value = u64(search.mem, fs + tpoff)
        except ReadError:
            continue
        if value and value % 16 == 0 and not (search.image and search.image.contains(value)):
            pointers.append(value)
    return heuristics.tcache_safe_linking(search.mem, pointers, shape.tcache_off_entries, shape.tcache_bins)


def _find_thread_arena_tpoff(search: _Search, ring: list[int], layout: Layout) -> int | None:
    tpoff = search.symbols.tls_offset("thread_arena")
    if tpoff is not None:
        search.fact("thread_arena_tls_offset", tpoff, "symbol thread_arena (TLS)")
        return tpoff
    if search.image is None or not search.fs_bases:
        search.unknown("thread_arena_tls_offset", "no symbol, no libc image or no threads")
        return None
    arenas = set(ring)

    def classify(value: int) -> str:
        return "valid" if value in arenas else "none" if value == 0 else "invalid"
    picked = heuristics.pick_tls_offset(search.mem, search.fs_bases,
                                        search.tls_candidates(), classify)
    if picked is None:
        search.unknown("thread_arena_tls_offset", "no candidate offset gives ring arenas")
        return None
    search.fact("thread_arena_tls_offset", picked[0],
                f"candidate TLS offsets tried on every thread ({picked[1]} arenas)")
    return picked[0]


def _heap_max_size(search: _Search, layout: Layout, mp_address: int | None, ring: list[int]) -> int:
    """The size and alignment of thread-arena heaps: 64 MiB, or 4 x hp_pagesize on 2.35-2.41 with hugetlb."""
    if (2, 35) <= layout.version < (2, 42) and mp_address is not None:
        try:
            hp = u64(search.mem, mp_address + layout.mp["hp_pagesize"])
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
