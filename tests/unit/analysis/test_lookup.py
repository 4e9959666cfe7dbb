"""The leak scan's lookup of words among blocks (`analysis.lookup`): the C table and numpy's search give the
same block for every word, on blocks packed tight, spread over far-apart stretches, and at their edges."""

from __future__ import annotations

import numpy as np
import pytest

from heapwalk.analysis import lookup, tally
from heapwalk.analysis.lookup import Locator
from heapwalk.analysis import rows as rows_module
from heapwalk.analysis.rows import Rows
from heapwalk.common.view import Blocks, TagRuns, retagged, tags_held


def _blocks(rng: np.random.Generator, count: int, stretches: int) -> tuple[np.ndarray, np.ndarray]:
    """COUNT blocks in STRETCHES groups far apart, each block 16 to 4 KiB, with gaps of 0 to 64 bytes between."""
    sizes = rng.integers(1, 256, count).astype(np.uint64) * np.uint64(16)
    gaps = rng.integers(0, 5, count).astype(np.uint64) * np.uint64(16)
    jumps = np.zeros(count, dtype=np.uint64)
    jumps[rng.choice(count, stretches - 1, replace=False)] = np.uint64(1 << 32)
    starts = np.uint64(0x555555550000) + np.cumsum(sizes + gaps + jumps) - sizes
    return starts, starts + sizes


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("stretches", [1, 3, 40])
def test_the_table_and_the_search_agree(stretches, overlap):
    """Also where damage made blocks overlap: a word is in the last block starting at or below it, if inside it
    (a block running past the next one's start must not be taken for a gap, nor its end for the stretch's)."""
    rng = np.random.default_rng(stretches)
    starts, ends = _blocks(rng, 20_000, stretches)
    if overlap:
        ends[::5] += np.uint64(5000)
        ends[7] = starts[7] - np.uint64(16)      # an end below its start: a block of nothing
    values = np.concatenate([
        starts, ends, ends - np.uint64(1), starts - np.uint64(8),
        rng.integers(int(starts[0]) - 4096, int(ends[-1]) + 4096, 50_000, dtype=np.uint64),
        starts[rng.integers(0, len(starts), 200_000)] + rng.integers(0, 4200, 200_000).astype(np.uint64)
        - np.uint64(64),
        np.array([0, 1, (1 << 64) - 1], dtype=np.uint64)])
    table = Locator(starts, ends)
    assert table._table is not None or not lookup.NATIVE
    found = table(values)
    expected = table._numpy(values)
    assert np.array_equal(found, expected)
    assert np.array_equal(found[:len(starts)], np.arange(len(starts))) or overlap
    assert (found[len(starts):2 * len(starts)] != np.arange(len(starts))).all() or overlap
    assert (expected >= 0).sum() > 150_000
    ordered = np.sort(values)
    for part in (ordered, ordered[len(ordered) // 2:], ordered[:0]):
        assert np.array_equal(table.ascending(part), table._numpy(part))


def test_no_blocks_points_nowhere():
    table = Locator(np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64))
    assert table(np.array([0, 5, 1 << 40], dtype=np.uint64)).tolist() == [-1, -1, -1]


def test_the_table_holds_about_two_slots_a_block():
    rng = np.random.default_rng(5)
    starts, ends = _blocks(rng, 50_000, 4)
    table = Locator(starts, ends)._table
    assert len(table[3]) <= 4 * 50_000 + 4 if lookup.NATIVE else table is None


def test_each_blocks_first_root_word_is_kept_in_c_as_in_numpy(monkeypatch):
    rng = np.random.default_rng(9)
    parts = [(rng.integers(0, 5000, n).astype(np.int32), rng.integers(0, 1 << 40, n).astype(np.uint64), root)
             for root, n in enumerate((40_000, 1, 0, 60_000))]
    expected: dict[int, tuple[int, int]] = {}
    for block, words, root in parts:
        for b, w in zip(block.tolist(), words.tolist()):
            expected.setdefault(b, (w, root))
    keys = sorted(expected)
    for lib in (lookup._LIB, None):
        monkeypatch.setattr(lookup, "_LIB", lib)
        hits = lookup.FirstHits(5000)
        for block, words, root in parts:
            hits.add(block, words, root)
        assert np.flatnonzero(hits.root >= 0).tolist() == keys
        assert list(zip(hits.word[keys].tolist(), hits.root[keys].tolist())) == [expected[k] for k in keys]


def test_edges_join_a_words_block_and_the_block_it_points_into_in_c_as_in_numpy(monkeypatch):
    rng = np.random.default_rng(11)
    starts = np.cumsum(rng.integers(32, 200, 3000)).astype(np.uint64) + np.uint64(1 << 30)
    ends = starts + rng.integers(8, 32, 3000).astype(np.uint64)
    at = np.sort(rng.integers(int(starts[0]) - 100, int(ends[-1]) + 100, 20_000).astype(np.uint64))
    values = np.where(rng.random(20_000) < 0.7, rng.choice(starts, 20_000), rng.integers(0, 1 << 31, 20_000)
                      ).astype(np.uint64)
    found = lookup.Locator(starts, ends)
    source, target = found.ascending(at), found(values)
    ok = (source >= 0) & (target >= 0) & (source != target)
    for lib in (lookup._LIB, None):
        monkeypatch.setattr(lookup, "_LIB", lib)
        got = lookup.Locator(starts, ends).edges_inside(at, values)
        assert got[0].tolist() == source[ok].tolist() and got[1].tolist() == target[ok].tolist()
    assert ok.sum() > 1000


@pytest.mark.parametrize("overlap", [False, True])
def test_a_windows_edges_are_those_of_its_words_inside_blocks_in_c_as_in_numpy(overlap, monkeypatch):
    """A word is in the last block starting at or below it, when inside it; blocks overlap only where damage made
    them (some here run past the next ones' starts, one starts where another does).  The C pass (`window_rows`)
    keeps the same edges as rows, or, deferring, passes the mark of a block already reached on at once, whatever
    the words it judges at a time (`rows.BATCH`)."""
    rng = np.random.default_rng(12)
    starts = np.cumsum(rng.integers(32, 200, 3000)).astype(np.uint64) + np.uint64(1 << 30)
    ends = starts + rng.integers(8, 32, 3000).astype(np.uint64) // np.uint64(8) * np.uint64(8)
    if overlap:
        ends[::7] += np.uint64(600)
        starts[101] = starts[100]
    base = int(starts[0]) - 800
    words = np.where(rng.random(40_000) < 0.6, rng.choice(starts, 40_000) + np.uint64(8),
                     rng.integers(0, 1 << 32, 40_000)).astype(np.uint64)
    at = np.uint64(base) + np.arange(40_000, dtype=np.uint64) * np.uint64(8)
    found = lookup.Locator(starts, ends)
    source, target = found.ascending(at), found(words)
    ok = (source >= 0) & (target >= 0) & (source != target)
    got = lookup.Locator(starts, ends).window_edges(base, words)
    assert got[0].tolist() == source[ok].tolist() and got[1].tolist() == target[ok].tolist()
    assert ok.sum() > 1000
    if not lookup.NATIVE:
        return
    n, locate = len(starts), lookup.Locator(starts, ends)
    for defer, cut, batch in ((False, None, rows_module.BATCH), (True, None, 7), (False, 12_345, 1000),
                              (True, 20_000, 1)):
        monkeypatch.setattr(rows_module, "BATCH", batch)
        seen = (rng.random(n) < 0.3).astype(np.uint8)
        before = seen.copy()
        rows = Rows(n, defer)
        parts = [(base, words)] if cut is None else [(base, words[:cut]), (base + 8 * cut, words[cut:])]
        for at, part in parts:               # a window cut in two: a block's row goes on in the second
            rows.window(locate, at, part, seen)
        kept = rows.rows()
        marked = np.zeros(n, dtype=bool)
        kept_source, kept_target = [], []
        for a, b in zip(source[ok].tolist(), target[ok].tolist()):   # in the words' order, as the pass judges them
            if defer and (before[a] or marked[a]):
                marked[b] = True
            else:
                kept_source.append(a)
                kept_target.append(b)
        assert [x.tolist() for x in kept.edges()] == [kept_source, kept_target]
        assert np.all(np.diff(kept.keys) > 0) and np.all(np.diff(kept.starts) > 0)
        assert np.array_equal(seen.astype(bool), before.astype(bool) | marked)


def test_a_roots_window_keeps_each_blocks_first_word_pointing_into_it_in_c_as_in_numpy(monkeypatch):
    rng = np.random.default_rng(13)
    starts = np.cumsum(rng.integers(32, 200, 3000)).astype(np.uint64) + np.uint64(1 << 30)
    ends = starts + rng.integers(8, 32, 3000).astype(np.uint64)
    windows = [(0x7000_0000 + 0x10_0000 * k, np.where(rng.random(n) < 0.5, rng.choice(starts[:2000], n) + np.uint64(4),
                                                      rng.integers(0, 1 << 32, n)).astype(np.uint64))
               for k, n in enumerate((30_000, 0, 1, 50_000))]
    found = lookup.Locator(starts, ends)
    expected: dict[int, tuple[int, int]] = {}
    for root, (base, words) in enumerate(windows):
        for k, block in enumerate(found(words).tolist()):
            if block >= 0:
                expected.setdefault(block, (base + 8 * k, root))
    keys = sorted(expected)
    for lib in (lookup._LIB, None):
        monkeypatch.setattr(lookup, "_LIB", lib)
        table, hits = lookup.Locator(starts, ends), lookup.FirstHits(len(starts))
        for root, (base, words) in enumerate(windows):
            table.root_hits(base, words, root, hits)
        assert np.flatnonzero(hits.root >= 0).tolist() == keys
        assert list(zip(hits.word[keys].tolist(), hits.root[keys].tolist())) == [expected[k] for k in keys]
        seen = np.zeros(len(starts), dtype=np.uint8)     # only which blocks a root points into, as report keeps
        marks = lookup.FirstHits(len(starts), seen)
        for root, (base, words) in enumerate(windows):
            table.root_hits(base, words, root, marks)
        marks.add(np.array([keys[0], 2999], dtype=np.int32), np.array([8, 16], dtype=np.uint64), 9)
        assert np.flatnonzero(seen).tolist() == sorted({*keys, 2999}) and marks.root is None and marks.word is None
    assert 1000 < len(keys) <= 2000


def _merged_by_sorting(a, b, excluded):
    """What `jemalloc.blocks._sorted` makes of two runs: joined, sorted (stable), less the excluded starts."""
    from heapwalk.jemalloc.blocks import _without
    start, end, arena = (np.concatenate([x, y]) for x, y in zip(a, b))
    order = np.argsort(start, kind="stable")
    keep = _without(start[order], excluded)
    return start[order][keep], end[order][keep], arena[order][keep]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_runs_of_blocks_merge_in_c_as_sorting_them_does(seed):
    """jemalloc's slab regions and large allocations, each already in address order, merged without sorting, the
    thread caches' regions (and addresses that are no block's) left out: the same blocks as sorting them all."""
    rng = np.random.default_rng(seed)
    starts = np.unique(rng.integers(1 << 20, 1 << 40, 60_000).astype(np.uint64) & ~np.uint64(15))
    mine = rng.random(len(starts)) < 0.9
    runs = []
    for chosen in (mine, ~mine):
        s = starts[chosen]
        runs.append((s, s + np.uint64(16), rng.integers(0, 8, len(s)).astype(np.int32)))
    excluded = np.unique(np.concatenate([rng.choice(starts, 500), rng.integers(0, 1 << 40, 50).astype(np.uint64)]))
    got = lookup.merge_blocks(runs[0], runs[1], excluded)
    if not lookup.NATIVE:
        assert got is None
        return
    want = _merged_by_sorting(runs[0], runs[1], excluded)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert len(got[0]) == len(starts) - len(np.intersect1d(excluded, starts)) < len(starts)


def test_runs_of_blocks_that_damage_made_overlap_are_left_to_the_sort():
    """A run out of order, or one start in both runs: no merge (the caller sorts, as it always did)."""
    one = lambda *s: (np.array(s, dtype=np.uint64), np.array(s, dtype=np.uint64) + np.uint64(8),
                      np.zeros(len(s), dtype=np.int32))
    none = np.zeros(0, dtype=np.uint64)
    assert lookup.merge_blocks(one(16, 48), one(32), none) is not None or not lookup.NATIVE
    assert lookup.merge_blocks(one(48, 16), one(32), none) is None
    assert lookup.merge_blocks(one(16, 48), one(48), none) is None
    assert lookup.merge_blocks(one(16, 16), one(), none) is None
    assert lookup.merge_blocks(one(16, 48), one(48), np.array([48], dtype=np.uint64)) is None


@pytest.mark.parametrize("stretches", [1, 40])
def test_blocks_given_by_their_lengths_are_found_as_by_their_ends(monkeypatch, stretches):
    """`view.Blocks` keeps lengths in units of 8 bytes (uint32) where every block fits: the table, the search in
    order and the C passes of the scan answer as with the ends, blocks running past the next one's start too."""
    rng = np.random.default_rng(30 + stretches)
    starts, ends = _blocks(rng, 20_000, stretches)
    ends[::9] += np.uint64(4096)                      # past the next starts (damage)
    blocks = Blocks(starts, ends, np.zeros(len(starts), dtype=np.int32), 16, 8)
    assert blocks.whole_ends is None and blocks.lengths.dtype == np.uint32
    assert np.array_equal(blocks.ends, ends) and blocks.end_of(17) == ends[17]
    values = np.concatenate([starts, ends, ends - np.uint64(1),
                             rng.integers(int(starts[0]) - 4096, int(ends[-1]) + 4096, 100_000, dtype=np.uint64)])
    base = int(starts[0]) - 64
    words = np.where(rng.random(30_000) < 0.6, rng.choice(starts, 30_000), values[:30_000]).astype(np.uint64)
    for lib in (lookup._LIB, None):
        monkeypatch.setattr(lookup, "_LIB", lib)
        by_ends, by_lengths = Locator(starts, ends), Locator(starts, None, blocks.lengths)
        assert by_lengths.hi == by_ends.hi
        assert np.array_equal(by_lengths(values), by_ends(values))
        assert np.array_equal(by_lengths.ascending(np.sort(values)), by_ends.ascending(np.sort(values)))
        assert all(np.array_equal(a, b) for a, b in zip(by_lengths.window_edges(base, words),
                                                          by_ends.window_edges(base, words)))
        if lib is not None:
            kept = []
            for locate in (by_ends, by_lengths):
                rows, seen = Rows(len(starts), False), np.zeros(len(starts), dtype=np.uint8)
                rows.window(locate, base, words, seen)
                kept.append(rows.rows().edges())
            assert all(np.array_equal(a, b) for a, b in zip(*kept)) and len(kept[0][0]) > 1000


def test_blocks_that_do_not_fit_lengths_keep_their_ends():
    starts = np.array([0x1000, 0x2000, 0x3000], dtype=np.uint64)
    odd = Blocks(starts, starts + np.array([16, 20, 8], dtype=np.uint64), np.zeros(3, dtype=np.int32), 0, 0)
    huge = Blocks(starts, starts + np.array([16, 1 << 36, 8], dtype=np.uint64), np.zeros(3, dtype=np.int32), 0, 0)
    for blocks in (odd, huge):
        assert blocks.lengths is None and blocks.whole_ends is not None
        assert blocks.sizes().tolist() == (blocks.whole_ends - starts).tolist()
    empty = Blocks(starts[:0], starts[:0], np.zeros(0, dtype=np.int32), 16, 8)
    assert empty.count == 0 and empty.sizes().tolist() == [] and Locator(empty.starts, None, empty.lengths).hi == 0


@pytest.mark.parametrize("count", [9, 300, 70_000])
def test_blocks_keep_their_arenas_as_a_small_index(count):
    rng = np.random.default_rng(count)
    numbers = np.sort(rng.choice(1 << 19, count, replace=False)).astype(np.int32)
    arena = numbers[rng.integers(0, count, 200_000)]
    arena[:count] = numbers                              # every one present
    starts = np.arange(len(arena), dtype=np.uint64) * np.uint64(64) + np.uint64(1 << 30)
    blocks = Blocks(starts, starts + np.uint64(48), arena, 16, 8)
    width = np.uint8 if count <= 256 else np.uint16 if count <= 65536 else np.int32
    assert blocks.arena_index.dtype == width and blocks.arena_numbers.dtype == np.int32
    assert np.array_equal(blocks.arena, arena) and np.array_equal(blocks.arena_of([5, 3]), arena[[5, 3]])
    assert np.array_equal(blocks.arena_numbers, numbers)
    odd = Blocks(starts[:3], starts[:3] + np.uint64(48), np.array([-1, 7, -1], dtype=np.int32), 16, 8)
    assert odd.arena_numbers.tolist() == [-1, 7] and odd.arena_index.tolist() == [0, 1, 0]


def test_blocks_of_one_arena_keep_no_index_a_block_and_tally_as_one():
    """One arena: its index is a single 0 seen as many (no byte a block, read-only); the blocks' arenas and the
    tallies by arena and by size are what an index a block gives."""
    starts = np.arange(1000, dtype=np.uint64) * np.uint64(64) + np.uint64(1 << 30)
    sizes = (np.arange(1000) % 7 * 16 + 32).astype(np.int64)
    blocks = Blocks(starts, starts + sizes.astype(np.uint64), np.full(1000, 5, dtype=np.int32), 16, 8)
    assert blocks.arena_index.strides == (0,) and not blocks.arena_index.flags.writeable
    assert blocks.arena.tolist() == [5] * 1000 and blocks.arena_of([3, 999]).tolist() == [5, 5]
    whole = np.zeros(1000, dtype=np.uint8)
    for by_exponent, slots in ((False, 1), (True, 64)):
        one = tally.tally(sizes, blocks.arena_index, slots, sizes > 80, by_exponent)
        assert all(np.array_equal(a, b) for a, b in zip(one, tally.tally(sizes, whole, slots, sizes > 80,
                                                                          by_exponent)))


def test_blocks_given_their_arenas_as_runs_make_the_index_when_first_asked():
    """An index given as runs of blocks (`TagRuns`: a page's blocks, of one owner) is made when first asked, the
    same as an index a block; one arena's runs are a single 0 seen as many, never made."""
    starts = np.arange(10, dtype=np.uint64) * np.uint64(64) + np.uint64(1 << 30)
    runs = TagRuns(np.array([1, 0, 1, 2], dtype=np.uint8), np.array([3, 0, 4, 3], dtype=np.int64))
    blocks = Blocks(starts, starts + np.uint64(48), (np.array([4, 6, 9], dtype=np.int32), runs), 16, 8)
    assert blocks._index is None                           # not made yet
    assert blocks.arena_index.tolist() == [1, 1, 1, 1, 1, 1, 1, 2, 2, 2] and blocks.arena_index.dtype == np.uint8
    assert blocks.arena.tolist() == [6] * 7 + [9] * 3 and blocks.arena_of([0, 9]).tolist() == [6, 9]
    one = Blocks(starts, starts + np.uint64(48), (np.array([4], dtype=np.int32),
                                                  TagRuns(np.zeros(2, dtype=np.uint8), np.array([4, 6]))), 16, 8)
    assert one.arena_index.strides == (0,) and one.arena.tolist() == [4] * 10


def test_the_table_is_packed_unless_a_slots_group_holds_too_many_blocks():
    """The table is kept as a base for each 32 slots and 16 bits a slot; 150,000 blocks of 8 bytes beside one of
    64 GiB make slots so wide that one group holds them all: the table stays whole, and answers the same."""
    rng = np.random.default_rng(40)
    starts, ends = _blocks(rng, 50_000, 3)
    assert not lookup.NATIVE or Locator(starts, ends)._table[4] > 0
    tiny = np.uint64(1 << 32) + np.arange(150_000, dtype=np.uint64) * np.uint64(8)
    starts = np.append(tiny, tiny[-1] + np.uint64(8))
    ends = np.append(tiny + np.uint64(8), starts[-1] + np.uint64(64 << 30))
    table = Locator(starts, ends)
    assert not lookup.NATIVE or table._table[4] == 0
    values = np.concatenate([starts, starts + np.uint64(7), rng.integers(1 << 32, (1 << 32) + (65 << 30), 100_000,
                                                                         dtype=np.uint64)])
    assert np.array_equal(table(values), table._numpy(values))


def test_tags_held_and_renumbered_in_steps():
    """Which of the tags the blocks hold, counted a quarter of a million at a time, and the tags renumbered to
    those held, in the smallest type: the same as counting them all at once."""
    rng = np.random.default_rng(41)
    tags = rng.choice(np.array([0, 2, 5, 9], dtype=np.uint16), 600_000)
    held = tags_held(tags, 12)
    assert held.tolist() == (np.bincount(tags, minlength=12) > 0).tolist()
    renumbered = retagged(tags, held)
    assert renumbered.dtype == np.uint8 and np.array_equal(renumbered, np.searchsorted([0, 2, 5, 9], tags))
    assert not tags_held(np.zeros(0, dtype=np.uint8), 3).any() and len(retagged(tags[:0], held)) == 0


_SHARED = """
import sys
import numpy as np
from heapwalk.analysis.lookup import Locator
rng = np.random.default_rng(3)
sizes = rng.integers(1, 64, 50_000).astype(np.uint64) * np.uint64(16)
starts = np.uint64(1 << 40) + np.cumsum(sizes + np.uint64(16)) - sizes
values = starts[rng.integers(0, len(starts), 400_000)] + rng.integers(0, 1100, 400_000).astype(np.uint64)
table = Locator(starts, starts + sizes)
np.save(sys.argv[1], np.stack([table(values), table._numpy(values)]))
"""


@pytest.mark.skipif(not lookup.NATIVE, reason="the C library is not built")
@pytest.mark.parametrize("threads", ["1", "3", "4"])
def test_a_long_lookup_shared_between_threads_answers_as_one_alone(tmp_path, threads):
    """`hw_locate` shares a long lookup between up to four threads (HEAPWALK_THREADS, else the CPUs): each part
    is answered where the whole would be."""
    import os
    import subprocess
    import sys
    out = tmp_path / "found.npy"
    from pathlib import Path
    env = dict(os.environ, HEAPWALK_THREADS=threads, PYTHONPATH=str(Path(lookup.__file__).parents[2]))
    subprocess.run([sys.executable, "-c", _SHARED, str(out)], check=True, env=env, timeout=120)
    found, expected = np.load(out)
    assert np.array_equal(found, expected) and (found >= 0).sum() > 300_000


_WINDOW = """
import sys
import numpy as np
from heapwalk.analysis.lookup import Locator
from heapwalk.analysis.rows import Rows
rng = np.random.default_rng(5)
sizes = rng.integers(1, 40, 60_000).astype(np.uint64) * np.uint64(16)
starts = np.uint64(1 << 40) + np.cumsum(sizes + np.uint64(16)) - sizes
ends = starts + sizes
ends[::9] += np.uint64(48)                     # some run past the next one's start, as damage makes them
base, n = int(starts[0]) - 64, int(ends[-1] - starts[0]) // 8 + 8
words = np.where(rng.random(n) < 0.4, starts[rng.integers(0, len(starts), n)] + np.uint64(8),
                 rng.integers(0, 1 << 41, n).astype(np.uint64))
locate, out = Locator(starts, ends), []
for defer in (False, True):
    seen = (rng.random(len(starts)) < 0.2).astype(np.uint8)
    rows = Rows(len(starts), defer)
    for at in range(0, n, 150_000):                # windows whose lookups are shared between threads
        rows.window(locate, base + 8 * at, words[at:at + 150_000], seen)
    kept = rows.rows()
    out += [*kept.edges(), kept.keys, kept.starts, seen]
    if not defer:
        out += list(locate.window_edges(base, words))
np.savez(sys.argv[1], *out)
"""


@pytest.mark.parametrize("threads", ["2", "3", "4"])
def test_a_windows_blocks_shared_between_threads_give_the_rows_of_one_thread(tmp_path, threads):
    """`hw_scan_rows` shares a window's lookups between threads (HEAPWALK_THREADS, else the CPUs) and judges its
    edges in address order: the same rows and marks as one thread, and as numpy's form."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    got = {}
    for count in ("1", threads):
        env = dict(os.environ, HEAPWALK_THREADS=count, PYTHONPATH=str(Path(lookup.__file__).parents[2]))
        subprocess.run([sys.executable, "-c", _WINDOW, str(tmp_path / count)], check=True, env=env, timeout=120)
        with np.load(tmp_path / f"{count}.npz") as saved:
            got[count] = [saved[f"arr_{k}"] for k in range(len(saved.files))]
    one, many = got["1"], got[threads]
    assert len(one) == len(many) == 12 and all(np.array_equal(a, b) for a, b in zip(one, many))
    assert np.array_equal(one[0], one[5]) and np.array_equal(one[1], one[6]) and len(one[0]) > 100_000
    assert one[11].sum() > one[4].sum() > 0 and len(many[7]) < len(one[0])      # deferring: marks, fewer rows


def test_pages_holding_anything_are_found_in_c_as_in_numpy(monkeypatch):
    """Pages of zeros, and pages whose one word not zero lies anywhere (the first, the last, a cache line's
    last): the same pages in C as in numpy."""
    rng = np.random.default_rng(17)
    words = np.zeros(512 * 300, dtype=np.uint64)
    for page, at in enumerate([0, 7, 8, 511, 505, 256, 63, 64] * 30):
        if page % 3:
            words[512 * page + at] = np.uint64(1) << np.uint64(int(rng.integers(0, 64)))
    found = lookup.nonzero_pages(words)
    monkeypatch.setattr(lookup, "_LIB", None)
    expected = lookup.nonzero_pages(words)
    assert found.tolist() == expected.tolist() and 0 < expected.sum() < 300
