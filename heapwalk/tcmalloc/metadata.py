"""Where tcmalloc's own metadata lies: the memory it takes from the system for its Spans, thread caches and page
map (its metadata allocator carves them from chunks of 8 MiB, each of which it counts in its metadata bytes).

The chunks' bounds are not kept anywhere, so the ranges are found from what lives in them: every Span the page
map names, every thread cache, every leaf of the page map, and the allocator's next free byte (the end of what
its current chunk handed out).  Those that lie close together (the allocator hands out each chunk from its
start, and its users take 128 KiB at a time) make one range, from the page of the first to the page after the
last; a range never reaches into a span.  What a chunk holds beyond the known objects (its heap
profiler's and sampler's records, its unused tail) is left out: the ranges are never more than tcmalloc's, and
what they leave out shows as anonymous memory."""

from __future__ import annotations

import numpy as np

from heapwalk.tcmalloc.decode import TcState
from heapwalk.tcmalloc.layout import SPAN
from heapwalk.tcmalloc.spans import columns

__all__ = ["metadata_ranges", "JOIN"]

#: objects at most this far apart are taken as one range of metadata (two of the metadata allocator's increments)
JOIN = 256 << 10
_PAGE = 4096


def metadata_ranges(state: TcState) -> list[tuple[int, int]]:
    """The ranges of memory tcmalloc's known metadata objects lie in, page-aligned, none inside a span."""
    lay = state.discovery.layout
    spans = columns(state.spans)
    headers = spans.header[spans.header != 0]
    objects = [(t.address, t.address + lay.thread_prev + 8) for t in state.threads] + \
        [(leaf, leaf + 8 * lay.pagemap_leaf) for leaf in state.leaves] + \
        ([(state.metadata_next - 1, state.metadata_next)] if state.metadata_next else [])
    if not objects and not len(headers):
        return []
    joined = np.concatenate([np.array(objects, dtype=np.uint64).reshape(-1, 2),
                             np.stack([headers, headers + np.uint64(SPAN)], axis=1)])
    joined = joined[np.lexsort((joined[:, 1], joined[:, 0]))]
    span_starts, span_ends = spans.starts_ends(state.page_size)
    return [_outside_spans(start & ~(_PAGE - 1), (end + _PAGE - 1) & ~(_PAGE - 1), span_starts, span_ends)
            for start, end in _joined(joined, span_starts)]


def _joined(objects: np.ndarray, span_starts: np.ndarray) -> list[tuple[int, int]]:
    """The objects ((n, 2) [start, end), sorted) joined where one starts at most JOIN past the end of those before
    it and no span starts between (the furthest end so far is the end of the range being joined: a range only
    ends where the next object starts past it)."""
    starts, ends = objects[:, 0], objects[:, 1]
    reach = np.maximum.accumulate(ends)
    before, after = reach[:-1], starts[1:]
    gap = after.astype(np.int64) - before.astype(np.int64)
    i = np.searchsorted(span_starts, before)
    between = (i < len(span_starts)) & (span_starts[np.minimum(i, max(len(span_starts) - 1, 0))] < after) \
        if len(span_starts) else np.zeros(len(before), dtype=bool)
    first = np.concatenate(([0], np.flatnonzero((gap > JOIN) | between) + 1))
    last = np.append(first[1:] - 1, len(starts) - 1)
    return list(zip(starts[first].tolist(), reach[last].tolist()))


def _outside_spans(start: int, end: int, span_starts: np.ndarray, span_ends: np.ndarray) -> tuple[int, int]:
    """[START, END) cut back where a span begins in it or one it starts in ends (page rounding may reach one)."""
    i = int(np.searchsorted(span_starts, np.uint64(start), side="right")) - 1
    if i >= 0 and int(span_ends[i]) > start:
        start = int(span_ends[i])
    j = int(np.searchsorted(span_starts, np.uint64(start)))
    if j < len(span_starts) and int(span_starts[j]) < end:
        end = int(span_starts[j])
    return start, max(start, end)
