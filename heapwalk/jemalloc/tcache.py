"""jemalloc's thread caches: what each thread's tcache holds, and the bytes cached per arena as
malloc_stats_print counts them (tcache_bytes).

Each tcache has one cache bin per cached size class (nhbins of them, set by opt.lg_tcache_max in 5.2.1 and
opt.tcache_max in 5.3.0) and registers a descriptor of its bins on its arena's list; the arena's
tcache_bytes is the sum over that list of each bin's count times its class size.  A bin's count is a field
in 5.2.1; in 5.3.0 it is the distance between the low 16 bits of the bin's stack head and of its empty
position, in pointers.  jemalloc 5.2.1's statistics read its large bins at the class index rather than from
the first large bin, so they count the small bins only unless nhbins exceeds 72: `arena_tcache_bytes`
reproduces that, and a thread's own figures count every bin.
"""

from __future__ import annotations

import struct

from heapwalk.common.findings import Finding, Severity
from heapwalk.jemalloc.kinds import Kind
from heapwalk.jemalloc.layout import JeLayout
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["cache_bins", "nhbins", "bin_counts", "arena_tcache_bytes", "cached_regions", "plausible",
           "MAX_NCACHED"]

_CACHE_BIN = 24
_MAX_TCACHES = 1 << 16       # descriptors followed on one arena's list before it is called a cycle
#: the most regions one cache bin holds (5.3.0: 16 bits of pointers; 5.2.1's are far fewer)
MAX_NCACHED = 8191


def nhbins(layout: JeLayout, opt: dict) -> int | None:
    """How many size classes the thread caches hold, from the options (None when they are unknown)."""
    if layout.stack_cache_bins:
        tcache_max = opt.get("tcache_max")
        return None if not isinstance(tcache_max, int) else layout.classes.size_index(max(tcache_max, 1)) + 1
    lg = opt.get("lg_tcache_max")
    if not isinstance(lg, int) or isinstance(lg, bool):
        return None
    small = layout.classes.small_maxclass
    maxclass = small if lg < 0 or lg >= 64 or (1 << lg) < small else 1 << lg
    return layout.classes.size_index(maxclass) + 1


def bin_counts(layout: JeLayout, raw: bytes, count: int) -> list[int]:
    """The number of cached regions in each of the COUNT cache bins in RAW (an array of cache_bin_t), as
    stored: a count below 0 or above MAX_NCACHED is damage (`plausible` sorts them out)."""
    out = []
    for i in range(count):
        if layout.stack_cache_bins:
            head, = struct.unpack_from("<Q", raw, _CACHE_BIN * i)
            empty, = struct.unpack_from("<H", raw, _CACHE_BIN * i + 20)
            out.append(((empty - head) & 0xFFFF) // 8)
        else:
            out.append(struct.unpack_from("<i", raw, _CACHE_BIN * i + 4)[0])
    return out


def plausible(count: int) -> bool:
    """Can a cache bin hold COUNT regions?"""
    return 0 <= count <= MAX_NCACHED


def cache_bins(mem: Memory, layout: JeLayout, arrays: tuple[int, ...], n: int) -> list[int]:
    """The counts of the first N cache bins of a tcache whose cache_bin_t arrays are at ARRAYS."""
    out = []
    for array, (first, last) in zip(arrays, _array_spans(layout, n)):
        if last > first:
            out += bin_counts(layout, mem.read(array + _CACHE_BIN * first, _CACHE_BIN * (last - first)),
                              last - first)
    return out


def cached_regions(mem: Memory, layout: JeLayout, arrays: tuple[int, ...], n: int) -> list[tuple[int, list[int]]]:
    """(class index, the addresses of the regions it caches) of each non-empty bin among the first N of a
    tcache whose cache_bin_t arrays are at ARRAYS (5.2.1: avail[-ncached..-1]; 5.3.0: stack_head[0..ncached-1]);
    ReadError when a bin's stack is unreadable."""
    out = []
    index = 0
    for array, (first, last) in zip(arrays, _array_spans(layout, n)):
        raw = mem.read(array + _CACHE_BIN * first, _CACHE_BIN * (last - first)) if last > first else b""
        for slot, count in enumerate(bin_counts(layout, raw, last - first)):
            if 0 < count <= MAX_NCACHED:
                if layout.stack_cache_bins:
                    stack, = struct.unpack_from("<Q", raw, _CACHE_BIN * slot)
                else:
                    stack = struct.unpack_from("<Q", raw, _CACHE_BIN * slot + 16)[0] - 8 * count
                out.append((index + slot, list(struct.unpack("<%dQ" % count, mem.read(stack, 8 * count)))))
        index += last - first
    return out


def _array_spans(layout: JeLayout, n: int) -> list[tuple[int, int]]:
    """For each cache-bin array, the slots of the first N bins it holds."""
    if len(layout.tsd_tcache_bins) == 1:
        return [(0, n)]
    nbins = layout.classes.nbins
    return [(0, min(n, nbins)), (0, max(0, n - nbins))]


def arena_tcache_bytes(mem: Memory, layout: JeLayout, index: int, first: int, n: int | None
                       ) -> tuple[int | None, list[Finding]]:
    """tcache_bytes of arena INDEX as its statistics compute it, from the descriptor list whose first element
    is FIRST; None, with a finding, when the list cannot be followed (None alone when nhbins is unknown)."""
    if not first:
        return 0, []
    if n is None:
        return None, []
    total, at, seen = 0, first, set()
    while at and len(seen) < _MAX_TCACHES:
        try:
            words = struct.unpack("<%dQ" % (2 + len(layout.descriptor_bins)),
                                  mem.read(at, 16 + 8 * len(layout.descriptor_bins)))
            total += _descriptor_bytes(mem, layout, words[2:], n)
        except ReadError as exc:
            return None, [_finding(index, exc.address, f"the thread cache registered at {at:#x} is unreadable "
                                   f"({exc.reason})")]
        seen.add(at)
        at = words[0] if words[0] != first else 0
        if at in seen:
            return None, [_finding(index, at, f"the arena's list of thread caches loops back to {at:#x} "
                                   f"without returning to its head {first:#x}")]
    if at:
        return None, [_finding(index, at, f"the arena's list of thread caches goes on past {_MAX_TCACHES}")]
    return total, []


def _descriptor_bytes(mem: Memory, layout: JeLayout, arrays: tuple[int, ...], n: int) -> int:
    """The bytes one descriptor's bins hold, as the version's statistics count them."""
    size, nbins = layout.classes.class_size, layout.classes.nbins
    if len(arrays) == 1:
        return sum(c * size(i) for i, c in enumerate(cache_bins(mem, layout, arrays, n)) if plausible(c))
    small = bin_counts(layout, mem.read(arrays[0], _CACHE_BIN * nbins), nbins)
    total = sum(c * size(i) for i, c in enumerate(small[:n]) if plausible(c))
    if n > nbins:      # 5.2.1 reads bins_large[i] for class i, not bins_large[i - nbins]
        large = bin_counts(layout, mem.read(arrays[1] + _CACHE_BIN * nbins, _CACHE_BIN * (n - nbins)), n - nbins)
        total += sum(c * size(nbins + i) for i, c in enumerate(large) if plausible(c))
    return total


def _finding(index: int, address: int, message: str) -> Finding:
    return Finding(Severity.ERROR, address, f"arena {index}", f"{message}: tcache_bytes is not known",
                   Kind.ARENA)
