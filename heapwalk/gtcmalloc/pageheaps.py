"""The page allocator of Google's tcmalloc: its huge-page-aware allocators (normal, sampled, cold), each from its
own counters (its filler's hugepages and pages, its huge allocator's hugepages from the system, its cache's) and
its regions' list."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.gtcmalloc.find import GtcUnknown, Located
from heapwalk.gtcmalloc.layout import HUGEPAGE, PAGE, GtcLayout
from heapwalk.inferior.memory import Memory, ReadError, u64

__all__ = ["PageHeap", "read_heaps", "read_allocator", "KIND"]

#: what a finding on Google's tcmalloc's structures is
KIND = Kind("gtcmalloc", "Google tcmalloc's structure unreadable or inconsistent")


@dataclass(frozen=True)
class PageHeap:
    """One huge-page-aware allocator: its hugepages from the system, and its pages by state."""

    name: str
    address: int
    system: int                 # bytes from the system
    free: int                   # bytes free and backed (the filler's free pages, cached hugepages, regions')
    unmapped: int               # bytes given back to the system
    filler_hugepages: int
    filler_used_pages: int
    cached_hugepages: int
    regions: int
    released: tuple = (0, 0, 0, 0, 0)   # pages released: in all, by ReleaseMemoryToSystem, by background actions,
    #                                     past the soft limit, past the hard limit


def read_heaps(mem: Memory, located: Located, findings: list) -> list[PageHeap]:
    """The page allocator's huge-page-aware allocators in use (the normal one, the sampled one, the cold one when
    it has one), each from its own counters and its regions' list."""
    L, base = located.layout, located.page_allocator
    tail = base + L.hpaa_size * L.hpaa_choices
    normal, sampled, selsan, cold = (u64(mem, tail + 8 * k) for k in range(4))
    if selsan:
        raise GtcUnknown("heapwalk: this Google tcmalloc runs SelSan's page allocator, which heapwalk does not "
                         "decode")
    has_cold = mem.read(tail + 36, 1)[0]
    used = [("normal", normal), ("sampled", sampled)] + ([("cold", cold)] if has_cold else [])
    out = []
    for name, at in used:
        if not base <= at < tail or (at - base) % L.hpaa_size:
            findings.append(Finding(Severity.ERROR, tail, "the page allocator", f"its {name} allocator's pointer "
                                    f"({at:#x}) is not one of its own allocators", KIND))
            continue
        out.append(_heap(mem, L, name, at, findings))
    return out


def _heap(mem: Memory, L: GtcLayout, name: str, at: int, findings: list) -> PageHeap:
    per_huge = HUGEPAGE // PAGE
    q = lambda off: u64(mem, at + off)            # noqa: E731
    filler, allocated, unmapped = q(L.filler_size), q(L.filler_allocated) + q(L.filler_allocated + 8), \
        q(L.filler_unmapped)
    from_system, in_use, cached = q(L.alloc_from_system), q(L.alloc_in_use), q(L.cache_size)
    free_pages = filler * per_huge - allocated - unmapped
    if free_pages < 0 or in_use > from_system:
        findings.append(Finding(Severity.ERROR, at, f"the {name} page heap", f"its counters are impossible: "
                                f"{allocated} pages used and {unmapped} unmapped in a filler of {filler} hugepages, "
                                f"{in_use} of {from_system} hugepages from the system in use", KIND))
        free_pages = max(0, free_pages)
    region_free, region_unmapped, regions = _regions(mem, L, at, name, findings)
    return PageHeap(name, at, from_system * HUGEPAGE,
                    cached * HUGEPAGE + (free_pages + region_free) * PAGE,
                    max(0, from_system - in_use) * HUGEPAGE + (unmapped + region_unmapped) * PAGE,
                    filler, allocated, cached, regions, struct.unpack("<5Q", mem.read(at + L.hpaa_released, 40)))


def _regions(mem: Memory, L: GtcLayout, at: int, name: str, findings: list) -> tuple[int, int, int]:
    """The free and the unmapped pages of the allocator's huge regions, and how many it holds."""
    per_huge = HUGEPAGE // PAGE
    head = at + L.regions_list
    free = unmapped = walked = 0
    holder, region = head, u64(mem, head)
    try:
        while region and region != head and walked <= 1 << 16:
            used = struct.unpack("<I", mem.read(region + L.region_used, 4))[0]
            hugepages, backed = u64(mem, region + L.region_range + 8), u64(mem, region + L.region_backed)
            unmapped += max(0, hugepages - backed) * per_huge
            free += max(0, min(backed, hugepages) * per_huge - used)
            walked += 1
            holder, region = region, u64(mem, region)
    except ReadError:
        findings.append(Finding(Severity.ERROR, holder, f"the {name} page heap's regions", f"the region it points at "
                                f"({region:#x}) cannot be read: the regions after it are not counted", Kind.UNMAPPED))
        return free, unmapped, walked
    count = u64(mem, at + L.regions_count)
    if walked != count:
        findings.append(Finding(Severity.ERROR, at + L.regions_count, f"the {name} page heap's regions", f"its list "
                                f"holds {walked} regions, its count says {count}", KIND))
    return free, unmapped, walked


def read_allocator(mem: Memory, located: Located) -> dict[str, int]:
    """The page allocator's own figures: its limits, their hits and the shrinks after them, its peaks."""
    L = located.layout
    tail = located.page_allocator + L.hpaa_size * L.hpaa_choices
    soft, hard = struct.unpack("<qq", mem.read(tail + L.pa_limits, 16))
    soft_hits, hard_hits = struct.unpack("<qq", mem.read(tail + L.pa_limit_hits, 16))
    soft_shrinks, hard_shrinks = struct.unpack("<qq", mem.read(tail + L.pa_shrinks, 16))
    backed, sampled = struct.unpack("<QQ", mem.read(tail + L.pa_peaks, 16))
    return {"soft_limit": soft, "hard_limit": hard, "soft_hits": soft_hits, "hard_hits": hard_hits,
            "soft_shrinks": soft_shrinks, "hard_shrinks": hard_shrinks, "peak_backed": backed,
            "peak_sampled": sampled}
