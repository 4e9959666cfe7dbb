"""Each thread of a jemalloc process through its tsd (jemalloc's TLS block): its state, arena, byte counters,
decay ticker, what its thread cache holds (each cached region checked against the extents: in a slab of its
size class, cached once) and the arena each cached region came from, and jemalloc's own allocations for it."""

from __future__ import annotations

import struct

from heapwalk.common.findings import Finding, Severity
from heapwalk.jemalloc.discovery import JeDiscovery
from heapwalk.jemalloc.kinds import Kind
from heapwalk.jemalloc.layout import JeLayout
from heapwalk.jemalloc.model import JeThread
from heapwalk.jemalloc.rtree import ExtentMap
from heapwalk.jemalloc.tcache import MAX_NCACHED, cache_bins, cached_regions, plausible
from heapwalk.jemalloc.tsdoffset import dynamic_tsd
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.inferior.threads import ThreadRegs

__all__ = ["decode_thread"]

_STATE_UNINITIALIZED = 6


def decode_thread(mem: Memory, disc: JeDiscovery, regs: ThreadRegs, arenas: dict[int, int], cached: int | None,
            extents: ExtentMap, seen: dict[int, int], findings: list[Finding]) -> JeThread:
    """REGS' thread through its tsd: state, arena, byte counters, whether its decay ticker exists, and what
    the CACHED bins of its thread cache hold."""
    layout = disc.layout
    if not regs.thread_pointer:
        return JeThread(regs.number, regs.lwp, None, None, None, 0, 0, None, name=regs.name)
    if disc.tsd_tpoff is not None:
        tsd = regs.thread_pointer + disc.tsd_tpoff
    elif disc.tsd_module is not None:      # a dlopened library: the thread's block of its TLS module, if any
        tsd = dynamic_tsd(mem, regs.thread_pointer, disc.tsd_module, disc.arch)
        if tsd is None:
            return JeThread(regs.number, regs.lwp, None, _STATE_UNINITIALIZED, None, 0, 0, False, name=regs.name)
    else:
        return JeThread(regs.number, regs.lwp, None, None, None, 0, 0, None, name=regs.name)
    try:
        raw = mem.read(tsd, layout.tsd_size)
    except ReadError:
        return JeThread(regs.number, regs.lwp, tsd, None, None, 0, 0, None, name=regs.name)
    state = raw[layout.tsd_state]
    if layout.tsd_states is not None and state < len(layout.tsd_states):
        state = layout.tsd_states[state]          # in 5.2's numbering, whatever the version
    if state > _STATE_UNINITIALIZED:
        findings.append(Finding(Severity.ERROR, tsd + layout.tsd_state, f"thread {regs.number}",
                                f"the tsd of thread {regs.number} (LWP {regs.lwp}) at {tsd:#x} holds state {state}, "
                                "which jemalloc never sets: the tsd is damaged, or not where heapwalk looked; its "
                                "arena, counters and thread cache are left out", Kind.TSD))
        return JeThread(regs.number, regs.lwp, tsd, None, None, 0, 0, None, name=regs.name)
    arena = arenas.get(struct.unpack_from("<Q", raw, layout.tsd_arena)[0])
    allocated, = struct.unpack_from("<Q", raw, layout.tsd_allocated)
    deallocated, = struct.unpack_from("<Q", raw, layout.tsd_deallocated)
    tdata = 0
    if layout.tsd_tdata is not None:   # 5.2.1: a ticker per arena, in an array made on the first tick
        tdata, = struct.unpack_from("<Q", raw, layout.tsd_tdata)
        ntdata, = struct.unpack_from("<I", raw, layout.tsd_ntdata)
        ticker = arena is not None and tdata != 0 and arena < ntdata
    else:                              # 5.3.0: one ticker in the tsd, set up with it
        ticker = state != _STATE_UNINITIALIZED
    tcache_arena = arenas.get(struct.unpack_from("<Q", raw, layout.tsd_tcache_arena)[0])
    bins = cached if tcache_arena is not None else 0
    arrays = tuple(tsd + off for off in layout.tsd_tcache_bins)
    counts = _plausible_counts(cache_bins(mem, layout, arrays, layout.cache_bins if bins is None else bins),
                               regs.number, arrays[0], findings, layout)
    internal = []
    if tcache_arena is not None:
        at, into = layout.tsd_tcache_stacks
        pointer = struct.unpack_from("<Q", raw, at)[0]
        if pointer > into:
            internal.append(pointer - into)
    if layout.tsd_tdata is not None and tdata:
        internal.append(tdata)
    return JeThread(regs.number, regs.lwp, tsd, state, arena, allocated, deallocated, ticker, tcache_arena,
                    tuple((layout.classes.class_size(i), c) for i, c in enumerate(counts) if c),
                    _origins(mem, layout, arrays, len(counts), tcache_arena, extents,
                             _Seen(regs.number, seen, findings, layout)), name=regs.name,
                    internal=tuple(internal), tsd_size=layout.tsd_size)


def _plausible_counts(counts: list[int], thread: int, array: int, findings: list[Finding], layout: JeLayout
                      ) -> list[int]:
    """COUNTS with those no cache bin can hold as 0, and a finding at the thread's cache bins for each."""
    for index, count in enumerate(counts):
        if not plausible(count):
            findings.append(Finding(Severity.ERROR, array, f"tcache of thread {thread}", f"cache bin {index} "
                                    f"({layout.classes.class_size(index)} B) counts {count} regions: a cache bin "
                                    f"holds 0 to {MAX_NCACHED}", Kind.TCACHE_COUNT, f"0-{MAX_NCACHED}", str(count)))
    return [count if plausible(count) else 0 for count in counts]


class _Seen:
    """The regions the thread caches hold, checked as they are read: each must lie in a slab (or a large
    extent) of its bin's size class, and be cached once."""

    def __init__(self, thread: int, seen: dict[int, int], findings: list[Finding], layout: JeLayout):
        self.thread, self.seen, self.findings, self.classes = thread, seen, findings, layout.classes

    def region(self, index: int, address: int, entry) -> None:
        if address in self.seen:
            self.findings.append(Finding(Severity.ERROR, address, self._where(index), f"region {address:#x} is cached "
                                         f"twice (also by thread {self.seen[address]}): a double free",
                                         Kind.DOUBLE_FREE))
        self.seen.setdefault(address, self.thread)
        if entry is None:
            self.findings.append(Finding(Severity.ERROR, address, self._where(index), f"region {address:#x} lies in "
                                         "no extent jemalloc knows", Kind.TCACHE))
        elif entry[1] != index or entry[2] != (index < self.classes.nbins):
            self.findings.append(Finding(Severity.ERROR, address, self._where(index), f"region {address:#x} lies in "
                                         f"an extent of size class {entry[1]}, not {index}", Kind.TCACHE_SIZE,
                                         f"class {index}", f"class {entry[1]}"))

    def _where(self, index: int) -> str:
        return f"tcache of thread {self.thread}, bin {self.classes.class_size(index)} B"


def _origins(mem: Memory, layout: JeLayout, arrays: tuple[int, ...], n: int, own: int | None,
             extents: ExtentMap, seen: _Seen) -> tuple[tuple[int, int], ...]:
    """(arena, bytes) of the regions a thread cache holds, by the arena each came from (its own arena OWN
    for those whose extent cannot be looked up), each region checked by SEEN when the tree is known."""
    if own is None or not n:
        return ()
    try:
        regions = cached_regions(mem, layout, arrays, n)
    except ReadError as exc:
        seen.findings.append(Finding(Severity.ERROR, exc.address, f"tcache of thread {seen.thread}",
                                     f"a cache bin's stack is unreadable ({exc.reason}): its regions are counted "
                                     "in the cache's own arena", Kind.TCACHE))
        regions = []
    by_arena: dict[int, int] = {}
    for index, addresses in regions:
        size = layout.classes.class_size(index)
        for address, entry in zip(addresses, extents.lookup_many(addresses)):
            if extents.rtree is not None:
                seen.region(index, address, entry)
            else:
                seen.seen.setdefault(address, seen.thread)
            origin = extents.arena_of_entry(entry)
            key = own if origin is None else origin
            by_arena[key] = by_arena.get(key, 0) + size
    return tuple(sorted(by_arena.items()))
