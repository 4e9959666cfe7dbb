"""mimalloc's free lists walked: a page's free, local-free and thread-free lists (singly linked through each
block's first word, plain pointers in a release build), and each heap's list of blocks other threads freed into
its full pages (delayed).  A list that leaves its page's blocks, loops or cannot be read is a finding at the block
where it goes wrong; its page is marked damaged (which of its blocks are free is then unknown)."""

from __future__ import annotations

import bisect

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.mimalloc.layout import MiLayout

__all__ = ["LIST", "walk_page", "count_delayed"]

LIST = Kind("mi_free_list", "free list that leaves its page, loops or is cut")
_MAX_WALK = 1 << 20


def walk_page(mem: Memory, page, findings: list[Finding]) -> None:
    """Counts the blocks on PAGE's three lists, reading its blocks once; a list that leaves the page's blocks,
    loops or cannot be read is a finding at the block where it goes wrong, and counts up to there."""
    if not any(page.heads):
        return
    span = page.cut * page.block_size
    try:
        data = mem.read(page.start, span)
    except ReadError:
        data = None
    seen: set[int] = set()
    order: list[int] = []
    counts = []
    for name, head in zip(("free", "local free", "thread free"), page.heads):
        n, at = 0, head
        while at:
            offset = at - page.start
            if not 0 <= offset < span or offset % page.block_size:
                page.damaged = True
                findings.append(Finding(Severity.ERROR, at, "mi_page_t", f"the {name} list of the page at "
                                        f"{page.address:#x} ({page.block_size}-byte blocks from {page.start:#x}) "
                                        f"holds {at:#x}, which is not one of its blocks", LIST))
                break
            if at in seen:
                page.damaged = True
                findings.append(Finding(Severity.ERROR, at, "mi_page_t", f"the block {at:#x} is twice on the lists "
                                        f"of the page at {page.address:#x} (its {name} list loops or "
                                        "crosses another)", LIST))
                break
            seen.add(at)
            order.append(at)
            n += 1
            try:
                at = int.from_bytes(data[offset:offset + 8], "little") if data is not None else u64(mem, at)
            except ReadError as exc:
                page.damaged = True
                findings.append(Finding(Severity.ERROR, at, "mi_page_t", f"the {name} list of the page at "
                                        f"{page.address:#x} is cut: {exc}", LIST))
                break
        counts.append(n)
    page.free, page.local_free, page.thread_free = counts
    page.freed.extend(order)


def count_delayed(mem: Memory, lay: MiLayout, heaps: list[int], pages: list, findings: list[Finding]
                  ) -> dict[int, int]:
    """Counts the delayed-free list of each heap of HEAPS into the PAGES its blocks lie in; heap -> its count."""
    pages = sorted(((p.start, p) for p in pages), key=lambda x: x[0])
    starts = [a for a, _ in pages]
    counts = dict.fromkeys(heaps, 0)
    for heap in heaps:
        try:
            at = u64(mem, heap + lay.heap_delayed_free)
        except ReadError:
            continue
        seen: set[int] = set()
        while at and at not in seen and len(seen) < _MAX_WALK:
            seen.add(at)
            i = bisect.bisect_right(starts, at) - 1
            page = pages[i][1] if i >= 0 else None
            if page is None or at >= page.start + page.cut * page.block_size:
                if page is not None:
                    page.damaged = True
                findings.append(Finding(Severity.ERROR, at, "mi_heap_t", f"the delayed-free list of the heap at "
                                        f"{heap:#x} holds {at:#x}, which is in no page", LIST))
                break
            page.delayed += 1
            page.freed.append(at)
            counts[heap] += 1
            try:
                at = u64(mem, at)
            except ReadError:
                break
    return counts
