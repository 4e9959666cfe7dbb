"""Ranges of addresses [lo, hi): sorted and joined, cut by others, grouped into runs of adjacent ones."""

from __future__ import annotations

import bisect
from typing import Iterable

import numpy as np

__all__ = ["adjacent_runs", "merged", "merged_arrays", "ranges_without"]


def merged(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """RANGES sorted, with those that overlap or touch joined into one."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def adjacent_runs(lo: np.ndarray, hi: np.ndarray) -> list[tuple[int, int, int]]:
    """The ranges [LO[i], HI[i]) (uint64 arrays, never overlapping) as runs of adjacent ones, in address order: each
    run's start, end and how many ranges it is (an allocator's spans or extents, claimed a run at a time)."""
    if not len(lo):
        return []
    order = np.argsort(lo, kind="stable")
    starts, ends = lo[order], hi[order]
    firsts = np.flatnonzero(np.concatenate(([True], starts[1:] != ends[:-1])))
    lasts = np.concatenate((firsts[1:], [len(starts)])) - 1
    return list(zip(starts[firsts].tolist(), ends[lasts].tolist(), np.diff(np.append(firsts, len(starts))).tolist()))


def merged_arrays(lo: np.ndarray, hi: np.ndarray) -> list[tuple[int, int]]:
    """`merged` of the ranges [LO[i], HI[i]) (uint64 arrays), with array operations."""
    if not len(lo):
        return []
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(hi)
    first = np.flatnonzero(np.concatenate(([True], lo[1:] > reach[:-1])))
    last = np.append(first[1:] - 1, len(lo) - 1)
    return list(zip(lo[first].tolist(), reach[last].tolist()))


def ranges_without(regions: Iterable[tuple[int, int]], cut: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The pieces of REGIONS outside every range of CUT, in order."""
    cut = merged(cut)
    ends = [hi for _, hi in cut]
    out = []
    for start, end in regions:
        i = bisect.bisect_right(ends, start)            # the first range of CUT that ends past START
        while i < len(cut) and cut[i][0] < end and start < end:
            if cut[i][0] > start:
                out.append((start, cut[i][0]))
            start = max(start, cut[i][1])
            i += 1
        if start < end:
            out.append((start, end))
    return out
