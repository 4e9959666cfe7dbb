"""Google's tcmalloc's page heaps as the strips of a heap map (`view.HeapStrip`): a strip for each mapping of a page
heap, its live spans in address order.  A span cut into objects is drawn as the bytes of its objects the program
holds (then those of them the leak scan found leaked, then the proxies of sampled allocations), its free objects in thread caches, in transfer caches, in
CPUs' slabs and on its own free list, and what its pages lose to rounding: the bytes are exact, their order
inside the span is not.  A span of one allocation (large, or sampled) is in use (or leaked).  The pages between
spans are the page heap's: free, or given back to the system (tcmalloc's trackers of each hugepage say which;
heapwalk does not read them yet)."""

from __future__ import annotations

import numpy as np

from heapwalk.common.mapkinds import FREE, MAP_KINDS, MapKind, add_map_kind
from heapwalk.common.view import HeapStrip
from heapwalk.gtcmalloc.layout import PAGE
from heapwalk.gtcmalloc.objects import CENTRAL, CPU, IN_USE, PROXY, THREAD, TRANSFER, Objects
from heapwalk.gtcmalloc.pagemap import Spans

__all__ = ["page_heap_strips", "span_bytes"]

for _kind in (MapKind("gtc_thread", "free in thread caches", "#aec7e8", "w", 131, FREE),
              MapKind("gtc_transfer", "free in transfer caches", "#ffbb78", "v", 132, FREE),
              MapKind("gtc_cpu", "free in per-CPU caches", "#9edae5", "c", 132, FREE),
              MapKind("gtc_central", "free on spans' own lists", "#c49c94", "n", 133, FREE),
              MapKind("gtc_rounding", "lost to rounding", "#c7c7c7", "z", 134),
              MapKind("gtc_pages", "page heap: free or given back", "#f7b6d2", "p", 141, FREE),
              MapKind("gtc_proxy", "sampled allocations' proxies (tcmalloc's, counted in use)", "#8c564b", "y", 80)):
    add_map_kind(_kind)
KIND = {name: i for i, name in enumerate(MAP_KINDS)}
#: the runs of a span cut into objects, in the order they are drawn: each object place's kind
_ORDER = ((IN_USE, "in_use"), (-1, "leaked"), (PROXY, "gtc_proxy"), (THREAD, "gtc_thread"),
          (TRANSFER, "gtc_transfer"), (CPU, "gtc_cpu"), (CENTRAL, "gtc_central"))


def span_bytes(objects: Objects, leaked: np.ndarray | None) -> dict[int, np.ndarray]:
    """Each span's bytes by place (-1: leaked, taken from in use), for `Objects`' spans."""
    n = len(objects.start)
    span_of = np.repeat(np.arange(n), objects.count)
    out = {}
    for place, _ in _ORDER:
        if place >= 0:
            out[place] = np.bincount(span_of[objects.place == place], minlength=n).astype(np.int64) * objects.size
    lost = np.zeros(n, dtype=np.int64)
    if leaked is not None and len(leaked):
        rows = objects.span_of(np.asarray(leaked, dtype=np.uint64))
        np.add.at(lost, rows[rows >= 0], objects.size[rows[rows >= 0]])
    out[-1] = np.minimum(lost, out[IN_USE])
    out[IN_USE] = out[IN_USE] - out[-1]
    return out


def page_heap_strips(spans: Spans, objects: Objects, regions: list[tuple[int, int]],
                     leaked: np.ndarray | None = None) -> list[HeapStrip]:
    """A strip for each of REGIONS (a page heap's mappings), its live spans in runs by use; the blocks at LEAKED
    (the leak scan's, when it ran) drawn as leaked."""
    cut = span_bytes(objects, leaked)
    leaked_set = set(np.asarray(leaked if leaked is not None else [], dtype=np.uint64).tolist())
    whole = [(int(spans.first_page[r]) * PAGE, int(spans.first_page[r] + spans.pages[r]) * PAGE)
             for r in range(len(spans)) if not spans.size_class[r] or spans.sampled[r]]
    runs: list[tuple[int, int, int]] = [(lo, hi, KIND["leaked"] if lo in leaked_set else KIND["in_use"])
                                        for lo, hi in whole]
    for k in range(len(objects.start)):
        at = int(objects.start[k])
        for place, name in _ORDER:
            length = int(cut[place][k])
            if length:
                runs.append((at, at + length, KIND[name]))
                at += length
        end = int(objects.start[k]) + int(spans.pages[objects.rows[k]]) * PAGE
        if end > at:
            runs.append((at, end, KIND["gtc_rounding"]))
    runs.sort()
    out = []
    for n, (lo, hi) in enumerate(sorted(regions)):
        mine = [r for r in runs if lo <= r[0] < hi]
        filled, at = [], lo
        for start, end, kind in mine:
            if start > at:
                filled.append((at, start, KIND["gtc_pages"]))
            filled.append((start, min(end, hi), kind))
            at = min(end, hi)
        if hi > at:
            filled.append((at, hi, KIND["gtc_pages"]))
        table = np.array(filled, dtype=np.uint64).reshape(-1, 3)
        out.append(HeapStrip(0, f"Google's tcmalloc page heap {n + 1}", lo, hi, table[:, 0], table[:, 1],
                             table[:, 2].astype(np.uint8)))
    return out
