"""The extent map's lookups of many addresses at once (a thread cache's regions) against one at a time."""

from __future__ import annotations

import struct

import numpy as np

from heapwalk.inferior.image import ImageMemory
from heapwalk.jemalloc.layout import LAYOUTS
from heapwalk.jemalloc.rtree import COMPACT_48, ExtentMap

LAYOUT = LAYOUTS[(5, 3, 0)]
RTREE = 0x5000_0000
LEAF = 0x6000_0000
HEADERS = 0x7000_0000


def _map() -> tuple[ImageMemory, list[int]]:
    """A 48-bit build's tree with one readable leaf (pages of 0x7f00_0000_0000's span: every eighth page names one
    of four extent headers, of size classes 1 to 4, slabs but the last) and one leaf whose node is not there, and
    the headers (each of arena 1 + its number), the last one's memory missing."""
    mem = ImageMemory()
    root = bytearray(8 << COMPACT_48.levels[0])
    readable, missing = 0x7F00_0000_0000, 0x7E00_0000_0000
    for address, node in ((readable, LEAF), (missing, LEAF + (1 << 24))):
        struct.pack_into("<Q", root, 8 * COMPACT_48.path(address)[0], node)
    mem.add(RTREE + LAYOUT.rtree_root, root)
    leaf = np.zeros(1 << COMPACT_48.leaf_bits, dtype=np.uint64)
    headers = [HEADERS + 0x100 * k for k in range(4)]
    for page in range(0, 256, 8):
        k = page // 8 % 4
        leaf[page] = (k + 1) << 48 | headers[k] | (k < 3)
    mem.add(LEAF, leaf.tobytes())
    for k, header in enumerate(headers[:3]):
        mem.add(header, struct.pack("<Q", 0x1000 | (k + 1)))
    return mem, headers


def test_many_addresses_are_looked_up_as_one_at_a_time():
    """Addresses in the readable leaf (on pages an extent holds, or none), in the leaf whose node is missing, and
    outside the tree, in any order: the same entries."""
    mem, _ = _map()
    rng = np.random.default_rng(3)
    addresses = [0x7F00_0000_0000 + int(p) * 4096 + int(o) for p, o in zip(rng.integers(0, 300, 200),
                                                                             rng.integers(0, 4096, 200))]
    addresses += [0x7E00_0000_0000 + 0x10, 0x7D00_0000_0000, addresses[0]]
    one = ExtentMap(mem, LAYOUT, RTREE, COMPACT_48)
    expected = [one.lookup(a) for a in addresses]
    assert sum(e is not None for e in expected) > 20 and expected[-3] is None
    assert ExtentMap(mem, LAYOUT, RTREE, COMPACT_48).lookup_many(addresses) == expected
    assert ExtentMap(mem, LAYOUT, None, COMPACT_48).lookup_many(addresses[:3]) == [None] * 3


def test_arenas_the_table_knows_are_not_read_again():
    """An extent whose header the table read takes its arena from it (its memory missing here); the others are
    read from their headers."""
    mem, headers = _map()
    extents = ExtentMap(mem, LAYOUT, RTREE, COMPACT_48)
    assert extents.arena_of_entry((headers[3], 4, False)) is None
    extents = ExtentMap(mem, LAYOUT, RTREE, COMPACT_48)
    extents.know(np.array([headers[3]], dtype=np.uint64), np.array([7], dtype=np.int32))
    assert [extents.arena_of_entry((h, 1, True)) for h in headers] == [1, 2, 3, 7]
    assert extents.arena_of(0x7F00_0000_0000 + 8 * 4096 * 3) == 7
