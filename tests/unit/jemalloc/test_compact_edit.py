"""The slabs' regions in the leak scan's compact form, edited in place in C: the thread caches' regions taken
out, the large allocations merged in."""

from __future__ import annotations

import numpy as np
import pytest

from heapwalk.jemalloc import native


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_blocks_taken_out_and_merged_in_in_place_are_those_sorting_gives(seed):
    """Regions (some excluded, with addresses that are no region's) and large allocations (none where a region
    starts, some below, between and above them all): the same starts, lengths and tags as sorting all of them and
    dropping the excluded, in the room the columns had."""
    assert native.NATIVE, "pip install builds the library the compact form is made with"
    rng = np.random.default_rng(seed)
    starts = np.unique(rng.integers(1 << 20, 1 << 40, 20_000).astype(np.uint64) & ~np.uint64(15))
    large = rng.random(len(starts)) < 0.05
    if seed == 3:
        large[:3] = large[-3:] = True
    regions, big = starts[~large], starts[large]
    excluded = np.unique(np.concatenate([rng.choice(regions, 300), rng.integers(0, 1 << 40, 30).astype(np.uint64)]))
    n = len(regions)
    columns = (np.zeros(n + len(big), dtype=np.uint64), np.zeros(n + len(big), dtype=np.uint32),
               np.zeros(n + len(big), dtype=np.uint8))
    columns[0][:n] = regions
    columns[1][:n] = rng.integers(2, 64, n)
    columns[2][:n] = rng.integers(0, 8, n)
    other = (big, rng.integers(512, 1 << 20, len(big)).astype(np.uint32), rng.integers(0, 8, len(big)).astype(np.uint8))
    every = [np.concatenate([c[:n], o]) for c, o in zip(columns, other)]
    order = np.argsort(every[0])
    keep = ~np.isin(every[0][order], excluded)
    want = [c[order][keep] for c in every]
    got = native.compact_edit(columns, n, excluded, other)
    assert got == len(want[0]) == len(starts) - len(np.intersect1d(excluded, regions))
    assert all(np.array_equal(c[:got], w) for c, w in zip(columns, want))


def test_nothing_to_take_out_or_merge_in_leaves_the_blocks_as_they_are():
    columns = (np.array([16, 48, 80], dtype=np.uint64), np.array([2, 2, 4], dtype=np.uint32),
               np.array([0, 1, 0], dtype=np.uint8))
    none = np.zeros(0, dtype=np.uint64)
    assert native.compact_edit(columns, 3, none, (none, none.astype(np.uint32), none.astype(np.uint8))) == 3
    assert columns[0].tolist() == [16, 48, 80] and columns[1].tolist() == [2, 2, 4] and columns[2].tolist() == [0, 1, 0]
