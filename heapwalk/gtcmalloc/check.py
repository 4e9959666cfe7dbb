"""Google's tcmalloc held to its invariants, beyond what the decode already found: every central free list's spans
walked, list by list, against its counters (the free objects of its spans, how many spans it lists), each span's
objects in use within what a span of the class holds."""

from __future__ import annotations

import struct

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.gtcmalloc.decode import GtcState
from heapwalk.gtcmalloc.pageheaps import KIND
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["check_gtcmalloc", "CHECKED"]

CHECKED = ("every size class's transfer cache and central free list counters",
           "every span on the central free lists, against its list's counters",
           "every CPU's slab headers", "the thread caches' links", "the page heaps' counters and regions")

#: spans walked on one list at most before it is called a cycle
_LIMIT = 1 << 22


def check_gtcmalloc(state: GtcState, mem: Memory) -> list[Finding]:
    """The decode's findings and those of the walk of every central free list's spans."""
    out = list(state.findings)
    L = state.located.layout
    for c in state.classes:
        at = state.located.transfer + c.index * L.tc_stride + L.tc_central
        out.extend(_walk_lists(mem, L, c, at))
    return out


def _walk_lists(mem: Memory, L, c, central: int) -> list[Finding]:
    """Class C's spans with free objects, list by list: their free objects against the list's counter, their
    count against its size."""
    free = spans = 0
    for k in range(L.cfl_list_count):
        head = central + L.cfl_lists + 16 * k
        try:
            span, walked = struct.unpack("<Q", mem.read(head, 8))[0], 0
            while span and span != head:
                allocated = struct.unpack("<H", mem.read(span + L.span_allocated, 2))[0]
                if allocated >= c.objects_per_span:
                    return [Finding(Severity.ERROR, span + L.span_allocated, f"a span of size class {c.index}",
                                    f"it says {allocated} objects in use, of {c.objects_per_span} a span holds, and "
                                    "lies on a list of spans with free objects", KIND)]
                free += c.objects_per_span - allocated
                spans, walked = spans + 1, walked + 1
                if walked > _LIMIT:
                    return [Finding(Severity.ERROR, head, f"size class {c.index}'s central free list",
                                    f"its list {k} of spans does not come back to its head", Kind.LIST_CYCLE)]
                span = struct.unpack("<Q", mem.read(span, 8))[0]
        except ReadError as exc:
            return [Finding(Severity.ERROR, exc.address, f"size class {c.index}'s central free list",
                            f"a span on its list {k} cannot be read", Kind.UNMAPPED)]
    listed = struct.unpack("<Q", mem.read(central + L.cfl_lists_size, 8))[0]
    out = []
    if free != c.central_objects:
        out.append(Finding(Severity.ERROR, central + L.cfl_counter, f"size class {c.index}'s central free list",
                           f"its spans hold {free} free objects, its counter says {c.central_objects}", KIND,
                           str(free), str(c.central_objects)))
    if spans != listed:
        out.append(Finding(Severity.ERROR, central + L.cfl_lists_size, f"size class {c.index}'s central free list",
                           f"its lists hold {spans} spans, its count says {listed}", KIND, str(spans),
                           str(listed)))
    return out
