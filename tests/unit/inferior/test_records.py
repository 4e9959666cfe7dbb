"""Reads of many small records at once (`inferior.records`) and the array lookups jemalloc's extent walk and
blocks are made of: each equal to the one-at-a-time form it replaced, holes and repeats included."""

from __future__ import annotations

import numpy as np

from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.memory import ReadError
from heapwalk.inferior.records import read_records
from heapwalk.jemalloc.blocks import _without
from heapwalk.jemalloc.extents import _maps_many
from heapwalk.jemalloc.rtree import COMPACT_48, WIDE_57


def _memory() -> ImageMemory:
    rng = np.random.default_rng(7)
    mem = ImageMemory()
    mem.add(0x10000, rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes())
    mem.add(0x60000, rng.integers(0, 256, 5_000, dtype=np.uint8).tobytes())      # a hole before it
    return mem


def test_records_read_at_once_are_those_read_one_by_one_with_holes_and_repeats():
    mem = _memory()
    rng = np.random.default_rng(1)
    addresses = np.concatenate([rng.integers(0x10000, 0x10000 + 300_000 - 24, 2000),
                                rng.integers(0x59000, 0x62000, 300),             # straddling the hole, and inside it
                                [0x10000, 0x10000, 0x60000 + 5_000 - 24, 0x60000 + 5_000 - 23]]).astype(np.uint64)
    got = read_records(mem, addresses, 24, span=4096)
    for row, address in enumerate(addresses.tolist()):
        try:
            expected = mem.read(address, 24)
        except ReadError:
            assert not got.readable[row] and got.errors[row].address == address and not got.data[row].any()
            continue
        assert got.readable[row] and got.data[row].tobytes() == expected and row not in got.errors
    assert 0 < len(got.errors) < 300


def test_records_of_nothing():
    got = read_records(_memory(), np.zeros(0, dtype=np.uint64), 64)
    assert got.data.shape == (0, 64) and not got.errors


def test_the_blocks_left_after_exclusions_are_those_isin_leaves():
    rng = np.random.default_rng(3)
    ordered = np.sort(rng.integers(0, 5000, 20_000).astype(np.uint64))      # repeats, as damage can make
    excluded = np.unique(rng.integers(0, 6000, 700).astype(np.uint64))
    assert np.array_equal(_without(ordered, excluded), ~np.isin(ordered, excluded))
    assert _without(ordered, np.zeros(0, dtype=np.uint64)).all()
    many_absent = np.arange(3, 900, dtype=np.uint64)      # hundreds of marks at one place: a byte wraps, and holds
    assert _without(np.array([1, 2, 1000, 1000], dtype=np.uint64), many_absent).all()
    assert _without(np.array([1, 5, 1000], dtype=np.uint64), many_absent).tolist() == [True, False, True]


def test_the_tree_maps_addresses_as_one_leaf_lookup_at_a_time():
    rng = np.random.default_rng(5)
    for shape in (COMPACT_48, WIDE_57):
        span = 12 + shape.leaf_bits
        bases = [0x7F00 << 32 >> span << span, (0x5555 << 32 >> span << span) + (3 << span)]
        leaves = {b: rng.integers(1, 1 << 40, 1 << shape.leaf_bits, dtype=np.uint64) for b in bases}
        addresses = np.concatenate([rng.integers(b, b + (1 << span), 500) for b in bases] +
                                   [rng.integers(0, 1 << 47, 300)]).astype(np.uint64)
        got = _maps_many(leaves, shape, addresses)
        for address, header in zip(addresses.tolist(), got.tolist()):
            base, index = shape.leaf_of(address)
            assert header == (int(leaves[base][index]) if base in leaves else 0)
        assert not _maps_many({}, shape, addresses).any()


def test_ranges_merged_with_arrays_are_those_merged_one_by_one():
    from heapwalk.inferior.ranges import merged, merged_arrays
    rng = np.random.default_rng(11)
    lo = rng.integers(0, 1 << 20, 3000).astype(np.uint64) * np.uint64(16) + np.uint64((1 << 64) - (1 << 30))
    hi = lo + rng.integers(0, 4096, 3000).astype(np.uint64)            # empty ones too, overlaps, touches
    assert merged_arrays(lo, hi) == merged(zip(lo.tolist(), hi.tolist()))
    assert merged_arrays(np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint64)) == []


def test_the_regions_slabs_hand_out_are_the_same_in_c_and_numpy(monkeypatch):
    """Slabs of every small class, their bitmaps random (some unreadable, some not counting their free regions,
    bits past the last region set or not): the same regions and unknown slabs either way."""
    from heapwalk.analysis import lookup
    from heapwalk.jemalloc import blocks
    from heapwalk.jemalloc.extents import ExtentTable
    from heapwalk.jemalloc.sizeclasses import size_classes
    classes = size_classes(4)
    rng = np.random.default_rng(21)
    n = 600
    szind = rng.integers(0, classes.nbins, n).astype(np.int32)
    nregs = np.array([classes.bins[i].nregs for i in szind.tolist()])
    mem = ImageMemory()
    headers = np.uint64(0x100000) + np.arange(n, dtype=np.uint64) * np.uint64(128)
    bits = rng.random((n, 512)) < 0.4
    bits[:, :][np.arange(512)[None, :] >= nregs[:, None]] = rng.random() < 0.5     # past the regions: anything
    raw = np.packbits(bits, axis=1, bitorder="little")
    records = np.zeros((n, 128), dtype=np.uint8)
    records[:, 64:] = raw
    mem.add(0x100000, records[:300].tobytes())
    mem.add(0x100000 + 128 * 310, records[310:].tobytes())                          # 300-309 unreadable
    nfree = (bits & (np.arange(512)[None, :] < nregs[:, None])).sum(axis=1).astype(np.int32)
    nfree[::7] += 1                                                                  # a count the bitmap does not hold
    address = np.uint64(1 << 40) + np.arange(n, dtype=np.uint64) * np.uint64(1 << 16)
    table = ExtentTable(address, np.full(n, 1 << 16, dtype=np.int64), np.zeros(n, dtype=np.int64),
                        rng.integers(0, 4, n).astype(np.int32), np.zeros(n, dtype=np.uint8), np.ones(n, dtype=bool),
                        szind, nfree, headers, classes)
    rows = np.arange(n)
    got = blocks._slab_regions(mem, table, rows)
    monkeypatch.setattr(lookup, "_LIB", None)
    want = blocks._slab_regions(mem, table, rows)
    for a, b in zip(got[:3], want[:3]):
        assert np.array_equal(np.concatenate(a), np.concatenate(b))
    assert sorted(got[3]) == sorted(want[3]) and 90 < len(got[3]) < 200
    assert len(np.concatenate(got[0])) > 10_000
