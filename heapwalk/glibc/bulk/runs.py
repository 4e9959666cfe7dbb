"""A heap's chunks as the runs of its heap map's strip (`account.heapmap`), in the form the strip keeps: one
array of bounds in which each run ends where the next begins (a chunk, or what no chunk covers), with room
before it for the heap's header and after it for its tail, and a label for each run.

The one pass keeps each swept arena's chunks this way when a map is to be drawn (`OnePass`, keep_chunks): 8
bytes a chunk for its bound and 1 for its listing code, in place of its address, size and code, and the strip
then takes its bounds as views of these, so that a map holds each chunk once.
"""

from __future__ import annotations

import numpy as np

__all__ = ["HeapRuns", "tile", "swept_runs", "GAP", "FENCE_GAP"]

#: the labels `swept_runs` gives what no chunk covers (no listing code is either): bytes between chunks the
#: sweep met none in, and the header of the fencepost that closes an older heap (its last 16 bytes)
GAP, FENCE_GAP = 253, 254
#: bounds kept after a heap's chunks for its tail: where the part made writable ends, where the reservation ends
_TAIL_ROOM = 2


class HeapRuns:
    """One heap's runs: BOUNDS[1:m + 2] are the m runs' bounds from the heap's first chunk (FIRST) to the end of
    its chunks (END), LABELS their labels; BOUNDS[0] and the room after them are the header's and the tail's,
    filled by `strip`."""

    __slots__ = ("start", "first", "end", "bounds", "labels")

    def __init__(self, start: int, first: int, end: int, bounds: np.ndarray, labels: np.ndarray):
        self.start, self.first, self.end, self.bounds, self.labels = start, first, end, bounds, labels

    def strip(self, tail: list[tuple[int, int]], header_label: int, labels_of=None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The strip's runs: (run_starts, run_ends, labels), the two first views of BOUNDS (read-only): the header
        [start, first) labelled HEADER_LABEL, the runs (their labels through LABELS_OF, a table of 256, when
        given), then TAIL's (end, label) each from where the one before ends, at most two; runs of no bytes left
        out.  The room written is the same for the same tail, so strips made before stay as they were."""
        bounds, at = self.bounds, len(self.labels) + 1
        kept = []
        for end, label in tail:
            if end > int(bounds[at]):
                at += 1
                bounds[at] = end
                kept.append(label)
        if len(kept) > _TAIL_ROOM:
            raise ValueError("a heap's tail has more runs than its room")
        bounds[0] = self.start
        lo = 0 if self.start < self.first else 1
        labels = np.empty(at - lo, dtype=np.uint8)
        labels[:1 - lo] = header_label
        middle = self.labels if labels_of is None else labels_of[self.labels]
        labels[1 - lo:1 - lo + len(middle)] = middle
        labels[1 - lo + len(middle):] = kept
        starts, ends = bounds[lo:at], bounds[lo + 1:at + 1]
        starts.flags.writeable = ends.flags.writeable = False
        return starts, ends, labels


def tile(start: int, first: int, end: int, starts: np.ndarray, stops: np.ndarray, labels: np.ndarray,
         gap: int, fence_gap: int, fence: int) -> HeapRuns:
    """The runs of a heap whose header is [START, FIRST) and whose chunks end at END: its chunks [STARTS, STOPS)
    (sorted, uint64, each of LABELS) clipped to [FIRST, END), each cut short where the next begins (damage), and
    what no chunk covers between them labelled GAP, or FENCE_GAP when it is the last 16 bytes or fewer after a
    chunk labelled FENCE (the header of the fencepost that closes an older heap)."""
    first_, end_ = np.uint64(first), np.uint64(end)
    starts = np.clip(starts, first_, end_).astype(np.uint64, copy=False)
    stops = np.clip(stops, first_, end_).astype(np.uint64, copy=False)
    keep = stops > starts
    if not keep.all():
        starts, stops, labels = starts[keep], stops[keep], labels[keep]
    n = len(starts)
    if n > 1:
        stops[:-1] = np.minimum(stops[:-1], starts[1:])
    if n and int(starts[0]) == first and bool(np.array_equal(stops[:-1], starts[1:])):
        return _abutting(start, first, end, starts, int(stops[-1]), labels, gap, fence_gap, fence)
    # gap, chunk, gap, ..., chunk, gap: those of no bytes left out
    gap_starts = np.concatenate(([first_], stops))
    gap_ends = np.concatenate((starts, [end_]))
    gap_labels = np.full(n + 1, gap, dtype=np.uint8)
    if n and int(labels[-1]) == fence and int(gap_ends[-1] - gap_starts[-1]) <= 16:
        gap_labels[-1] = fence_gap
    all_starts = np.empty(2 * n + 1, dtype=np.uint64)
    all_starts[0::2], all_starts[1::2] = gap_starts, starts
    all_labels = np.empty(2 * n + 1, dtype=np.uint8)
    all_labels[0::2], all_labels[1::2] = gap_labels, labels
    all_ends = np.empty(2 * n + 1, dtype=np.uint64)
    all_ends[0::2], all_ends[1::2] = gap_ends, stops
    keep = all_ends > all_starts
    m = int(keep.sum())
    bounds = np.empty(m + 2 + _TAIL_ROOM, dtype=np.uint64)
    bounds[1:m + 1] = all_starts[keep]
    bounds[m + 1] = end
    return HeapRuns(start, first, end, bounds, all_labels[keep])


def _abutting(start: int, first: int, end: int, starts: np.ndarray, stop: int, labels: np.ndarray, gap: int,
              fence_gap: int, fence: int) -> HeapRuns:
    """`tile`'s runs where its chunks abut from FIRST, each (at STARTS, sorted) ending where the next begins and the
    last at STOP: the bounds are the starts, then STOP, then END where a gap (GAP, or FENCE_GAP) ends the heap."""
    n, last_gap = len(starts), end - stop
    bounds = np.empty(n + 2 + (last_gap > 0) + _TAIL_ROOM, dtype=np.uint64)
    bounds[1:n + 1] = starts
    bounds[n + 1] = stop
    out = np.array(labels, dtype=np.uint8)     # a copy: a view would keep the whole sweep's codes
    if last_gap:
        bounds[n + 2] = end
        out = np.append(out, fence_gap if last_gap <= 16 and int(out[-1]) == fence else gap).astype(np.uint8)
    return HeapRuns(start, first, end, bounds, out)


#: chunks `_sound` judges at a time (what it makes meanwhile: a few bytes a chunk of them)
_STEP = 1 << 16


def _sound(first: int, end: int, starts: np.ndarray, sizes: np.ndarray) -> bool:
    """Whether the chunks at STARTS (uint64, sorted) of SIZES (uint64) lie in [FIRST, END], the first at FIRST, each
    of some bytes and reaching the next one's start (or past it: `tile` cuts it short there), judged `_STEP`
    chunks at a time: `tile`'s runs are then `_abutting`'s, made without an array of a chunk each."""
    n = len(starts)
    if not n or int(starts[0]) != first:
        return False
    lo, hi = np.uint64(first), np.uint64(end)
    for at in range(0, n, _STEP):
        here = starts[at:at + _STEP]
        stops = here + sizes[at:at + _STEP]
        following = starts[at + 1:at + 1 + _STEP]
        if not (bool((stops > here).all()) and bool((stops <= hi).all()) and
                bool((stops[:len(following)] >= following).all()) and bool((here >= lo).all())):
            return False
    return True


def swept_runs(address: np.ndarray, sizes: np.ndarray, codes: np.ndarray, segments, fence: int
               ) -> dict[int, HeapRuns]:
    """A sweep's chunks (ADDRESS, SIZES, CODES their listing codes, SEGMENTS its `Segment`s) as each heap's runs,
    by the heap's start; FENCE the code of a fencepost."""
    out = {}
    for s in segments:
        e = s.extent
        starts, sized = address[s.lo:s.hi], sizes[s.lo:s.hi].view(np.uint64)
        if _sound(e.first, e.end, starts, sized):
            out[e.start] = _abutting(e.start, e.first, e.end, starts, int(starts[-1]) + int(sized[-1]),
                                     codes[s.lo:s.hi], GAP, FENCE_GAP, fence)
        else:
            out[e.start] = tile(e.start, e.first, e.end, starts, starts + sized, codes[s.lo:s.hi], GAP, FENCE_GAP,
                                fence)
    return out
