"""The leak scan on a glibc heap the one pass swept, without gdb: the scan that keeps only the rows of blocks not
reached when their words are read (`analysis.rows`, what `report` and `leaks` run) against the one that keeps
every row and path (`heapwalk chunk`'s) and against numpy's; on synthetic heaps whose chunks in use point at one
another, read in windows small enough that big chunks run across them: the same reached blocks, first words,
root hits and leaked blocks' rows.  And the pages a sweep judged (`analysis.pages`)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from heapwalk.analysis import graph as graph_module, lookup, reach, rows as rows_module
from heapwalk.analysis.leaks import find_leaks
from heapwalk.analysis.pages import PagesSeen
from heapwalk.glibc.bulk.onepass import OnePass
from heapwalk.inferior.roots import Root
from heapwalk.common.view import Blocks

from test_sweep import ARENA, HEAP, _synth

ROOTS = 0x600000


def _used(s):
    one = OnePass(s.mem, s.layout, s.tcaches, 0, True, keep_used=True)
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


def _leaked_rows(lk) -> dict[int, list[int]]:
    """Each leaked block's row (its edges' targets, in order)."""
    sources, targets = lk.reach.graph.rows_of(lk.leaked)
    out: dict[int, list[int]] = {int(b): [] for b in lk.leaked}
    for s_, t in zip(sources.tolist(), targets.tolist()):
        out[s_].append(t)
    return out


@pytest.mark.parametrize("window", [4 << 20, 64 << 10, 8 << 10])
@pytest.mark.parametrize("seed", range(3))
def test_the_deferred_rows_reach_what_every_row_reaches(seed, window, monkeypatch):
    monkeypatch.setattr(reach, "WINDOW", window)
    monkeypatch.setattr(rows_module, "SLAB", 700 if seed == 1 else rows_module.SLAB)   # many slabs
    s = _synth(seed, (2, 36), chunks=2000)
    heap_end = HEAP + s.arena.system_mem
    rng = random.Random(seed)
    used = _used(s)
    _pointers(s, used, rng, heap_end)
    roots = bytearray()
    for _ in range(30 if seed else 3):
        roots += (int(rng.choice(used[0])) + 16).to_bytes(8, "little")
    s.mem.add(ROOTS, bytes(roots))
    blocks = _blocks(used, heap_end)
    root = [Root(ROOTS, ROOTS + len(roots), "data", "synthetic")]
    deferred = find_leaks(reach.scan(s.mem, blocks, root))
    every = find_leaks(reach.scan(s.mem, blocks, root, paths=True))
    assert deferred.reach.parent is None and every.reach.parent is not None
    assert len(deferred.reach.graph.targets) < len(every.reach.graph.targets)    # the reached keep no rows
    monkeypatch.setattr(lookup, "_LIB", None)
    monkeypatch.setattr(graph_module, "_LIB", None)
    monkeypatch.setattr(rows_module, "_LIB", None)
    plain = find_leaks(reach.scan(s.mem, blocks, root))
    plain_paths = reach.scan(s.mem, blocks, root, paths=True)
    for name in ("reached", "root_blocks", "root_index", "root_words"):
        assert np.array_equal(getattr(every.reach, name), getattr(plain_paths, name)), name
    assert deferred.reach.hit_root is None and deferred.reach.hit_word is None
    for other in (every, plain):
        assert np.array_equal(deferred.reach.reached, other.reach.reached)
        each = np.arange(blocks.count)
        assert np.array_equal(deferred.reach.signed.of(each), other.reach.signed.of(each))
        for name in ("leaked", "unreferenced", "holds_count", "holds_bytes"):
            assert np.array_equal(getattr(deferred, name), getattr(other, name)), name
        assert (deferred.in_rings, deferred.in_rings_bytes) == (other.in_rings, other.in_rings_bytes)
        assert _leaked_rows(deferred) == _leaked_rows(other)
    assert 0 < deferred.reach.reached.sum() < blocks.count and len(deferred.leaked) > 1
    for b in np.flatnonzero(every.reach.reached)[:50].tolist():     # every path runs along edges from a root
        path = every.reach.path(b)
        assert path[-1] == b and every.reach.hit_root[path[0]] >= 0
        g = every.reach.graph
        assert all(t in g.rows_of(np.array([f]))[1].tolist() for f, t in zip(path, path[1:]))
    with pytest.raises(ValueError):
        deferred.reach.path(int(np.flatnonzero(deferred.reach.reached)[0]))
    with pytest.raises(ValueError):
        deferred.reach.root_words


def test_the_pages_a_sweep_judged_answer_the_trims_question_and_the_rest_is_left_to_read():
    rng = np.random.default_rng(5)
    base = 0x7F0000001000 + 8                       # windows not page-aligned: their edge pages are not judged
    pages = 64
    words = np.zeros(512 * pages, dtype=np.uint64)
    busy = rng.random(pages) < 0.5
    for p in np.flatnonzero(busy):
        words[512 * p + rng.integers(0, 512)] = 1 + rng.integers(0, 1 << 40)
    kept = PagesSeen()
    for lo in range(0, len(words), 3000):          # windows of 3000 words, cut anywhere
        kept.note(base + 8 * lo, words[lo:lo + 3000])
    first = 0x7F0000001000
    for ranges in ([(first, first + 4096 * pages)], [(first + 4096 * 3, first + 4096 * 9), (first + 4096 * 20, first + 4096 * 21)],
                   [(first + 4096 * 60, first + 4096 * 70)], []):
        known, unread = kept.nonzero_bytes(ranges)
        judged = [(lo, hi) for lo, hi in kept.seen()[0]]
        for lo, hi in ranges:
            for page in range(lo, hi, 4096):
                inside = any(a <= page < b for a, b in judged)
                assert inside != any(a <= page < b for a, b in unread)
        expected = sum(4096 for lo, hi in ranges for page in range(lo, hi, 4096)
                       if any(a <= page < b for a, b in judged) and 0 <= (page - first) // 4096 < pages
                       and busy[(page - first) // 4096])
        assert known == expected
    assert kept.nonzero_bytes([(first, first + 4096 * pages)])[1]      # some edge pages were not judged
