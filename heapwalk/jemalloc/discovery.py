"""Finding jemalloc's state in a target without debug symbols: the library, its version, the arena array and
its length, and the TLS offset of each thread's tsd.

- the library: the mapping of a file named libjemalloc* at file offset 0;
- the version: the string jemalloc keeps in its read-only data ("5.3.0-0-g<commit>");
- ``arenas`` and ``narenas_total``: the function that follows the exported ``malloc_stats_print`` (its
  atexit hook) loops over the arenas: the first ``mov ecx, [rip+disp]`` from there reads ``narenas_total``,
  the first RIP-relative ``lea`` after it computes ``arenas``;
- the tsd: the one initial-exec TLS relocation of the library (R_X86_64_TPOFF64 against no symbol) is the
  GOT slot that holds the TLS block's offset from each thread's thread pointer; the block is the tsd.

Each fact is checked against memory (arena 0 exists and its extent containers carry their states; the TLS
block's size is the version's tsd size), and recorded with how it was found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from heapwalk.errors import CannotDecode
from heapwalk.findings import Fact
from heapwalk.jemalloc.layout import JeLayout, UnsupportedJemalloc, layout_for
from heapwalk.jemalloc.opt import OptionsNotFound, read_opts
from heapwalk.inferior import x86
from heapwalk.inferior.elf import R_X86_64_TPOFF64, LibcImage, Mapping, readable_runs
from heapwalk.inferior.memory import Memory, ReadError, u64

__all__ = ["JeDiscovery", "JemallocNotFound", "discover_jemalloc", "find_library"]

_VERSION = re.compile(rb"(\d+)\.(\d+)\.(\d+)-\d+-g[0-9a-f]{40}")
_HOOK_SPAN = 0x600      # bytes after malloc_stats_print searched for its atexit hook's loads


class JemallocNotFound(CannotDecode):
    """jemalloc's state could not be located; the message says what is missing."""


@dataclass(frozen=True)
class JeDiscovery:
    """What heapwalk needs to decode jemalloc, with how each part was found."""

    version: tuple[int, int, int]
    version_text: str               # the library's own string, "5.3.0-0-g54eaed1d..."
    layout: JeLayout
    library: str
    base: int
    arenas: int                     # address of arenas[]
    narenas_total: int              # how many slots of arenas[] are in use
    tsd_tpoff: int | None           # the tsd's offset from a thread's thread pointer (None: unknown)
    facts: tuple[Fact, ...] = field(default=())
    opt: dict = field(default_factory=dict)     # the run-time options by mallctl name (empty: not found)
    rtree: int | None = None        # the radix tree of extents (None: not found)
    unread: tuple[tuple[int, str], ...] = ()    # (address, what) of what was found but cannot be read


def find_library(mappings: list[Mapping]) -> tuple[int, str] | None:
    """(base, path) of libjemalloc among MAPPINGS: its lowest mapping at file offset 0."""
    found = [(m.start, m.path) for m in mappings if m.offset == 0 and
             m.path.rsplit("/", 1)[-1].startswith("libjemalloc")]
    return min(found) if found else None


def discover_jemalloc(mem: Memory, mappings: list[Mapping]) -> JeDiscovery:
    """Locates jemalloc's version, arenas[], narenas_total and the tsd's TLS offset (JemallocNotFound when the
    target does not map jemalloc, or its image does not show them)."""
    found = find_library(mappings)
    if found is None:
        raise JemallocNotFound("no libjemalloc among the mappings")
    base, path = found
    try:
        image = LibcImage.read(mem, base, path)
    except ReadError as exc:
        raise JemallocNotFound(f"{path} is mapped at {base:#x}, but its ELF header is unreadable ({exc.reason})") \
            from None
    facts = [Fact("jemalloc", {"base": base, "path": path}, "mappings")]
    version, text, where = _version(image)
    try:
        layout = layout_for(version)
    except UnsupportedJemalloc as exc:
        raise JemallocNotFound(str(exc)) from None
    facts.append(Fact("jemalloc_version", text, f"version string in the library's read-only data at {where:#x}"))
    arenas, narenas, how = _arena_array(image)
    facts += [Fact("arenas", arenas, how), Fact("narenas_total", narenas, how)]
    try:
        count = _u32(mem, narenas)
    except ReadError as exc:
        raise JemallocNotFound(f"narenas_total at {narenas:#x} is unreadable ({exc.reason})") from None
    if not 0 < count <= 4095:
        raise JemallocNotFound(f"narenas_total at {narenas:#x} reads {count}: not jemalloc {layout.name}'s")
    _check_layout(mem, layout, arenas, count)
    tpoff, how, unread = _tsd_tpoff(image, layout)
    facts.append(Fact("tsd_tls_offset", tpoff, how))
    opt, how, lost = _options(image)
    facts.append(Fact("opt", len(opt) or None, how))
    rtree, how = _rtree(image)
    facts.append(Fact("rtree", rtree, how))
    return JeDiscovery(version, text, layout, path, base, arenas, count, tpoff, tuple(facts), opt, rtree,
                       tuple(unread + lost))


def _rtree(image: LibcImage) -> tuple[int | None, str]:
    """The radix tree of extents: the first ``lea rsi, [rip+disp]`` of malloc_usable_size, the tree it passes
    to the lookup of a pointer's extent."""
    start = image.dynamic_symbol("malloc_usable_size")
    if start is None:
        return None, "not determined: the library exports no malloc_usable_size"
    try:
        code = image.mem.read(start, 0x400)
    except ReadError as exc:
        return None, f"not determined: malloc_usable_size is unreadable ({exc.reason})"
    leas = [r for r in x86.rip_loads(code, start) if r.opcode == x86.LEA and code[r.offset] == 0x48
            and code[r.offset + 2] == 0x35]
    if not leas:
        return None, "not determined: no lea rsi in malloc_usable_size"
    return leas[0].target, f"the lookup's tree in malloc_usable_size (code at {start + leas[0].offset:#x})"


def _options(image: LibcImage) -> tuple[dict, str, list[tuple[int, str]]]:
    """The options, how they were found, and what of them is unreadable; none, and why, when mallctl's table
    cannot be found or read."""
    try:
        return read_opts(image)
    except OptionsNotFound as exc:
        return {}, f"not determined: {exc}", []
    except ReadError as exc:
        return {}, f"not determined: {exc}", [(exc.address, f"mallctl's table of options is unreadable ({exc.reason})")]


def _version(image: LibcImage) -> tuple[tuple[int, int, int], str, int]:
    """The version, its string and where the string is."""
    for seg in image.readonly_data():
        for start, data in readable_runs(image.mem, seg.address, seg.filesz):
            m = _VERSION.search(bytes(data))
            if m:
                return (int(m[1]), int(m[2]), int(m[3])), m[0].decode(), start + m.start()
    raise JemallocNotFound(f"no version string in {image.path}'s read-only data (is the library file at hand?)")


def _arena_array(image: LibcImage) -> tuple[int, int, str]:
    """(arenas, narenas_total, how) from the code after malloc_stats_print."""
    start = image.dynamic_symbol("malloc_stats_print")
    if start is None:
        raise JemallocNotFound(f"{image.path} exports no malloc_stats_print")
    try:
        code = image.mem.read(start, _HOOK_SPAN)
    except ReadError as exc:
        raise JemallocNotFound(f"the code of malloc_stats_print is unreadable ({exc.reason})") from None
    counts = [r for r in x86.rip_loads32(code, start) if code[r.offset + 1] == 0x0D]  # mov ecx, [rip+disp]
    if not counts:
        raise JemallocNotFound("no 32-bit load of narenas_total after malloc_stats_print")
    narenas = counts[0]
    leas = [r for r in x86.rip_loads(code, start) if r.opcode == x86.LEA and r.offset > narenas.offset]
    if not leas:
        raise JemallocNotFound("no lea of arenas[] after the load of narenas_total")
    return leas[0].target, narenas.target, \
        f"the arena loop after malloc_stats_print (code at {start + narenas.offset:#x})"


def _u32(mem: Memory, address: int) -> int:
    return int.from_bytes(mem.read(address, 4), "little")


def _check_layout(mem: Memory, layout: JeLayout, arenas: int, count: int) -> None:
    """One of the first arenas in arenas[] shows LAYOUT: its dirty, muzzy and retained containers' states read
    1, 2, 3 (arena 0 normally; a later one when arena 0 is damaged, which the decoder then reports)."""
    said = []
    for index in range(min(count, 8)):
        try:
            arena = u64(mem, arenas + 8 * index)
            if not arena:
                continue
            states = container_states(mem, layout, arena)
        except ReadError as exc:
            said.append(f"arena {index} is unreadable ({exc.reason})")
            continue
        if states == CONTAINER_STATES:
            return
        said.append(f"arena {index} ({arena:#x}) has extent containers whose states read {states}, not "
                    f"{list(CONTAINER_STATES)}")
    raise JemallocNotFound(f"no arena shows the {layout.name} layout: " + "; ".join(said or ["arenas[] is empty"]))


def container_states(mem: Memory, layout: JeLayout, arena: int) -> list[int]:
    """The states of the arena at ARENA's dirty, muzzy and retained extent containers (ReadError when gone)."""
    return [_u32(mem, arena + off) for off in (layout.dirty_state, layout.muzzy_state, layout.retained_state)]


#: what the dirty, muzzy and retained containers' states read in every sound arena
CONTAINER_STATES = [1, 2, 3]


def _tsd_tpoff(image: LibcImage, layout: JeLayout) -> tuple[int | None, str, list[tuple[int, str]]]:
    """The tsd's offset from the thread pointer, read from the GOT slot of the library's TLS relocation; how it
    was found; and (address, what) when the slot is there but unreadable."""
    if image.tls_size() not in (None, layout.tsd_size):
        return None, f"the TLS block is {image.tls_size():#x} bytes, not {layout.name}'s tsd ({layout.tsd_size:#x})", []
    slots = [slot for slot, sym, addend in image.relocations(R_X86_64_TPOFF64) if sym == 0 and addend == 0]
    if len(slots) != 1:
        return None, f"not determined: {len(slots)} TLS relocations against no symbol, not one", []
    try:
        value = u64(image.mem, slots[0])
    except ReadError as exc:
        how = f"not determined: the GOT slot {slots[0]:#x} is unreadable ({exc.reason})"
        return None, how, [(slots[0], f"the tsd's TLS offset: {how}")]
    return value - (1 << 64) if value >> 63 else value, f"GOT slot {slots[0]:#x} of the TPOFF64 relocation", []
