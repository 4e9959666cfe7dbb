"""A heap's runs as the strip keeps them (`bulk.runs`): bounds shared by a run's end and the next one's start,
the same runs as cutting the heap by hand, whatever the chunks' gaps and overlaps."""

from __future__ import annotations

import random

import numpy as np
import pytest

import heapwalk.glibc.bulk.runs as runs_module
from heapwalk.glibc.bulk.runs import FENCE_GAP, GAP, swept_runs, tile
from heapwalk.glibc.bulk.sweep import Segment
from heapwalk.glibc.walk.chunks import Extent

HEADER, FENCE, UNUSED, RESERVED = 100, 7, 101, 102


def _by_hand(start, first, end, chunks, tail):
    """The runs of a heap cut byte range by byte range: header, each chunk clipped and cut short where the next
    begins, what lies between labelled GAP (FENCE_GAP for 16 bytes or fewer after a last chunk labelled FENCE),
    then the tail; runs of no bytes left out."""
    runs = [(start, first, HEADER)]
    at = first
    clipped = [(min(max(a, first), end), min(max(b, first), end), k) for a, b, k in chunks]
    clipped = [c for c in clipped if c[1] > c[0]]
    for i, (a, b, k) in enumerate(clipped):
        if i + 1 < len(clipped):
            b = min(b, clipped[i + 1][0])
        runs.append((at, a, GAP))
        runs.append((a, b, k))
        at = b
    last = GAP
    if clipped and clipped[-1][2] == FENCE and end - at <= 16:
        last = FENCE_GAP
    runs.append((at, end, last))
    for stop, label in tail:
        runs.append((runs[-1][1] if runs[-1][1] >= end else end, stop, label))
    out, reach = [], start
    for a, b, k in runs:
        a = max(a, reach)
        if b > a:
            out.append((a, b, k))
            reach = b
    return out


def _strip_runs(runs, tail):
    starts, ends, labels = runs.strip(tail, HEADER)
    return list(zip(starts.tolist(), ends.tolist(), labels.tolist()))


@pytest.mark.parametrize("seed", range(40))
def test_runs_are_the_heap_cut_by_hand(seed):
    rng = random.Random(seed)
    start = 0x10000
    first = start + rng.choice([0, 0x10, 0x90])
    chunks, at = [], first + rng.choice([0, 0, 0x20])
    for _ in range(rng.randrange(0, 30)):
        size = rng.choice([0x20, 0x30, 0x100])
        if rng.random() < 0.1:
            at += rng.choice([0x10, 0x40])                    # a gap
        if rng.random() < 0.05 and chunks:
            at -= 0x10                                        # an overlap
        chunks.append((at, at + size, rng.choice([1, 2, 255, FENCE])))
        at += size
    end = at + rng.choice([0, 0, 0x10, 0x30]) if rng.random() < 0.9 else max(first, at - 0x10)
    writable = end + rng.choice([0, 0x1000])
    limit = writable + rng.choice([0, 0x4000])
    starts = np.array([c[0] for c in chunks], dtype=np.uint64)
    stops = np.array([c[1] for c in chunks], dtype=np.uint64)
    labels = np.array([c[2] for c in chunks], dtype=np.uint8)
    runs = tile(start, first, end, starts, stops, labels, GAP, FENCE_GAP, FENCE)
    plain = [(writable, UNUSED), (writable, RESERVED)]
    whole = [(writable, UNUSED), (limit, RESERVED)]
    assert _strip_runs(runs, plain) == _by_hand(start, first, end, chunks, plain)
    assert _strip_runs(runs, whole) == _by_hand(start, first, end, chunks, whole)
    again = runs.strip(plain, HEADER)              # a strip made before stays as it was
    runs.strip(whole, HEADER)
    assert list(zip(again[0].tolist(), again[1].tolist(), again[2].tolist())) == _by_hand(start, first, end, chunks,
                                                                                          plain)


def test_a_strips_bounds_are_shared_and_read_only():
    runs = tile(0x1000, 0x1010, 0x1070, np.array([0x1010, 0x1030], np.uint64), np.array([0x1030, 0x1070], np.uint64),
                np.array([1, 255], np.uint8), GAP, FENCE_GAP, FENCE)
    starts, ends, labels = runs.strip([(0x2000, UNUSED)], HEADER)
    assert starts.tolist() == [0x1000, 0x1010, 0x1030, 0x1070] and ends.tolist() == [0x1010, 0x1030, 0x1070, 0x2000]
    assert labels.tolist() == [HEADER, 1, 255, UNUSED]
    assert np.shares_memory(starts, ends) and not starts.flags.writeable and not ends.flags.writeable
    with pytest.raises(ValueError):
        starts[0] = 0


def test_swept_runs_per_segment():
    """Each swept heap's runs from its segment's rows; an old heap's fencepost header after its last chunk is
    the fencepost's."""
    address = np.array([0x1010, 0x1030, 0x2010, 0x2040], dtype=np.uint64)
    sizes = np.array([0x20, 0x20, 0x30, 0x10], dtype=np.int64)
    codes = np.array([255, 3, 255, FENCE], dtype=np.uint8)
    segments = (Segment(Extent(0x1000, 0x1010, 0x1050), 0, 2, 0, 0), Segment(Extent(0x2000, 0x2010, 0x2060), 2, 4,
                                                                           16, 1))
    runs = swept_runs(address, sizes, codes, segments, FENCE)
    assert _strip_runs(runs[0x1000], []) == [(0x1000, 0x1010, HEADER), (0x1010, 0x1030, 255), (0x1030, 0x1050, 3)]
    assert _strip_runs(runs[0x2000], [(0x3000, UNUSED)]) == [
        (0x2000, 0x2010, HEADER), (0x2010, 0x2040, 255), (0x2040, 0x2050, FENCE), (0x2050, 0x2060, FENCE_GAP),
        (0x2060, 0x3000, UNUSED)]


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("step", [1, 3, 1 << 16])
def test_swept_runs_are_tiles_runs(seed, step, monkeypatch):
    """A segment's runs judged a step at a time (`runs._sound`, then `_abutting`) are `tile`'s of the same chunks:
    sound chunks, and each kind of damage that makes `tile` cut them otherwise (a gap, an overlap, a chunk of no
    bytes or of a size that wraps, one before the heap's first chunk or past its end)."""
    monkeypatch.setattr(runs_module, "_STEP", step)
    rng = random.Random(seed)
    first = 0x10010
    chunks, at = [], first
    for _ in range(rng.randrange(1, 25)):
        size = rng.choice([0x20, 0x30, 0x100])
        chunks.append([at, size])
        at += size
    end = at + rng.choice([0, 0x10, 0x30])
    damage = rng.choice(["none", "none", "gap", "overlap", "zero", "wrap", "before", "past"])
    k = rng.randrange(len(chunks))
    if damage == "gap" and k + 1 < len(chunks):
        chunks[k][1] -= 0x10
    elif damage == "overlap" and k + 1 < len(chunks):
        chunks[k][1] += 0x10
    elif damage == "zero":
        chunks[k][1] = 0
    elif damage == "wrap":
        chunks[k][1] = (1 << 64) - 0x10
    elif damage == "before":
        chunks[0][0] -= 0x10
    elif damage == "past":
        chunks[-1][1] += 0x40
    address = np.array([c[0] for c in chunks], dtype=np.uint64)
    sizes = np.array([c[1] for c in chunks], dtype=np.uint64).view(np.int64)
    codes = np.array([rng.choice([1, 2, 255, FENCE]) for _ in chunks], dtype=np.uint8)
    segment = Segment(Extent(0x10000, first, end), 0, len(chunks), 0, 0)
    got = swept_runs(address, sizes, codes, (segment,), FENCE)[0x10000]
    want = tile(0x10000, first, end, address.copy(), address + sizes.view(np.uint64), codes, GAP, FENCE_GAP, FENCE)
    tail = [(end + 0x1000, UNUSED)]
    assert _strip_runs(got, tail) == _strip_runs(want, tail)
    assert not np.shares_memory(got.labels, codes)        # the sweep's codes are not kept alive by a view
