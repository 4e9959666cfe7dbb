"""'heapwalk check' of mimalloc: every page's counters against the blocks its lists hold, every segment's counts
against its pages, each page's heap against its segment's owner, and each heap's page queues walked (every page
of a queue its own, of the queue's block size, linked both ways, the queues holding as many pages as the heap
counts).  The free lists themselves are walked by the decoder (`mimalloc.lists`), whose findings come first."""

from __future__ import annotations

import numpy as np

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.inferior.memory import Memory, ReadError, hop_read
from heapwalk.mimalloc.decode import MiPage, MiState
from heapwalk.mimalloc.layout import queue_shape

__all__ = ["check_mimalloc", "CHECKED", "CHECKED3", "COUNTS", "QUEUE"]

COUNTS = Kind("mi_counts", "page or segment counters against its blocks or pages")
QUEUE = Kind("mi_page_queue", "heap page queue broken")
CHECKED = ("every page's counters against its free lists", "every segment's page counts",
           "each page's heap against its segment's owner", "every heap's page queues, link by link")
#: mimalloc 3's (the decoder holds each page to its arena's page bitmap and its memory)
CHECKED3 = ("every page's counters against its free lists", "each page's heap against its owner thread",
            "every arena page against the arena's bitmap and slices", "every heap's page queues, link by link")
_MAX_QUEUE = 1 << 20


def check_mimalloc(mem: Memory, state: MiState) -> list[Finding]:
    """The findings of the decoder, then those of the checks CHECKED names, in address order within each."""
    out = list(state.findings)
    heaps = {h.address: h for h in state.heaps}
    for seg in state.live():
        out += _segment_counts(seg, state.unowned(seg))
        for page in seg.pages:
            out += _page_counts(page)
            if seg.thread_id and page.heap and page.heap not in heaps:
                out.append(Finding(Severity.ERROR, page.address, "mi_page_t", f"the page at {page.address:#x} "
                                   f"names the heap {page.heap:#x}, which is no heap of the process", COUNTS))
            elif seg.thread_id and page.heap and heaps[page.heap].thread_id != seg.thread_id:
                out.append(Finding(Severity.ERROR, page.address, "mi_page_t", f"the page at {page.address:#x} "
                                   f"belongs to a heap of thread {heaps[page.heap].thread_id:#x}, in a segment "
                                   f"of thread {seg.thread_id:#x}", COUNTS))
    pages = {p.address: p for p in state.pages()}
    for heap in state.heaps:
        out += _queues(mem, state, heap.address, pages)
    return out


def _segment_counts(seg, unowned: bool) -> list[Finding]:
    """SEG's count of pages in use against its pages, and, abandoned (not UNOWNED by design), of pages
    abandoned."""
    out = []
    if seg.used != len(seg.pages):
        out.append(Finding(Severity.ERROR, seg.address, "mi_segment_t", f"the segment at {seg.address:#x} counts "
                           f"{seg.used} pages in use, and holds {len(seg.pages)}", COUNTS))
    if not seg.thread_id and not unowned and seg.abandoned != seg.used:
        out.append(Finding(Severity.ERROR, seg.address, "mi_segment_t", f"the abandoned segment at "
                           f"{seg.address:#x} counts {seg.abandoned} abandoned pages of {seg.used}", COUNTS))
    return out


def _page_counts(page: MiPage) -> list[Finding]:
    """A page's counters: capacity within what it reserved, used within capacity, and (when its lists could be
    walked) its blocks in use and free adding up to its capacity."""
    what = None
    if page.reserved > page.room:
        what = f"reserves {page.reserved} blocks, more than its slices hold ({page.room})"
    elif page.capacity > page.reserved:
        what = f"has cut {page.capacity} blocks, more than the {page.reserved} it reserved"
    elif page.used > page.capacity:
        what = f"counts {page.used} blocks in use of {page.capacity}"
    elif not page.damaged and page.used + page.free + page.local_free != page.capacity:
        what = (f"counts {page.used} blocks in use (those other threads freed included), and "
                f"{page.free + page.local_free} free on its own lists: not its capacity {page.capacity}")
    elif not page.damaged and page.thread_free + page.delayed > page.used:
        what = (f"holds {page.thread_free + page.delayed} blocks other threads freed, more than the {page.used} "
                "it counts in use")
    if what is None:
        return []
    return [Finding(Severity.ERROR, page.address, "mi_page_t", f"the page at {page.address:#x} ({page.block_size}"
                    f"-byte blocks from {page.start:#x}) {what}", COUNTS)]


def _queues(mem: Memory, state: MiState, heap: int, pages: dict[int, MiPage]) -> list[Finding]:
    """HEAP's page queues walked: each page its own and linked back, no page in two queues, the count its
    page_count says."""
    lay = state.layout
    count, (q, size_word) = lay.bin_huge + 2, queue_shape(lay)
    try:
        queues = np.frombuffer(mem.read(heap + lay.heap_pages, 8 * q * count), dtype=np.uint64).reshape(count, q)
        said = int.from_bytes(mem.read(heap + lay.heap_page_count, 8), "little")
    except ReadError as exc:
        return [Finding(Severity.ERROR, heap, "mi_heap_t", f"the heap's page queues cannot be read ({exc})", QUEUE)]
    out, seen = [], set()
    lo, hi = min(lay.page_prev, lay.page_next), max(lay.page_prev, lay.page_next) + 8
    for first, last, size in queues[:, [0, 1, size_word]].tolist():
        prev, at = 0, int(first)
        while at and len(seen) < _MAX_QUEUE:
            page = pages.get(at)
            problem = ("is no page of a live segment" if page is None else "is in two queues" if at in seen
                       else f"belongs to the heap {page.heap:#x}" if page.heap != heap else "")
            if problem:
                out.append(Finding(Severity.ERROR, at, "mi_page_queue_t", f"a page queue of the heap at {heap:#x} "
                                   f"(blocks of {int(size)} bytes) holds {at:#x}, which {problem}", QUEUE))
                break
            seen.add(at)
            try:                     # (read past the cache: a page's links are all a walk wants of its memory)
                links = hop_read(mem, at + lo, hi - lo)
            except ReadError:
                break
            back = int.from_bytes(links[lay.page_prev - lo:lay.page_prev - lo + 8], "little")
            nxt = int.from_bytes(links[lay.page_next - lo:lay.page_next - lo + 8], "little")
            if back != prev:
                out.append(Finding(Severity.ERROR, at, "mi_page_t", f"the page at {at:#x} links back to {back:#x}, "
                                   f"not to {prev:#x}, in a queue of the heap at {heap:#x}", QUEUE))
            prev, at = at, nxt
        if prev != int(last) and not out:
            out.append(Finding(Severity.ERROR, heap, "mi_page_queue_t", f"a page queue of the heap at {heap:#x} "
                               f"ends at {prev:#x}, and says its last page is {int(last):#x}", QUEUE))
    if said != len(seen) and not out:
        out.append(Finding(Severity.ERROR, heap, "mi_heap_t", f"the heap at {heap:#x} counts {said} pages, and its "
                           f"queues hold {len(seen)}", QUEUE))
    return out
