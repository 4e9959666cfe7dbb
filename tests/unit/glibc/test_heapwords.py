"""The leak scan from the words the one pass kept (`analysis.heapwords`) against the scan that reads the heaps
again, without gdb: on synthetic heaps whose chunks in use point at one another, with windows small enough that
big chunks run across them, both give the same graph, first words, root hits, reached blocks and paths."""

from __future__ import annotations

import random

import numpy as np
import pytest

from heapwalk.analysis import heapwords, lookup, reach
from heapwalk.analysis.heapwords import HeapWords
from heapwalk.glibc.bulk import sweep as sweep_module
from heapwalk.glibc.bulk.onepass import OnePass
from heapwalk.inferior.roots import Root
from heapwalk.common.view import Blocks

from test_sweep import ARENA, HEAP, _synth

ROOTS = 0x600000


def _used(s, words: HeapWords | None = None):
    one = OnePass(s.mem, s.layout, s.tcaches, 0, True, keep_used=True, words=words)
    assert one.lists(s.arena, s.mem.read(ARENA, s.layout.arena_size)) is not None
    assert one.results((s.arena,)) is not None
    return one.used[ARENA]


def _blocks(used, heap_end: int) -> Blocks:
    address, size = used
    return Blocks(address + np.uint64(16), address + size + np.uint64(8), np.zeros(len(address), dtype=np.int32),
                  16, 8, heaps=((HEAP, heap_end),))


def _pointers(s, used, rng: random.Random, heap_end: int) -> None:
    """Fills the user memory of every chunk in use with pointers into the heap (to chunk starts, into chunks,
    to free memory) and with words that point nowhere."""
    starts = [int(a) + 16 for a in used[0]]
    for address, size in zip(used[0].tolist(), used[1].tolist()):
        for at in range(address + 16, address + size + 8, 8):
            pick = rng.random()
            if pick < 0.004:
                value = rng.choice(starts) + 8 * rng.randrange(3)
            elif pick < 0.008:
                value = rng.randrange(HEAP, heap_end) & ~7
            else:
                value = rng.randrange(1 << 40)
            s.mem.write_u64(at, value)


@pytest.fixture(params=["c", "numpy"])
def loops(request, monkeypatch):
    """The words kept and looked up in C, then in numpy (as where the library was not built)."""
    if request.param == "numpy":
        monkeypatch.setattr(heapwords, "NATIVE", False)
        monkeypatch.setattr(lookup, "_LIB", None)
    return request.param


@pytest.mark.parametrize("window", [4 << 20, 64 << 10, 8 << 10])
@pytest.mark.parametrize("seed", range(3))
def test_the_kept_words_give_what_a_second_read_gives(seed, window, loops, monkeypatch):
    monkeypatch.setattr(sweep_module, "SPAN", window)
    monkeypatch.setattr(heapwords, "SLAB_ROWS", 1500 if seed == 1 else heapwords.SLAB_ROWS)   # many slabs
    s = _synth(seed, (2, 36), chunks=2000)
    heap_end = HEAP + s.arena.system_mem
    rng = random.Random(seed)
    used = _used(s)
    _pointers(s, used, rng, heap_end)
    roots = bytearray()
    for _ in range(50):
        roots += (int(rng.choice(used[0])) + 16).to_bytes(8, "little")
    s.mem.add(ROOTS, bytes(roots))
    words = HeapWords([(HEAP, heap_end), (ROOTS, ROOTS + 4096)])
    used = _used(s, words)
    blocks = _blocks(used, heap_end)
    covered = words.covered
    assert covered and covered[0][0] == HEAP and covered[-1][1] == heap_end
    assert len(covered) > 1 or window == 4 << 20    # big chunks ran across windows: their insides read again
    root = [Root(ROOTS, ROOTS + len(roots), "data", "synthetic")]
    once = reach.scan(s.mem, blocks, root, words=words)
    assert words.covered == [] and list(words.pairs()) == []      # given back: a second scan reads the heaps
    twice = reach.scan(s.mem, blocks, root)
    again = reach.scan(s.mem, blocks, root, words=words)
    for other in (twice, again):
        for name in ("reached", "parent", "first_words", "root_blocks", "root_words", "root_index"):
            assert np.array_equal(getattr(once, name), getattr(other, name)), name
        assert np.array_equal(once.graph.offsets, other.graph.offsets)
        assert np.array_equal(once.graph.targets, other.graph.targets)
    assert 0 < once.reached.sum() < blocks.count and len(once.graph.targets) > blocks.count


def test_slabs_keep_rows_where_they_are_written_and_drop_those_after_a_mark():
    slabs = heapwords.Slabs(rows=8)
    mark = slabs.mark()
    kept = []
    for n in (3, 5, 4, 20, 0, 2):
        a, b = slabs.room(n)
        a[:], b[:] = np.arange(n), np.arange(n) * 2
        kept.append(slabs.take(n))
    assert [len(a) for a, _ in kept] == [3, 5, 4, 20, 0, 2]
    assert all(np.array_equal(b, a * 2) and np.array_equal(a, np.arange(len(a))) for a, b in kept)
    assert len(slabs._slabs) == 4                    # 3 + 5; 4; 20 (a slab of its own) and 0; 2
    middle = slabs.mark()
    slabs.take(len(slabs.room(6)[0]))
    slabs.rewind(middle)
    assert slabs.mark() == middle
    slabs.rewind(mark)
    assert slabs.mark() == (1, 0)                    # all dropped; the first slab stays, to be written again


def test_words_kept_outside_the_spans_are_not_taken():
    """Values were kept only where the spans said heaps may be: a heap outside them is read again."""
    words = HeapWords([(0x1000, 0x2000)])
    assert words.holds([(0x1000, 0x1800)]) and not words.holds([(0x1000, 0x2800)])
    assert not words.holds([(0x3000, 0x3100)])


def test_an_abandoned_heap_and_a_gap_are_left_to_the_scan():
    words = HeapWords([(0x10000, 0x40000)])
    data = np.arange(0x10000, 0x10000 + 8 * 64, 8, dtype=np.uint64)
    words.begin()
    words.window(0x10000, data, np.array([2]), np.array([10]))
    words.abandon()
    assert words.covered == [] and list(words.pairs()) == []
    words.begin()
    words.window(0x10000, data, np.array([2, 20]), np.array([10, 64]))
    words.gap(0x10200, 0x10400)
    words.commit([(0x10000, 0x10800)])
    assert words.covered == [(0x10000, 0x10200), (0x10400, 0x10800)]
    (at, values), = list(words.pairs())
    assert len(at) == 8 + 44 and np.array_equal(at, values)
    assert [a for at, _ in words.firsts() for a in at.tolist()] == [0x10010, 0x100a0]


def test_the_pages_a_sweep_judged_answer_the_trims_question_and_the_rest_is_left_to_read():
    rng = np.random.default_rng(5)
    base = 0x7F0000001000 + 8                       # windows not page-aligned: their edge pages are not judged
    pages = 64
    words = np.zeros(512 * pages, dtype=np.uint64)
    busy = rng.random(pages) < 0.5
    for p in np.flatnonzero(busy):
        words[512 * p + rng.integers(0, 512)] = 1 + rng.integers(0, 1 << 40)
    kept = HeapWords([(base, base + 8 * len(words))], keep_words=False)
    for lo in range(0, len(words), 3000):          # windows of 3000 words, cut anywhere
        kept.window(base + 8 * lo, words[lo:lo + 3000], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
    first = 0x7F0000001000
    for ranges in ([(first, first + 4096 * pages)], [(first + 4096 * 3, first + 4096 * 9), (first + 4096 * 20, first + 4096 * 21)],
                   [(first + 4096 * 60, first + 4096 * 70)], []):
        known, unread = kept.nonzero_bytes(ranges)
        judged = [(lo, hi) for lo, hi in kept.pages_seen()[0]]
        for lo, hi in ranges:
            for page in range(lo, hi, 4096):
                inside = any(a <= page < b for a, b in judged)
                assert inside != any(a <= page < b for a, b in unread)
        expected = sum(4096 for lo, hi in ranges for page in range(lo, hi, 4096)
                       if any(a <= page < b for a, b in judged) and 0 <= (page - first) // 4096 < pages
                       and busy[(page - first) // 4096])
        assert known == expected
    assert kept.nonzero_bytes([(first, first + 4096 * pages)])[1]      # some edge pages were not judged
