"""What an arena_t keeps besides its bins, read from the arena's bytes: the figures malloc_stats_print merges
from its statistics and its base (mapped, base, internal, resident, metadata_thp; 5.3.1's metadata_edata and
metadata_rtree), its large classes, its free extents by page size class, its decay clocks, and the bookkeeping
the version keeps (abandoned_vm, spare extent headers, when it was made)."""

from __future__ import annotations

import struct

from heapwalk.common.findings import Finding, Severity
from heapwalk.jemalloc.kinds import Kind
from heapwalk.jemalloc.layout import JeLayout
from heapwalk.jemalloc.model import JeExtents, JeLarge
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["memory_figures", "base_metadata", "bookkeeping", "large_classes", "free_extents", "decay_clock"]


def memory_figures(mem: Memory, layout: JeLayout, index: int, raw: bytes, findings: list[Finding]
            ) -> tuple[int, int, int, int, int]:
    """(mapped, base, internal, resident, metadata_thp) as malloc_stats_print merges them from the arena's
    statistics, its base's counters and its pages; without the base's counters when they are unreadable (a
    finding at the base says so)."""
    base = struct.unpack_from("<Q", raw, layout.base)[0]
    try:
        counters = mem.read(base + layout.base_counters, max(layout.base_fields) + 8)
        allocated, resident, mapped, n_thp = (struct.unpack_from("<Q", counters, at)[0] for at in layout.base_fields)
    except ReadError as exc:
        allocated = resident = mapped = n_thp = 0
        findings.append(Finding(Severity.ERROR, base, f"arena {index}", f"the arena's base (its metadata) at "
                                f"{base:#x} is unreadable ({exc.reason}): mapped, base, resident and metadata_thp "
                                "leave the base's counters out", Kind.ARENA))

    def word(off: int) -> int:
        return struct.unpack_from("<Q", raw, off)[0]

    pages = word(layout.nactive) + sum(word(off) for off in layout.dirty_npages)
    if layout.resident_muzzy:
        pages += sum(word(off) for off in layout.muzzy_npages)
    return (mapped + word(layout.stats_mapped), allocated, word(layout.stats_internal), resident + pages * layout.page,
            n_thp)


def base_metadata(mem: Memory, layout: JeLayout, raw: bytes) -> tuple[int | None, int | None]:
    """The bytes the arena's base allocated for extent headers and for radix tree nodes (5.3.1; None where the
    base does not count them apart, or its counters are unreadable, which `_memory` reports)."""
    if layout.base_metadata is None:
        return None, None
    base = struct.unpack_from("<Q", raw, layout.base)[0]
    try:
        counters = mem.read(base + layout.base_counters, max(layout.base_metadata) + 8)
    except ReadError:
        return None, None
    edata, rtree = (struct.unpack_from("<Q", counters, at)[0] for at in layout.base_metadata)
    return edata, rtree


def bookkeeping(layout: JeLayout, raw: bytes, statistics: bool) -> dict[str, int | None]:
    """The arena's abandoned_vm (a statistic: None without STATISTICS), its count of spare extent headers and
    when it was made, where the version keeps them (None where it does not)."""
    def word(off: int | None) -> int | None:
        return None if off is None else struct.unpack_from("<Q", raw, off)[0]

    return {"abandoned_vm": word(layout.abandoned_vm) if statistics else None,
            "extent_avail": word(layout.extent_avail), "created_ns": word(layout.create_time)}


def large_classes(layout: JeLayout, raw: bytes) -> tuple[JeLarge, ...]:
    """The arena's large size classes: arena_stats_large_t {nmalloc, ndalloc, nrequests, nfills, nflushes, ...}
    (5.1.0: {nmalloc, ndalloc, nrequests, curlextents}, no flushes; 5.3.1: active_bytes before nrequests)."""
    out = []
    fields = layout.lstats_fields
    for i in range(layout.classes.nlextents):
        at = layout.lstats + layout.lstats_stride * i
        nmalloc, ndalloc, nrequests = (struct.unpack_from("<Q", raw, at + off)[0] for off in fields[:3])
        nflushes = struct.unpack_from("<Q", raw, at + fields[3])[0] if layout.lstats_flushes else None
        active = None if layout.lstats_active is None else struct.unpack_from("<Q", raw, at + layout.lstats_active)[0]
        out.append(JeLarge(layout.classes.large_size(i), nmalloc, ndalloc, nrequests, nflushes, active_bytes=active))
    return tuple(out)


def free_extents(layout: JeLayout, raw: bytes) -> tuple[JeExtents, ...]:
    """The free extents by page size class, from the dirty, muzzy and retained containers' counters (none in
    5.1.0, which keeps no such counters)."""
    if not layout.extent_stats:
        return ()
    counts = []
    npsizes = layout.classes.npsizes
    for container in layout.extent_stats:     # dirty, muzzy, retained
        n, b = [0] * npsizes, [0] * npsizes
        for nextents, nbytes, stride in container:
            for i in range(npsizes):
                n[i] += struct.unpack_from("<Q", raw, nextents + stride * i)[0]
                b[i] += struct.unpack_from("<Q", raw, nbytes + stride * i)[0]
        counts.append((n, b))
    (nd, bd), (nm, bm), (nr, br) = counts
    return tuple(JeExtents(nd[i], nm[i], nr[i], bd[i], bm[i], br[i]) for i in range(npsizes))


def decay_clock(layout: JeLayout, raw: bytes, time_ms: int) -> tuple[int, int]:
    """The (epoch, deadline) of the decay whose time_ms is at TIME_MS in the arena's bytes RAW."""
    return (struct.unpack_from("<Q", raw, time_ms + layout.decay_epoch)[0],
            struct.unpack_from("<Q", raw, time_ms + layout.decay_deadline)[0])
