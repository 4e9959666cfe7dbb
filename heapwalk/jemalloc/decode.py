"""Builds a `JeState` from a target's memory and a `JeDiscovery`: every arena of arenas[] with its page
counters, decay settings and counters, and small bins; every thread's tsd.  Reads that fail become findings
at the address that could not be read; whatever could be decoded is kept."""

from __future__ import annotations

import dataclasses
import re
import struct
from types import MappingProxyType

import numpy as np

from heapwalk.common.findings import Finding, Severity
from heapwalk.jemalloc.kinds import Kind
from heapwalk.jemalloc.discovery import CONTAINER_STATES, JeDiscovery
from heapwalk.jemalloc.layout import BIN_STATS, JeLayout
from heapwalk.jemalloc.model import JeArena, JeBin, JeState, JeThread
from heapwalk.jemalloc.counted import count_bins, count_extents, count_large
from heapwalk.jemalloc.arenastats import base_metadata, bookkeeping, decay_clock, free_extents, large_classes, memory_figures
from heapwalk.jemalloc.extents import ACTIVE, ExtentTable, walk_extents
from heapwalk.jemalloc.freelists import walk_free_lists
from heapwalk.jemalloc.rtree import ExtentMap
from heapwalk.jemalloc.tcache import arena_tcache_bytes, nhbins
from heapwalk.jemalloc.tsd import decode_thread
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.inferior.threads import ThreadRegs

__all__ = ["collect_jemalloc"]

_STATS = struct.Struct("<%dQ" % len(BIN_STATS))


def collect_jemalloc(mem: Memory, disc: JeDiscovery, threads: list[ThreadRegs], target: str = "") -> JeState:
    """Decodes every arena in arenas[] and every thread's tsd."""
    findings = [Finding(Severity.ERROR, address, "jemalloc", f"{what}: what depends on it is not known",
                        Kind.UNMAPPED) for address, what in disc.unread]
    findings += _not_found(disc)
    pointers = _arena_pointers(mem, disc, findings)
    cached = nhbins(disc.layout, disc.opt)
    table = None
    if disc.rtree is not None:
        table, extent_findings = walk_extents(mem, disc.layout, disc.rtree, disc.rtree_shape)
        table = dataclasses.replace(table, paged_large=bool(disc.opt.get("disable_large_size_classes",
                                                                         disc.layout.large_paged)),
                                    large_pad=0 if disc.opt.get("cache_oblivious") is False else disc.layout.page)
        findings.extend(extent_findings)
    counted = None if disc.statistics else table
    arenas = []
    for index, address in enumerate(pointers):
        if not address:
            continue
        try:
            arenas.append(_arena(mem, disc.layout, index, address, cached, counted, table))
        except ReadError as exc:
            findings.append(Finding(Severity.ERROR, exc.address, f"arena {index}", f"cannot read arena {index} "
                                    f"({address:#x}): {exc.reason}", Kind.ARENA))
    by_address = {address: index for index, address in enumerate(pointers) if address}
    extents = ExtentMap(mem, disc.layout, disc.rtree, disc.rtree_shape)
    if table is not None:
        extents.know(table.header, table.arena)
    seen: dict[int, int] = {}
    decoded = tuple(decode_thread(mem, disc, regs, by_address, cached, extents, seen, findings)
                    for regs in sorted(threads, key=lambda t: t.number))
    if counted is not None:
        arenas = _with_internal(arenas, decoded, counted)
    return JeState(target, disc.version_text, disc.layout.name, tuple(arenas), decoded, disc.facts, tuple(findings),
                   dict(disc.opt), table, background_thread=_background(mem, disc, findings),
                   conf_variable=disc.conf_variable, cached=MappingProxyType(seen), statistics=disc.statistics,
                   page=disc.layout.page)


def _with_internal(arenas: list[JeArena], threads: tuple[JeThread, ...], table: ExtentTable) -> list[JeArena]:
    """ARENAS with the bytes of jemalloc's own allocations that a build without statistics does not count: the
    threads' (`JeThread.internal`), each in the arena whose extent holds it."""
    internal: dict[int, int] = {}
    for address in (address for t in threads for address in t.internal):
        row = int(np.searchsorted(table.address, np.uint64(address), side="right")) - 1
        if row < 0 or address >= int(table.address[row]) + int(table.size[row]) or table.state[row] != ACTIVE:
            continue
        arena = int(table.arena[row])
        internal[arena] = internal.get(arena, 0) + table.usize(row)
    return [dataclasses.replace(a, internal=internal.get(a.index, 0)) for a in arenas]


def _background(mem: Memory, disc: JeDiscovery, findings: list[Finding]) -> bool | None:
    """Whether background threads run now (None when the flag was not found, or is unreadable: a finding)."""
    if disc.background_state is None:
        return None
    try:
        value = mem.read(disc.background_state, 1)[0]
    except ReadError as exc:
        findings.append(Finding(Severity.ERROR, disc.background_state, "jemalloc", f"the flag of background "
                                f"threads is unreadable ({exc.reason}): whether they run is not known",
                                Kind.UNMAPPED))
        return None
    return bool(value) if value in (0, 1) else None


_NOT_FOUND = re.compile(r"^not (determined|decoded): ")
#: what is left out when a fact of discovery is not found: fact -> what
_LEFT_OUT = {"rtree": "jemalloc's radix tree of extents is not known, so the extents' maps, their check and the "
                      "arena each cached region came from are left out",
             "tsd_tls_offset": "the threads' tsds are not known, so each thread's arena, thread cache and decay "
                               "ticker are left out"}


def _not_found(disc: JeDiscovery) -> list[Finding]:
    """A warning for each fact discovery could not find, saying what is left out and why."""
    out = []
    for fact in disc.facts:
        if fact.name == "tsd_tls_offset" and disc.tsd_module is not None:
            continue                       # a dlopened library's tsds are found through each thread's DTV
        if fact.name in _LEFT_OUT and fact.value is None and not any(what.startswith("the tsd's TLS offset")
                                                                     for _a, what in disc.unread):
            out.append(Finding(Severity.WARNING, disc.base, "jemalloc", f"{_LEFT_OUT[fact.name]}: "
                               f"{_NOT_FOUND.sub('', fact.found_by)}", Kind.DISCOVERY))
    return out


def _arena_pointers(mem: Memory, disc: JeDiscovery, findings: list[Finding]) -> list[int]:
    """arenas[0 .. narenas_total), 0 for the slots not in use."""
    try:
        raw = mem.read(disc.arenas, 8 * disc.narenas_total)
    except ReadError as exc:
        findings.append(Finding(Severity.ERROR, disc.arenas, "arenas[]", f"cannot read the arena array: {exc}",
                                Kind.UNMAPPED))
        return []
    return list(struct.unpack(f"<{disc.narenas_total}Q", raw))


def _i64(value: int) -> int:
    return value - (1 << 64) if value >> 63 else value


def _arena(mem: Memory, layout: JeLayout, index: int, address: int, cached: int | None,
           counted: ExtentTable | None = None, table: ExtentTable | None = None) -> JeArena:
    """arenas[INDEX] at ADDRESS: its counters, and the bytes in the CACHED bins of its thread caches (ReadError
    when its memory is not there); with COUNTED (the extents of a build without statistics) what statistics
    would hold is counted from them instead, and what a version's statistics leave out is counted from TABLE
    (the extents, when known)."""
    raw = mem.read(address, layout.arena_size)
    lists, lost = walk_free_lists(mem, layout, index, address, raw)
    if counted is not None:
        arena = _counted_arena(mem, layout, index, address, cached, raw, counted)
        return dataclasses.replace(arena, free_lists=lists, findings=arena.findings + tuple(lost))
    arena = _from_statistics(mem, layout, index, address, cached, raw)
    arena = dataclasses.replace(arena, free_lists=lists, findings=arena.findings + tuple(lost))
    if table is None:
        return arena
    return _with_slabs(mem, layout, index, address, raw, arena, table)


def _with_slabs(mem: Memory, layout: JeLayout, index: int, address: int, raw: bytes, arena: JeArena,
                table: ExtentTable) -> JeArena:
    """ARENA with what its version's statistics leave out counted from the extents TABLE (5.1.0: the free
    extents by size, the slabs not full); when its bins disagree with its slabs, a warning, and its small
    classes counted from its slabs."""
    if not layout.extent_stats:            # 5.1.0 keeps no counts of free extents by size
        arena = dataclasses.replace(arena, extents=count_extents(table, index))
    findings: list[Finding] = []
    slabs = count_bins(table, index, _slabcurs(mem, layout, index, address, raw, findings))
    if not layout.bin_nonfull:             # nor of the slabs not full
        arena = dataclasses.replace(arena, bins=tuple(dataclasses.replace(b, nonfull_slabs=n.nonfull_slabs)
                                                      for b, n in zip(arena.bins, slabs)))
    sharded = _sharded(arena, slabs, layout)
    if sharded:
        arena = dataclasses.replace(arena, bins=slabs)
    return dataclasses.replace(arena, findings=arena.findings + tuple(findings) + sharded)


def _sharded(arena: JeArena, slabs: tuple[JeBin, ...], layout: JeLayout) -> tuple[Finding, ...]:
    """A warning when ARENA's bins do not count what its slabs hold (SLABS, counted from the extents) while each
    bin's counters agree with themselves (in use = allocations - frees): with opt.bin_shards each size class has
    several bins, which heapwalk does not read yet (each is a real bin, read as another class's). The arena's
    small classes are then taken from its slabs (`_with_slabs`); bins whose own counters disagree are damage,
    left as they are for check to name."""
    differ = [(b, s) for b, s in zip(arena.bins, slabs) if (b.curregs, b.curslabs) != (s.curregs, s.curslabs)]
    if not differ or any(b.curregs != b.nmalloc - b.ndalloc for b in arena.bins):
        return ()           # none, or counters that contradict themselves: damage, which check names as such
    b, s = differ[0]
    return (Finding(Severity.WARNING, arena.address + layout.bins, f"arena {arena.index}", f"{len(differ)} of arena "
                    f"{arena.index}'s bins do not count what its slabs hold (the {b.size} B bin: {b.curregs} "
                    f"regions in {b.curslabs} slabs; its slabs: {s.curregs} in {s.curslabs}): its bins are sharded "
                    "(opt.bin_shards, which heapwalk does not read yet) or damaged, so its small classes are "
                    "counted from its slabs, without their counts of operations", Kind.BIN_SHARDS,
                    f"{s.curregs} regions in {s.curslabs} slabs", f"{b.curregs} regions in {b.curslabs} slabs"),)


def _from_statistics(mem: Memory, layout: JeLayout, index: int, address: int, cached: int | None, raw: bytes
                     ) -> JeArena:
    """arenas[INDEX] at ADDRESS, whose bytes are RAW, as its statistics and counters hold it."""
    def word(off: int) -> int:
        return struct.unpack_from("<Q", raw, off)[0]

    def pages(offsets: tuple[int, ...]) -> int:
        return sum(word(off) for off in offsets)

    nthreads = struct.unpack_from("<I", raw, layout.nthreads)[0]
    dirty = struct.unpack_from("<3Q", raw, layout.stats_dirty)
    muzzy = struct.unpack_from("<3Q", raw, layout.stats_muzzy)
    findings = _states(layout, index, address, raw)
    bins = _bins(mem, layout, index, address, raw, findings)
    memory = memory_figures(mem, layout, index, raw, findings)
    tcache_bytes, lost = arena_tcache_bytes(mem, layout, index, word(layout.tcache_descriptors), cached)
    edata, rtree = base_metadata(mem, layout, raw)
    return JeArena(index, address, nthreads, word(layout.nactive), pages(layout.dirty_npages),
                   pages(layout.muzzy_npages), pages(layout.retained_npages) * layout.page,
                   _i64(word(layout.dirty_decay_ms)), _i64(word(layout.muzzy_decay_ms)), *dirty, *muzzy,
                   bins, *memory, large_classes(layout, raw), free_extents(layout, raw), tcache_bytes,
                   tuple(findings + lost), decay_clock(layout, raw, layout.dirty_decay_ms),
                   decay_clock(layout, raw, layout.muzzy_decay_ms), _base_blocks(mem, layout, index, raw, findings),
                   metadata_edata=edata, metadata_rtree=rtree, page=layout.page,
                   **bookkeeping(layout, raw, statistics=True))





_MAX_BLOCKS = 1 << 16


def _counted_arena(mem: Memory, layout: JeLayout, index: int, address: int, cached: int | None, raw: bytes,
                   table: ExtentTable) -> JeArena:
    """arenas[INDEX] of a build without statistics: the page counters decay keeps (active, dirty, muzzy,
    retained), and its bins, large classes and free extents counted from TABLE; mapped is its extents and its
    base's blocks; what only statistics hold (purges, what its base allocated, resident) is None."""
    def word(off: int) -> int:
        return struct.unpack_from("<Q", raw, off)[0]

    findings = _states(layout, index, address, raw)
    blocks = _base_blocks(mem, layout, index, raw, findings)
    pactive, pdirty = word(layout.nactive), sum(word(off) for off in layout.dirty_npages)
    pmuzzy = sum(word(off) for off in layout.muzzy_npages)
    tcache_bytes, lost = arena_tcache_bytes(mem, layout, index, word(layout.tcache_descriptors), cached)
    unknown = (None,) * 6
    return JeArena(index, address, struct.unpack_from("<I", raw, layout.nthreads)[0], pactive, pdirty, pmuzzy,
                   sum(word(off) for off in layout.retained_npages) * layout.page, _i64(word(layout.dirty_decay_ms)),
                   _i64(word(layout.muzzy_decay_ms)), *unknown,
                   count_bins(table, index, _slabcurs(mem, layout, index, address, raw, findings)),
                   (pactive + pdirty + pmuzzy) * layout.page + sum(size for _at, size in blocks), None, 0, None, None,
                   count_large(table, index), count_extents(table, index), tcache_bytes, tuple(findings + lost),
                   decay_clock(layout, raw, layout.dirty_decay_ms), decay_clock(layout, raw, layout.muzzy_decay_ms), blocks,
                   page=layout.page, **bookkeeping(layout, raw, statistics=False))


def _slabcurs(mem: Memory, layout: JeLayout, index: int, address: int, raw: bytes, findings: list[Finding]
              ) -> frozenset[int]:
    """The header of the slab each of the arena's bins allocates from now (0 when it has none)."""
    out = set()
    for i, cls in enumerate(layout.classes.bins):
        at = _bin_address(layout, address, raw, i)
        try:
            out.add(struct.unpack("<Q", mem.read(at + layout.bin_slabcur, 8))[0])
        except ReadError as exc:
            findings.append(Finding(Severity.ERROR, exc.address, f"arena {index}", f"bin {i} ({cls.size} B) at "
                                    f"{at:#x} is unreadable ({exc.reason}): its current slab counts among those not "
                                    "full", Kind.ARENA))
    return frozenset(out - {0})


def _bin_address(layout: JeLayout, address: int, raw: bytes, i: int) -> int:
    """Where bin I of the arena at ADDRESS (whose bytes are RAW) is."""
    if layout.bins_inline:
        return address + layout.bins + i * layout.bin_size
    return struct.unpack_from("<Q", raw, layout.bins + 8 * i)[0]


def _base_blocks(mem: Memory, layout: JeLayout, index: int, raw: bytes, findings: list[Finding]
                 ) -> tuple[tuple[int, int], ...]:
    """(address, size) of each block the arena's base mapped for its metadata; those read before a block that
    is unreadable or a list that loops (a finding says where)."""
    base = struct.unpack_from("<Q", raw, layout.base)[0]
    out: list[tuple[int, int]] = []
    try:
        at = struct.unpack("<Q", mem.read(base + layout.base_blocks, 8))[0]
        seen = set()
        while at and len(out) < _MAX_BLOCKS:
            if at in seen:
                findings.append(Finding(Severity.ERROR, at, f"arena {index}", f"the list of the base's blocks "
                                        f"loops back to {at:#x}", Kind.LIST_CYCLE))
                break
            seen.add(at)
            size, following = struct.unpack("<QQ", mem.read(at, 16))
            out.append((at, size))
            at = following
    except ReadError as exc:
        findings.append(Finding(Severity.ERROR, exc.address, f"arena {index}", f"a block of the arena's base is "
                                f"unreadable ({exc.reason}): the blocks after it are left out of its resident "
                                "memory", Kind.ARENA))
    return tuple(out)


def _states(layout: JeLayout, index: int, address: int, raw: bytes) -> list[Finding]:
    """A finding when the arena's dirty, muzzy and retained containers do not say which they are: the
    arena's structure is overwritten there, and its counters may be too."""
    states = [struct.unpack_from("<I", raw, off)[0] for off in (layout.dirty_state, layout.muzzy_state,
                                                                 layout.retained_state)]
    if states == CONTAINER_STATES:
        return []
    return [Finding(Severity.ERROR, address + layout.dirty_state, f"arena {index}", f"the states of arena {index}'s "
                    f"dirty, muzzy and retained extent containers read {states}, not {CONTAINER_STATES}: the "
                    "arena's structure is overwritten, and its figures may be wrong", Kind.ARENA,
                    str(CONTAINER_STATES), str(states))]








def _bins(mem: Memory, layout: JeLayout, index: int, address: int, raw: bytes, findings: list[Finding]
          ) -> tuple[JeBin, ...]:
    """The arena's small bins with their statistics (one shard each: jemalloc's default); a bin whose memory
    is unreadable counts nothing, and a finding at it says so."""
    out = []
    for i, cls in enumerate(layout.classes.bins):
        at = _bin_address(layout, address, raw, i)
        try:
            values = _STATS.unpack(mem.read(at + layout.bin_stats, _STATS.size))
            if not layout.bin_nonfull:     # 5.1.0: the word after curslabs is not nonfull_slabs (counted after)
                values = values[:-1] + (0,)
        except ReadError as exc:
            values = (0,) * len(BIN_STATS)
            findings.append(Finding(Severity.ERROR, at, f"arena {index}", f"bin {i} ({cls.size} B) at "
                                    f"{at:#x} is unreadable ({exc.reason}): its statistics are left out",
                                    Kind.ARENA))
        stats = dict(zip(BIN_STATS, values))
        out.append(JeBin(i, cls.size, cls.nregs, stats["nmalloc"], stats["ndalloc"], stats["nrequests"],
                         stats["curregs"], stats["nfills"], stats["nflushes"], stats["nslabs"], stats["reslabs"],
                         stats["curslabs"], stats["nonfull_slabs"], cls.pages))
    return tuple(out)
