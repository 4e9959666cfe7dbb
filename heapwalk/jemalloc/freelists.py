"""The lists jemalloc keeps its free extents on: each arena's dirty, muzzy and retained containers (5.3.0:
each with a guarded one) hold their extents on a least-recently-used ring, right before the container's page
count.  Walked extent by extent, each must be of the container's state and arena, the ring must come back to
its head, and the pages on it must add up to what the container counts; what is found wrong is a finding at
the extent or the head where it is.  'heapwalk check' reports them (`jemalloc.check`)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from heapwalk.common.findings import Finding, Severity
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.jemalloc.kinds import Kind
from heapwalk.jemalloc.layout import JeLayout

__all__ = ["ListedExtents", "walk_free_lists"]

_NAMES = {1: "dirty", 2: "muzzy", 3: "retained"}
_MAX_EXTENTS = 1 << 22


@dataclass(frozen=True)
class ListedExtents:
    """One container's ring as walked: its state (1 dirty, 2 muzzy, 3 retained), the extents and pages on it,
    and the pages its counter says."""

    state: int
    extents: int
    pages: int
    counted: int


def walk_free_lists(mem: Memory, layout: JeLayout, index: int, address: int, raw: bytes
                    ) -> tuple[tuple[ListedExtents, ...], list[Finding]]:
    """Arena INDEX's free-extent rings (the arena at ADDRESS, whose bytes are RAW), and what is wrong in them."""
    out, findings = [], []
    for state, counters in ((1, layout.dirty_npages), (2, layout.muzzy_npages), (3, layout.retained_npages)):
        for counter in counters:
            head = address + counter - 8
            counted = struct.unpack_from("<Q", raw, counter)[0]
            extents, pages = _ring(mem, layout, index, state, head, struct.unpack_from("<Q", raw, counter - 8)[0],
                                   counted, findings)
            out.append(ListedExtents(state, extents, pages, counted))
    return tuple(out), findings


def _ring(mem: Memory, layout: JeLayout, index: int, state: int, head: int, first: int, counted: int,
          findings: list[Finding]) -> tuple[int, int]:
    """(extents, pages) on the ring whose first extent is FIRST (0: empty), checking each."""
    where = f"arena {index} {_NAMES[state]} extents"
    at, seen, pages = first, set(), 0
    limit = min(_MAX_EXTENTS, counted + 1)
    link = layout.extent_lru_link
    size = max(24, link + 8)                 # the header's first three words and its link, read at once
    while at:
        if at in seen:
            findings.append(Finding(Severity.ERROR, at, where, f"the list of {_NAMES[state]} extents at {head:#x} "
                                    f"loops back to {at:#x} before its first extent", Kind.LIST_CYCLE))
            break
        if len(seen) >= limit:
            findings.append(Finding(Severity.ERROR, head, where, f"the list of {_NAMES[state]} extents at {head:#x} "
                                    f"holds more extents than its {counted} pages can", Kind.ARENA,
                                    f"at most {counted} extents", f"more than {len(seen)}"))
            break
        seen.add(at)
        try:
            header = mem.read(at, size)
            bits, _addr, size_esn = struct.unpack_from("<QQQ", header)
            following, = struct.unpack_from("<Q", header, link)
        except ReadError as exc:
            findings.append(Finding(Severity.ERROR, exc.address, where, f"an extent on the list of "
                                    f"{_NAMES[state]} extents at {head:#x} is unreadable ({exc.reason})",
                                    Kind.UNMAPPED))
            break
        found = (bits >> layout.extent_state_shift) & layout.extent_state_mask
        if found != state or bits & 0xFFF != index:
            findings.append(Finding(Severity.ERROR, at, where, f"extent {at:#x} on arena {index}'s list of "
                                    f"{_NAMES[state]} extents is of arena {bits & 0xFFF}, state {found}",
                                    Kind.ARENA, f"arena {index}, state {state}", f"arena {bits & 0xFFF}, state {found}"))
        pages += (size_esn & ~(layout.page - 1)) // layout.page
        at = 0 if following == first else following
    return len(seen), pages
