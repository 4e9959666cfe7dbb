"""'heapwalk check' of tcmalloc: the invariants its state must hold, each broken one a finding at the address
of the bad data: the spans the page map names add up to the heap size the page heap counts; the thread caches
form a list whose previous links match; each central list's transfer cache holds no more batches than it has
room for, and its counters are possible; every free object, list by list: each thread cache's lists and each
transfer cache's batches hold as many objects as they count, each an object of their class, none twice; each
span's own list holds the objects its refcount leaves free, and the class's central list counts them all."""

from __future__ import annotations

import numpy as np

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.tcmalloc.blocks import on_span_lists
from heapwalk.tcmalloc.decode import NORMAL, RETURNED, TcState
from heapwalk.tcmalloc.objects import Cached, SpanTable

__all__ = ["check_tcmalloc", "CHECKED"]

#: what the check covers, for its summary
CHECKED = ("the page map's spans against the heap size and the free and returned bytes", "the list of thread caches",
           "each central free list's counters and transfer cache",
           "every free object of the thread caches, the transfer caches and each span's list")


def check_tcmalloc(state: TcState, mem: Memory, table: SpanTable, cached: tuple[Cached, list[Finding]]
                   ) -> list[Finding]:
    """Every broken invariant of STATE (read through MEM; TABLE its spans, CACHED its caches' objects as
    `objects.cached_objects` walked them), with what was expected and found."""
    out = list(state.findings) + _objects(state, mem, table, *cached)
    d, page = state.discovery, state.page_size
    mapped = sum(s.pages for s in state.spans) * page
    if state.spans and mapped != state.stats["system_bytes"]:
        out.append(Finding(Severity.ERROR, d.stats, "page heap", "the spans the page map names do not add up to "
                           "the heap size the page heap counts", Kind.ACCOUNTING, str(state.stats["system_bytes"]),
                           str(mapped)))
    for location, field, what in ((NORMAL, "free_bytes", "free"), (RETURNED, "unmapped_bytes", "returned")):
        counted = state.span_bytes(location)
        if state.spans and counted != state.stats[field]:
            out.append(Finding(Severity.ERROR, d.stats, "page heap", f"the {what} spans the page map names do not "
                               f"add up to the page heap's {field}", Kind.ACCOUNTING, str(state.stats[field]),
                               str(counted)))
    previous = 0
    for t in state.threads:
        try:
            prev = u64(mem, t.address + d.layout.thread_prev)
        except ReadError:
            break
        if prev != previous:
            out.append(Finding(Severity.ERROR, t.address, "thread cache", "a thread cache's previous link is not "
                               "the cache before it in the list", Kind.OTHER, f"{previous:#x}", f"{prev:#x}"))
        if not 0 <= t.size < 1 << 40:
            out.append(Finding(Severity.ERROR, t.address, "thread cache", "a thread cache's size is impossible",
                               Kind.OTHER, "", str(t.size)))
        previous = t.address
    for c in state.classes:
        entry = d.central + c.index * d.layout.central_stride
        if not 0 <= c.transfer_batches <= d.layout.transfer_entries:
            out.append(Finding(Severity.ERROR, entry + d.layout.central_used_slots, "central free list",
                               f"class {c.index}'s transfer cache holds more batches than it has room for",
                               Kind.OTHER, f"at most {d.layout.transfer_entries}", str(c.transfer_batches)))
        if c.spans > 1 << 40 or c.central_objects > 1 << 48:
            out.append(Finding(Severity.ERROR, entry, "central free list", f"class {c.index}'s counters are "
                               "impossible", Kind.OTHER, "", f"{c.spans} spans, {c.central_objects} objects"))
    return out


def _objects(state: TcState, mem: Memory, table: SpanTable, cached: Cached, walked: list[Finding]) -> list[Finding]:
    """What the walks of every free list found: the caches' (WALKED), each span's, and the counts they break."""
    out = list(walked)
    small = table.small()
    twice = on_span_lists(mem, table, small, cached.address, out)
    rows = table.rows(cached.address)
    held = np.bincount(rows[rows >= 0], minlength=len(table))[:len(table)]
    for row in np.flatnonzero(held > np.clip(table.refcount, 0, None)).tolist():
        out.append(Finding(Severity.ERROR, int(table.header[row]), "span", "the caches hold more of a span's "
                           "objects than its refcount says were taken out of it", Kind.ACCOUNTING,
                           f"at most {int(table.refcount[row])}", str(int(held[row]))))
    for a in cached.address[twice][:100].tolist():
        out.append(Finding(Severity.ERROR, a, "span", "a free object is both in a cache and on its span's list",
                           Kind.DOUBLE_FREE))
    free = np.clip(table.count - table.refcount, 0, None)
    for c in state.classes:
        if not c.index:
            continue
        counted = int(free[small[table.size_class[small] == c.index]].sum())
        if counted != c.central_objects:
            entry = state.discovery.central + c.index * state.discovery.layout.central_stride
            out.append(Finding(Severity.ERROR, entry + state.discovery.layout.central_counter, "central free list",
                               f"class {c.index}'s central list counts other free objects than its spans leave free",
                               Kind.ACCOUNTING, str(counted), str(c.central_objects)))
    return out
