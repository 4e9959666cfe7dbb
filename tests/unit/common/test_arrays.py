"""`distinct`: each value once, ascending, as np.unique gives it, however the values repeat and lie; `counted`: the
same with how many times each comes, below and above the values counted in place; `ordered`: np.argsort's stable order,
packed or not; `staggered`: arrays of the size asked whose starts lie apart in the cache."""

from __future__ import annotations

import numpy as np

from heapwalk.common.arrays import COUNTED_BELOW, STAGGER, counted, distinct, ordered, staggered


def test_as_unique_gives_them():
    rng = np.random.default_rng(76)
    for n in (0, 1, 2, 3, 17, 5000):
        for dtype in (np.uint64, np.int32, np.uint8):
            picks = rng.integers(0, 40, size=max(n // 8, 1)).astype(dtype)
            values = np.repeat(picks, rng.integers(1, 16, size=len(picks)))[:n]    # runs, and values met again
            assert np.array_equal(distinct(values), np.unique(values))
            assert distinct(values).dtype == values.dtype


def test_values_above_2_63_and_a_list():
    values = [2 ** 64 - 8, 0, 2 ** 63, 2 ** 64 - 8, 5]
    assert distinct(np.array(values, dtype=np.uint64)).tolist() == sorted(set(values))
    assert distinct([3, 1, 3]).tolist() == [1, 3]


def test_its_argument_is_left_as_it_was():
    values = np.array([9, 1, 9, 4], dtype=np.uint64)
    distinct(values)
    assert values.tolist() == [9, 1, 9, 4]


def test_staggered_arrays_start_apart():
    """Each array is what np.empty gives (writable, contiguous, its own memory), the K-th starting K * STAGGER
    bytes into room of its own; four such starts lie in four different cache lines of a page."""
    for dtype in (np.uint64, np.int32, np.uint8):
        arrays = [staggered(1 << 12, dtype, k) for k in range(4)]
        for k, a in enumerate(arrays):
            assert a.shape == (1 << 12,) and a.dtype == dtype and a.flags.writeable and a.flags.c_contiguous
            assert a.ctypes.data - a.base.ctypes.data == k * STAGGER
            a[:] = k
        assert [int(a[0]) for a in arrays] == [0, 1, 2, 3] and [int(a[-1]) for a in arrays] == [0, 1, 2, 3]
    assert STAGGER % 64 == 0 and len({k * STAGGER % 4096 // 64 for k in range(4)}) == 4


def test_counted_as_unique_counts_them():
    """Sizes of chunks below `COUNTED_BELOW`, some far above (up to 2**64 - 16), none, one, or all above: the values
    and counts np.unique gives, of the values' own type; the argument left as it was."""
    rng = np.random.default_rng(77)
    cases = [np.zeros(0, dtype=np.uint64), np.array([0x20], dtype=np.uint64),
             np.array([2 ** 64 - 16, COUNTED_BELOW, 2 ** 64 - 16], dtype=np.uint64),
             np.array([COUNTED_BELOW - 1, 0, COUNTED_BELOW, COUNTED_BELOW - 1], dtype=np.uint64),
             (rng.integers(2, 300, size=20000) * 16).astype(np.uint64),
             np.concatenate(((rng.integers(2, 300, size=5000) * 16).astype(np.uint64),
                             rng.integers(COUNTED_BELOW, 2 ** 63, size=40, dtype=np.uint64),
                             np.array([2 ** 64 - 16, 2 ** 63], dtype=np.uint64))),
             rng.integers(0, 1000, size=300).astype(np.uint32)]
    for values in cases:
        before = values.copy()
        got, expected = counted(values), np.unique(values, return_counts=True)
        assert np.array_equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
        assert got[0].dtype == values.dtype and np.array_equal(values, before)


def test_ordered_is_the_stable_argsort():
    """Addresses (aligned or not, repeated: the first listed first), spans too wide to pack with the places (a
    damaged entry near 2**64), few values, signed ones: each the order np.argsort(kind="stable") gives."""
    rng = np.random.default_rng(761)
    heap = 0x7F12_3400_0000
    cases = [np.zeros(0, dtype=np.uint64), np.array([5], dtype=np.uint64), np.array([7, 7, 3], dtype=np.uint64),
             np.array([3, -1, 3, 0], dtype=np.int64)]
    for n in (2, 3, 1000, 70000):
        aligned = np.uint64(heap) + rng.integers(0, 1 << 24, size=n).astype(np.uint64) * np.uint64(16)
        cases += [aligned, aligned - np.uint64(16), np.concatenate((aligned, aligned[::3])),
                  aligned + rng.integers(0, 16, size=n).astype(np.uint64)]
        wide = aligned.copy()
        wide[n // 2] = np.uint64(2 ** 64 - 9)
        cases += [wide, rng.integers(0, 2 ** 63, size=n, dtype=np.uint64), aligned.astype(np.uint32)]
    for values in cases:
        got = ordered(values)
        assert np.array_equal(got, np.argsort(values, kind="stable")), values[:8]
        assert got.dtype == np.intp
