"""The one pass's loops (`heapwalk.glibc.bulk.native`): the C library `pip install` builds is in use, and it
gives exactly what the Python fallback gives, on heaps of words and lists of links made to end in every way
they can, and a window's chunks gathered as numpy gathers them."""

from __future__ import annotations

import os
import random
from array import array

import numpy as np
import pytest

from heapwalk.glibc.bulk import indexlists, native
from heapwalk.glibc.model import BinKind, BinList


@pytest.fixture
def pure(monkeypatch):
    """The Python fallback, as when the library was not built."""
    monkeypatch.setattr(native, "_LIB", None)


def test_the_library_is_built_and_loaded():
    assert native.NATIVE or os.environ.get("HEAPWALK_PURE"), "make venv builds heapwalk/glibc/_native*.so"


def _words(rng: random.Random, n: int) -> np.ndarray:
    """N words where a chase from word 1 meets chunk sizes, then maybe a misaligned or too small one."""
    out = [rng.getrandbits(64) for _ in range(n)]
    j = 1
    while j < n:
        if rng.random() < 0.01:
            out[j] = rng.choice((0, 0x10, 0x19, 0x28, 0x1f, (1 << 64) - 1, 0x20))
            if out[j] != 0x20:
                break
        size = rng.choice((0x20, 0x30, 0x40, 0x90, 0x400, 0x1010)) | rng.randrange(8)
        out[j] = size
        j += size >> 3
    return np.array(out, dtype=np.uint64)


@pytest.mark.parametrize("seed", range(40))
def test_chase_steps_only_on_chunk_sizes(seed):
    rng = random.Random(seed)
    words = _words(rng, rng.choice((0, 1, 2, 5, 64, 3000)))
    found, stop = native.chase(words, rng.choice((0, 1, 3)), 32)
    assert all(int(words[j]) & 0xF == int(words[j]) & 7 and int(words[j]) >= 32 for j in found.tolist())
    assert stop >= len(words) or int(words[stop]) & 8 or int(words[stop]) < 32


def test_chase_stops_where_the_words_end_or_a_size_is_no_chunks(pure):
    words = np.array([0, 0x21, 0, 0, 0, 0x31, 0, 0, 0, 0, 0, 0x18], dtype=np.uint64)
    found, stop = native.chase(words, 1, 32)
    assert found.tolist() == [1, 5] and stop == 11
    found, stop = native.chase(words[:10], 1, 32)
    assert found.tolist() == [1, 5] and stop == 11


def _links(rng: random.Random, n: int) -> np.ndarray:
    """Successors of N chunks: some chains ending at -1, some loops, some pointing past the end."""
    out = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        r = rng.random()
        out[i] = -1 if r < 0.2 else rng.randrange(n) if r < 0.9 else n + rng.randrange(3)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_follow_is_the_same_in_c_and_python(seed, monkeypatch):
    rng = random.Random(seed)
    links = _links(rng, rng.choice((1, 2, 10, 500)))
    starts = [rng.randrange(len(links)) for _ in range(20)]
    bounds = [rng.choice((1, 2, 5, 1000)) for _ in starts]
    native_orders = [native.follow(native.successors(links), j, b) for j, b in zip(starts, bounds)]
    monkeypatch.setattr(native, "_LIB", None)
    for j, b, order in zip(starts, bounds, native_orders):
        python = native.follow(native.successors(links), j, b)
        assert (order is None) == (python is None)
        if order is not None:
            assert order.tolist() == python.tolist()


def test_follow_gives_up_at_a_loop_or_a_list_longer_than_its_bound(pure):
    links = native.successors(np.array([1, 2, -1, 3], dtype=np.int64))
    assert native.follow(links, 0, 3).tolist() == [0, 1, 2]
    assert native.follow(links, 0, 2) is None
    assert native.follow(links, 3, 100) is None


@pytest.mark.parametrize("seed", range(40))
def test_a_window_swept_in_one_c_loop_is_chased_and_gathered(seed):
    """`sweep_window` (the chase and the gather in one C loop, written in place) gives the chase's stop and the
    gather's chunks, or fails where the gather would: prev_size not the neighbour's size, no neighbour for a chunk
    whose PREV_INUSE is clear, the last chunk's fd and bk past the words."""
    from heapwalk.glibc.bulk.sweep import _gather
    rng = random.Random(seed)
    n = rng.choice((3, 40, 4000))
    words = [rng.getrandbits(64) for _ in range(n)]
    j, size = 1, None
    while j < n:
        new = rng.choice((0x20, 0x30, 0x90, 0x400)) | rng.choice((0, 1, 1, 1, 5))
        if rng.random() < 0.01:
            new = rng.choice((0x18, 0x28, 0x10))
        words[j] = new
        if not new & 1 and size is not None and rng.random() < 0.98:
            words[j - 1] = size
        size = new & ~7
        j += size >> 3
    words = np.array(words, dtype=np.uint64)
    for before in (-1, 0x20):
        for limit in (n, max(0, n - 3), rng.randrange(n + 1)):
            for first in (1, 2):
                found, stop = native.chase(words[:limit], first, 32)
                part = _gather(words, found, 0x10000, before) if len(found) else ()
                into = [np.full(limit // 4 + 3, 7, dtype=np.uint64) for _ in range(4)]
                at = rng.randrange(2)
                got, k = native.sweep_window(words, limit, first, 32, 0x10000, before, into, at)
                if part is None:
                    assert got == -1
                    continue
                assert (got, k) == (stop, len(found))
                assert all(column[at:at + k].tolist() == list(map(int, values)) for column, values in
                           zip(into, part or ((),) * 4))
                assert all(int(column[at + k]) == 7 and (not at or int(column[0]) == 7) for column in into)


@pytest.mark.parametrize("seed", range(30))
def test_free_runs_are_the_same_in_c_and_numpy(seed):
    """The runs of binned chunks (codes 2 or 3 to 5) of a stretch of chunks, their bytes and whether a fastbin
    chunk lies in each, in C and in numpy: runs at either end of the stretch, of one chunk, none at all."""
    from heapwalk.glibc.bulk.sweepwalk import _free_runs
    rng = random.Random(seed)
    n = rng.choice((0, 1, 2, 7, 500))
    codes = np.array([rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 255, 3, 4)) for _ in range(n)], dtype=np.uint8)
    sizes = np.array([rng.choice((0x20, 0x90, 0x1000, 0x5000)) for _ in range(n)], dtype=np.int64)
    for run_lo in (2, 3):
        for lo, hi in ((0, n), (min(n, 1), n), (0, max(0, n - 1)), (n // 3, n // 2)):
            c = native.free_runs(codes, sizes, lo, hi, run_lo, 6, 2)
            py = _free_runs(codes, sizes, lo, hi, run_lo)
            assert [a.tolist() for a in c] == [a.tolist() for a in py]
            assert all(run_lo <= codes[i] <= 5 for s, e in zip(c[0].tolist(), c[1].tolist()) for i in range(s, e))


def _swept_lists(rng: random.Random, n: int):
    """A `Sweep` of N chunks strung into a few doubly linked lists (some through a head outside the chunks,
    some ending at NULL), then damaged here and there: a link to the middle of a chunk, to a chunk of another
    list, a loop, a bk that does not lead back, a size out of range."""
    from heapwalk.glibc.bulk.sweep import Segment, Sweep, TAIL_NONE
    from heapwalk.glibc.walk.chunks import Extent
    steps = [0x1000] + [rng.choice((0x20, 0x30, 0x100, 0x100, 1 << 26 if rng.random() < 0.02 else 0x20))
                        for _ in range(n - 1)]
    address = np.cumsum(np.array(steps, dtype=np.uint64)).astype(np.uint64)
    cuts = [0] + [j for j in range(1, n) if steps[j] >= 1 << 26] + [n]     # one extent a heap, far apart
    segments = tuple(Segment(Extent(int(address[lo]), int(address[lo]), int(address[hi - 1]) + 0x100), lo, hi, 0,
                             TAIL_NONE) for lo, hi in zip(cuts, cuts[1:])) if rng.random() < 0.5 else ()
    field = np.array([rng.choice((0x20, 0x21, 0x30, 0x31, 0x100, 0x105, 0x28)) for _ in range(n)], dtype=np.uint64)
    fd, bk = np.zeros(n, dtype=np.uint64), np.zeros(n, dtype=np.uint64)
    members = list(range(n))
    rng.shuffle(members)
    heads = []
    for k in range(4):
        chain = members[k::4]
        if not chain:
            continue
        head = 0x10 * (k + 1) if k % 2 else 0
        for a, b in zip([None] + chain, chain + [None]):
            if a is not None:
                fd[a] = head if b is None else address[b]
            if b is not None:
                bk[b] = head if a is None else address[a]
        heads.append((int(address[chain[0]]), head, int(address[chain[-1]]) if head else head))
        for j in chain if k < 3 else ():     # a bin's chunks free, a fastbin's in use: as the next chunk says
            if j + 1 < n:
                field[j + 1] = field[j + 1] & ~np.uint64(1) if k == 1 else field[j + 1] | np.uint64(1)
    damaged = rng.randrange(4) if n > 1 else 0
    for _ in range(damaged):
        j = rng.randrange(n)
        fd[j], bk[j], field[j] = rng.choice(((fd[j] + np.uint64(8), bk[j], field[j]),
                                             (address[rng.randrange(n)], bk[j], field[j]),
                                             (address[j], bk[j], field[j]), (fd[j], np.uint64(0x99), field[j]),
                                             (fd[j], bk[j], np.uint64(0x5000))))
    return Sweep(address, field, fd, bk, segments), heads, damaged


@pytest.mark.parametrize("seed", range(60))
def test_a_list_is_followed_and_judged_the_same_in_c_and_numpy(seed, monkeypatch):
    """`indexlists._Walk.list`: the one C call (`native.walk_list`, its links looked up in a `ChunkDirectory` of
    one span or of one an extent; or `walk_linked`, with or without rulers) and the numpy steps give the same
    chunks, the same codes, and fail on the same lists, whatever damage the links, back links and sizes hold, and
    whichever chunks (free, in use, any) a list may hold."""
    rng = random.Random(seed)
    sweep, heads, damaged = _swept_lists(rng, rng.choice((1, 2, 7, 300)))
    bound = rng.choice((2, 50, 1000, 1000))
    top = (1 << 64) - 1
    calls = [(first, end, False, rng.choice((0x20, 0x20, 0x30)), rng.choice((0x30, 0x100, top, top)),
              rng.choice((head_bk, head_bk, None, head_bk + 16)), rng.choice((2, 3, 4)))
             for first, end, head_bk in heads]
    first, end, head_bk = heads[0]
    calls[0] = (first, end, False, 0x20, top, head_bk if end else None, 3)
    wants = [indexlists.ANY] + [rng.choice((indexlists.ANY, indexlists.FREE, indexlists.FREE, indexlists.IN_USE))
                                for _ in calls[1:]]
    planted = rng.randrange(sweep.count)
    results = []
    for way in ("linked", "ruled", "a lookup a hop", "numpy"):
        if way == "ruled":                   # the lists followed through rulers, of every place to every 64th
            monkeypatch.setattr(native, "RULED_FROM", 0)
            monkeypatch.setattr(native, "RULER_EVERY", rng.choice((1, 2, 3, 5, 64)))
        if way == "a lookup a hop":          # the bins' way on an arena of more chunks than `linked` takes
            monkeypatch.setattr(indexlists, "LINKED_MAX", 0)
        if way == "numpy":
            monkeypatch.setattr(native, "_LIB", None)
        walk = indexlists._Walk(sweep, min(bound, sweep.count + 1), bound)
        walk.codes[planted] = 9 if seed % 3 == 0 else indexlists.PLAIN
        outcome = []
        for want, args in zip(wants, calls):
            listed = walk.list(want, *args)
            outcome.append(None if listed is None else (listed[0].tolist(), listed[1].tolist()))
            if listed is None:
                break
        results.append((outcome, walk.codes.tolist() if outcome[-1] is not None else None))
    assert native.LISTS_NATIVE or os.environ.get("HEAPWALK_PURE")
    assert results[0] == results[1] == results[2] == results[3]
    if not damaged and seed % 3 and bound > sweep.count:
        assert results[0][0][0] is not None and len(results[0][0][0][0]) == len(range(sweep.count)[::4])


def test_a_lists_size_fields_are_kept_in_four_bytes_where_they_fit():
    """`BinList.raw_sizes` from the one pass: array('I') while every field is below 4 GiB, array('Q') once one is
    not; the same values, sums and sizes either way."""
    small = np.array([0x21, 0x31, 0x1005, 0xFFFFFFF1], dtype=np.uint64)
    big = np.append(small, np.uint64(0x100000001))
    for fields, code in ((small, "I"), (big, "Q"), (small[:0], "I")):
        raw = indexlists._fields(fields)
        assert raw.typecode == code and list(raw) == fields.tolist()
        b = BinList(BinKind.LARGE, 64, 0x1000, array("Q", [0x5000] * len(raw)), raw)
        assert b.raw_total == sum(fields.tolist()) and list(b.sizes) == [f & ~7 for f in fields.tolist()]


@pytest.mark.parametrize("use_c", (True, False))
def test_a_list_holds_only_the_chunks_its_bins_may(use_c, monkeypatch):
    """A bin holds free chunks (the next chunk's PREV_INUSE clear), a fastbin chunks in use: a list that reaches
    the other kind fails, at its first chunk or further on, in C and in numpy alike."""
    from heapwalk.glibc.bulk.sweep import Sweep
    if not use_c:
        monkeypatch.setattr(native, "_LIB", None)
    address = np.arange(0x1000, 0x1000 + 6 * 0x20, 0x20, dtype=np.uint64)
    field = np.array([0x21, 0x20, 0x21, 0x21, 0x20, 0x21], dtype=np.uint64)    # chunks 0 and 3 free
    fd = np.array([0x1060, 0, 0x1080, 0x10, 0, 0], dtype=np.uint64)         # 0 -> 3 -> head 0x10; 2 -> 4 -> NULL
    bk = np.array([0x10, 0, 0, 0x1000, 0x1040, 0], dtype=np.uint64)
    sweep = Sweep(address, field, fd, bk, ())

    def listed(want, first, end, head_bk):
        walk = indexlists._Walk(sweep, 7, 7)
        out = walk.list(want, first, end, False, 0x20, 0x20, head_bk, 4)
        return None if out is None else out[0].tolist()
    assert listed(indexlists.FREE, 0x1000, 0x10, 0x1060) == [0x1000, 0x1060]
    assert listed(indexlists.IN_USE, 0x1000, 0x10, 0x1060) is None            # its first chunk is free
    assert listed(indexlists.IN_USE, 0x1040, 0, None) == [0x1040, 0x1080]
    assert listed(indexlists.FREE, 0x1040, 0, None) is None
    fd[2] = 0x1060                                                          # in use, then a free chunk
    assert listed(indexlists.IN_USE, 0x1040, 0x10, None) is None
    assert listed(indexlists.ANY, 0x1040, 0x10, None) == [0x1040, 0x1060]


@pytest.mark.parametrize("seed", range(40))
def test_a_list_through_rulers_is_the_list_a_hop_at_a_time(seed):
    """`hw_linked_list` through `Rulers` follows the same places as a hop at a time, or fails where that does: lists
    of every length against STEPS, lists that meet (two places leading to one), that loop back on themselves (to
    a ruler or between two), or that run into a loop."""
    rng = random.Random(seed)
    m = rng.choice((1, 5, 40, 700, 3000))
    places = list(range(m))
    rng.shuffle(places)
    successor = np.full(m, -1, dtype=np.int32)
    cuts = sorted(rng.sample(range(1, m), min(m - 1, rng.randrange(0, 6)))) if m > 1 else []
    lists = [places[a:b] for a, b in zip([0] + cuts, cuts + [m])]
    for chain in lists:
        for a, b in zip(chain, chain[1:]):
            successor[a] = b
    for _ in range(rng.randrange(0, 4)):             # damage: a link anywhere, a loop back
        successor[rng.randrange(m)] = rng.randrange(m)
    every = rng.choice((1, 2, 3, 7, 64))
    rulers = native.Rulers.of(successor, every)
    starts = [chain[0] for chain in lists] + [rng.randrange(m) for _ in range(3)]
    for start in starts:
        for steps in (1, 2, 10, m // 2 + 1, m, m + 1):
            expected, r = [], start
            while True:                              # the plain loop's places, or None where it fails
                expected.append(r)
                r = int(successor[r])
                if r < 0:
                    break
                if len(expected) >= steps:
                    expected = None
                    break
            if expected is not None and len(set(expected)) < len(expected):
                expected = None                      # a place met twice: its code claimed already
            got = _followed(successor, start, steps, rulers)
            assert got == expected, (start, steps, every)
    if rulers is not None:
        assert int(rulers.length.sum()) <= 2 * m + len(rulers.length)


def _followed(successor: np.ndarray, start: int, steps: int, rulers) -> list[int] | None:
    """The places `hw_linked_list` follows from START (chunks made up so that every one passes its checks)."""
    m = len(successor)
    index = np.arange(m, dtype=np.int32)
    address = np.arange(m, dtype=np.uint64) * np.uint64(0x20) + np.uint64(0x1000)
    field = np.full(m, 0x20, dtype=np.uint64)
    fd = np.where(successor >= 0, address[np.maximum(successor, 0)], np.uint64(0)).astype(np.uint64)
    bk = np.zeros(m, dtype=np.uint64)
    codes = np.full(m, 255, dtype=np.uint8)
    order, out_address, out_field = (np.empty(steps + 1, dtype=t) for t in (np.int64, np.uint64, np.uint64))
    links = (successor, index, rulers)
    count = native.walk_linked(links, (address, field, fd, bk), -1, int(address[start]), 0, False, steps, 1 << 40,
                               0, 1 << 40, None, codes, 255, 3, (out_address, out_field, order))
    if count is None:
        return None
    return ((out_address[:count] - np.uint64(0x1000)) // np.uint64(0x20)).tolist()
