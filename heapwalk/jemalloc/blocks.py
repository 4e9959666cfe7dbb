"""jemalloc's allocations as the leak scan takes them (`view.Blocks`): every region a slab hands out (its bitmap
says which, checked against the slab's count of free regions) and every large allocation, less the regions the
thread caches hold (free, from the program's side) and jemalloc's own allocations for its threads (their cache
stacks hold freed regions' addresses: never roots, never judged).

All of jemalloc's extents are its heaps (scanned only inside the allocations), and its base blocks (its arenas,
extent headers, radix tree) its private memory: neither is ever a root.  A slab whose bitmap cannot be read or
disagrees with its free count is scanned as unknown memory (a root, never judged)."""

from __future__ import annotations

import numpy as np

from heapwalk.inferior.memory import Memory, ReadError, merged
from heapwalk.jemalloc.extents import ACTIVE
from heapwalk.jemalloc.model import JeState
from heapwalk.jemalloc.region import SLAB_BITMAP
from heapwalk.view import Blocks

__all__ = ["jemalloc_blocks"]


def jemalloc_blocks(mem: Memory, state: JeState) -> Blocks | None:
    """The allocations the program holds in STATE's extents (None when the extents are not known)."""
    table = state.extents
    if table is None:
        return None
    classes = table.classes
    active = table.state == ACTIVE
    starts, ends, arenas, unknown = [], [], [], []
    slabs = np.flatnonzero(active & table.slab & (table.szind < classes.nbins))
    bitmaps = _bitmaps(mem, table.header[slabs].tolist())
    for row in slabs.tolist():
        cls = classes.bins[int(table.szind[row])]
        used = _used_regions(bitmaps.get(int(table.header[row])), cls.nregs, int(table.nfree[row]))
        base = int(table.address[row])
        if used is None:
            unknown.append((base, base + int(table.size[row])))
            continue
        first = np.uint64(base) + used.astype(np.uint64) * np.uint64(cls.size)
        starts.append(first)
        ends.append(first + np.uint64(cls.size))
        arenas.append(np.full(len(used), table.arena[row], dtype=np.int32))
    large = np.flatnonzero(active & ~table.slab)
    if len(large):
        first = table.address[large] + table.offset[large].astype(np.uint64)
        sizes = table.usizes(large).astype(np.uint64)
        starts.append(first)
        ends.append(np.minimum(first + sizes, table.address[large] + table.size[large].astype(np.uint64)))
        arenas.append(table.arena[large].astype(np.int32))
    start, end, arena = (np.concatenate(parts) if parts else np.zeros(0, dtype=t)
                         for parts, t in ((starts, np.uint64), (ends, np.uint64), (arenas, np.int32)))
    keep = ~np.isin(start, np.array(sorted(_not_the_programs(state)), dtype=np.uint64))
    order = np.argsort(start[keep], kind="stable")
    heaps = merged((int(a), int(a) + int(s)) for a, s in zip(table.address.tolist(), table.size.tolist()))
    private = merged((at, at + size) for a in state.arenas for at, size in a.base_blocks)
    return Blocks(start[keep][order], end[keep][order], arena[keep][order], 0, 0, heaps=tuple(heaps),
                  private=tuple(private), unknown=tuple(merged(unknown)))


def _not_the_programs(state: JeState) -> set[int]:
    """The regions in use that the program does not hold: those a thread cache holds, and jemalloc's own."""
    return set(state.cached) | {address for t in state.threads for address in t.internal}


#: the most bytes of extent headers read at once
_HEADERS_SPAN = 1 << 16
#: a slab's bitmap: up to 512 regions
_BITMAP = 64


def _bitmaps(mem: Memory, headers: list[int]) -> dict[int, bytes | None]:
    """Each slab header's bitmap bytes (None: unreadable), the headers that lie near each other read in one
    piece (they sit together in the base's blocks)."""
    out: dict[int, bytes | None] = {}
    ordered = sorted(set(headers))
    i = 0
    while i < len(ordered):
        first = ordered[i]
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] + SLAB_BITMAP + _BITMAP - first <= _HEADERS_SPAN:
            j += 1
        span = ordered[j] + SLAB_BITMAP + _BITMAP - first
        try:
            data = mem.read(first, span)
            for h in ordered[i:j + 1]:
                out[h] = data[h - first + SLAB_BITMAP:h - first + SLAB_BITMAP + _BITMAP]
        except ReadError:
            for h in ordered[i:j + 1]:
                try:
                    out[h] = mem.read(h + SLAB_BITMAP, _BITMAP)
                except ReadError:
                    out[h] = None
        i = j + 1
    return out


def _used_regions(raw: bytes | None, nregs: int, nfree: int) -> np.ndarray | None:
    """The indices of the regions a slab hands out, from its bitmap RAW (a set bit is a free region); None when
    the bitmap is unreadable or does not count NFREE free regions."""
    if raw is None:
        return None
    free = np.unpackbits(np.frombuffer(raw[:8 * ((nregs + 63) // 64)], dtype=np.uint8), bitorder="little")[:nregs]
    if int(free.sum()) != nfree:
        return None
    return np.flatnonzero(free == 0)
