"""Poisoned links: a tcache ``next`` or a fastbin ``fd`` rewritten to lead outside every heap (tcache and
fastbin poisoning point them at the stack, at libc's data, at a target to overwrite).  The walkers follow such a
link as long as it is aligned and readable; `cut_outside` then cuts the list at the entry whose link it is, names
that entry (the bytes that were written) with where the link leads, and drops what the walkers said of the memory
past it, which is no free chunk at all.  A tcache entry of a large bin (2.42+, bins past the 64 small ones) may be
an mmapped chunk: it is outside every heap by nature, and kept."""

from __future__ import annotations

import bisect
import dataclasses

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.locate.layout import IS_MMAPPED, Layout
from heapwalk.glibc.model import Arena, BinList, HeapState, Tcache, TcacheBin
from heapwalk.glibc.walk.chunks import extents
from heapwalk.inferior.memory import Memory, ReadError, u64

__all__ = ["cut_outside"]


class _Spans:
    """Every arena's heap extents, to ask whether a chunk lies inside one."""

    def __init__(self, state: HeapState, layout: Layout):
        spans = sorted((e.start, e.end) for a in state.arenas for e in extents(a, layout))
        self.starts = [s for s, _ in spans]
        self.ends = [e for _, e in spans]

    def inside(self, chunk: int) -> bool:
        k = bisect.bisect_right(self.starts, chunk) - 1
        return k >= 0 and chunk + 16 <= self.ends[k]


def cut_outside(state: HeapState, mem: Memory, layout: Layout) -> HeapState:
    """STATE with each fastbin and tcache list cut at its first link outside every heap, and a finding at the
    entry (or the list's head) that holds that link."""
    spans = _Spans(state, layout)
    if not spans.starts:
        return state
    added: list[Finding] = []
    dropped: set[int] = set()
    arenas = tuple(_arena(a, spans, added, dropped) for a in state.arenas)
    threads = tuple(dataclasses.replace(t, tcache=_tcache(t.tcache, f"thread {t.number}", mem, layout, spans, added,
                                                          dropped)) if t.tcache is not None else t
                    for t in state.threads)
    scanned = tuple(_tcache(tc, f"tcache {tc.address:#x}", mem, layout, spans, added, dropped)
                    for tc in state.scanned_tcaches)
    if not added:
        return state
    arenas = tuple(dataclasses.replace(a, findings=_without(a.findings, dropped)) for a in arenas)
    return dataclasses.replace(state, arenas=arenas, threads=threads, scanned_tcaches=scanned,
                               findings=tuple(added) + _without(state.findings, dropped))


def _without(findings, dropped: set[int]) -> tuple[Finding, ...]:
    return tuple(f for f in findings if f.address not in dropped)


def _arena(arena: Arena, spans: _Spans, added: list[Finding], dropped: set[int]) -> Arena:
    fastbins = []
    for lst in arena.fastbins:
        cut = next((i for i, c in enumerate(lst.chunks) if not spans.inside(c)), None)
        if cut is None:
            fastbins.append(lst)
            continue
        holder = lst.chunks[cut - 1] if cut else lst.head
        said = f"fastbin chunk {holder:#x}" if cut else f"the head of fastbin[{lst.index}]"
        added.append(_poisoned(holder, lst.chunks[cut], f"fastbin[{lst.index}] of arena {arena.number}", said,
                               "fd", "fastbin"))
        dropped.update(lst.chunks[cut:])
        fastbins.append(BinList(lst.kind, lst.index, lst.head, lst.chunks[:cut], lst.raw_sizes[:cut], False))
    return dataclasses.replace(arena, fastbins=tuple(fastbins)) if fastbins != list(arena.fastbins) else arena


def _tcache(tcache: Tcache, owner: str, mem: Memory, layout: Layout, spans: _Spans, added: list[Finding],
            dropped: set[int]) -> Tcache:
    bins = []
    for b in tcache.bins:
        cut = next((i for i, e in enumerate(b.entries) if not spans.inside(e - 16)
                    and not (b.index >= 64 and _mmapped(mem, e - 16))), None)
        if cut is None:
            bins.append(b)
            continue
        slot = tcache.address + layout.tcache_off_entries + 8 * b.index
        holder = b.entries[cut - 1] if cut else slot
        said = f"tcache entry {holder:#x}" if cut else f"the head of tcache bin {b.index}"
        added.append(_poisoned(holder, b.entries[cut], f"tcache bin {b.index} of {owner}", said, "next", "tcache"))
        dropped.update(b.entries[cut:])
        dropped.update(e - 16 for e in b.entries[cut:])
        bins.append(TcacheBin(b.index, b.chunk_size, b.count, b.entries[:cut], False, b.sizes[:cut], b.spans[:cut]))
    if bins == list(tcache.bins):
        return tcache
    return dataclasses.replace(tcache, bins=tuple(bins), findings=_without(tcache.findings, dropped))


def _poisoned(holder: int, target: int, where: str, said: str, field: str, lists: str) -> Finding:
    """The error at HOLDER (SAID, in WHERE), whose FIELD links to TARGET outside every heap."""
    return Finding(Severity.ERROR, holder, where, f"{said} links ({field}) to {target:#x}, outside every heap: its "
                   f"{field} was written after it was freed ({lists} poisoning); the list is cut there",
                   Kind.LINK_OUTSIDE, "a link into the arenas' heaps", f"{target:#x}")


def _mmapped(mem: Memory, chunk: int) -> bool:
    """Whether CHUNK's size field says it is an mmapped chunk (a tcache entry of a large bin may be one)."""
    try:
        return bool(u64(mem, chunk + 8) & IS_MMAPPED)
    except ReadError:
        return False
