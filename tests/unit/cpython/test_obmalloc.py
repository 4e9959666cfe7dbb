"""CPython's obmalloc decoded from synthetic memory (no gdb): pools found by their headers at either pool size,
the arena table found by the arenas' addresses, an arena whose start is off a pool boundary losing a pool to
alignment, the figures sys._debugmallocstats() prints computed here from the pools as laid out, what is not a
pool header left alone, and the arena table's absence said."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import pytest

from heapwalk.cpython.load import NoObmalloc, load_obmalloc
from heapwalk.cpython.pools import find_pools
from heapwalk.inferior.elf import Mapping
from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.space import MemoryMap, Target

HEAP = 0x5555_0000_0000
PYTHON = Mapping(0x5555_4000_0000, 0x5555_4000_1000, 0, "/usr/bin/python3.11")


@dataclass
class Pool:
    """A pool as laid out: its size class, blocks in use, blocks carved (nextoffset's count)."""

    szidx: int
    count: int
    carved: int

    def size(self) -> int:
        return (self.szidx + 1) * 16


@dataclass
class Arena:
    address: int
    pools: list = field(default_factory=list)


def _header(address: int, pool: Pool, index: int, pool_size: int) -> bytes:
    size = pool.size()
    free = address + 48 + size * pool.count if pool.count < pool.carved else 0
    return struct.pack("<QQQQIIII", pool.count, free, 0x1234560, 0x1234560, index, pool.szidx,
                       48 + size * pool.carved, pool_size - size)


def _image(arenas: list, pool_size: int = 16384, arena_size: int = 1 << 20, table: bool = True):
    """A target whose memory holds ARENAS (index = position; None: a slot no arena uses) and, with TABLE, the
    arena table in a heap segment: (target, the table's address)."""
    mem = ImageMemory()
    regions = []
    for index, arena in enumerate(arenas):
        if arena is None:
            continue
        data = bytearray(arena_size)
        first = -(-arena.address // pool_size) * pool_size
        for k, pool in enumerate(arena.pools):
            at = first + k * pool_size
            data[at - arena.address:at - arena.address + 48] = _header(at, pool, index, pool_size)
        mem.add(arena.address, data)
        regions.append((arena.address, arena.address + arena_size))
    heap = bytearray(0x2000)
    table_at = HEAP + 0x410
    for index, arena in enumerate(arenas):
        slot = bytes(48)
        if arena is not None:
            npools = arena_size // pool_size - (1 if arena.address % pool_size else 0)
            first = -(-arena.address // pool_size) * pool_size
            nfree = npools - sum(1 for p in arena.pools if p.count)
            slot = struct.pack("<QQIIQQQ", arena.address, first + len(arena.pools) * pool_size, nfree, npools,
                               0, 0, 0)
        if table:
            heap[0x410 + 48 * index:0x410 + 48 * (index + 1)] = slot
    mem.add(HEAP, heap)
    regions.append((HEAP, HEAP + len(heap)))
    space = MemoryMap([PYTHON], regions, None, core=True, writable=list(regions))
    return Target(mem, space, [], None, "synthetic", []), table_at


def _expected(arenas: list, pool_size: int, arena_size: int) -> dict:
    """What sys._debugmallocstats() would print for ARENAS, computed as it does, pool by pool."""
    out = dict(in_use=0, available=0, unused=0, headers=0, quantization=0, alignment=0)
    for arena in filter(None, arenas):
        npools = arena_size // pool_size
        if arena.address % pool_size:
            out["alignment"] += pool_size
            npools -= 1
        used = [p for p in arena.pools if p.count]
        out["unused"] += npools - len(used)
        for p in used:
            blocks = (pool_size - 48) // p.size()
            out["in_use"] += p.count * p.size()
            out["available"] += (blocks - p.count) * p.size()
            out["headers"] += 48
            out["quantization"] += (pool_size - 48) % p.size()
    return out


ARENAS = [Arena(0x7F00_0000_1000, [Pool(0, 3, 5), Pool(3, 200, 200), Pool(31, 1, 2), Pool(5, 0, 9),
                                   Pool(1, 500, 508)]),
          None,
          Arena(0x7F00_0020_0000, [Pool(7, 1, 1), Pool(7, 120, 127)])]


def test_the_figures_are_those_debugmallocstats_prints():
    """Two arenas (one off a pool boundary), a slot no arena uses between them: every total as the
    interpreter would print it, each class's pools and blocks, and where the table is."""
    target, table = _image(ARENAS)
    state = load_obmalloc(target, [])
    want = _expected(ARENAS, 16384, 1 << 20)
    f = state.figures()
    assert (f["bytes_in_allocated_blocks"], f["bytes_in_available_blocks"], f["unused_pools"],
            f["bytes_lost_to_pool_headers"], f["bytes_lost_to_quantization"], f["bytes_lost_to_arena_alignment"]) \
        == (want["in_use"], want["available"], want["unused"], want["headers"], want["quantization"],
            want["alignment"])
    assert f["total"] == 2 << 20 and f["arenas"] == 2 and state.table == table
    assert (state.pool_size, state.arena_size, state.python) == (16384, 1 << 20, "CPython 3.11 (/usr/bin/python3.11)")
    classes = {c.index: (c.pools, c.in_use, c.available) for c in state.classes if c.pools}
    assert classes == {0: (1, 3, 1018), 3: (1, 200, 55), 31: (1, 1, 30), 1: (1, 500, 10), 7: (2, 121, 133)}
    first, second = state.arenas
    assert (first.index, first.pools, first.carved, first.used, first.alignment) == (0, 63, 5, 4, 16384)
    assert (second.index, second.pools, second.carved, second.used, second.alignment) == (2, 64, 2, 2, 0)
    assert all(a.balanced for a in state.arenas) and not state.findings


def test_small_pools_of_older_pythons():
    """4 KiB pools in 256 KiB arenas (CPython 3.9 and before): found at that size."""
    arenas = [Arena(0x7F00_0004_0000, [Pool(2, 10, 12), Pool(9, 0, 3)])]
    target, _ = _image(arenas, 4096, 1 << 18)
    state = load_obmalloc(target, [])
    want = _expected(arenas, 4096, 1 << 18)
    assert (state.pool_size, state.arena_size) == (4096, 1 << 18)
    assert state.figures()["bytes_in_allocated_blocks"] == want["in_use"] == 10 * 48
    assert state.figures()["unused_pools"] == want["unused"] == 63


def test_without_the_table_the_arena_starts_at_its_first_pool_and_says_so():
    target, _ = _image(ARENAS, table=False)
    state = load_obmalloc(target, [])
    assert state.table is None
    assert state.findings[0].message.startswith("obmalloc's arena table was not found")
    assert [a.address for a in state.arenas] == [0x7F00_0000_4000, 0x7F00_0020_0000]


def test_what_is_not_a_pool_header_is_left_alone():
    """A page of zeros, a header whose largest offset does not fit its class, one whose free list leaves the
    pool, one whose count exceeds what it carved: none is a pool."""
    mem = ImageMemory()
    bad = [struct.pack("<QQQQIIII", 0, 0, 0, 0, 0, 0, 0, 0),
           struct.pack("<QQQQIIII", 1, 0, 1, 1, 0, 3, 48 + 64, 16384 - 48),
           struct.pack("<QQQQIIII", 1, 0x10, 1, 1, 0, 3, 48 + 128, 16384 - 64),
           struct.pack("<QQQQIIII", 5, 0, 1, 1, 0, 3, 48 + 128, 16384 - 64)]
    data = bytearray(16384 * len(bad))
    for i, h in enumerate(bad):
        data[i * 16384:i * 16384 + 48] = h
    mem.add(0x7F00_0000_0000, data)
    assert find_pools(mem, [(0x7F00_0000_0000, 0x7F00_0000_0000 + len(data))]) is None


def test_a_process_without_python_or_without_arenas_is_no_obmalloc():
    target, _ = _image([])
    with pytest.raises(NoObmalloc, match="holds no obmalloc arena"):
        load_obmalloc(target, [])
    other = Target(target.mem, MemoryMap([], target.space.regions, None, core=True), [], None, "x", [])
    with pytest.raises(NoObmalloc, match="CPython is not mapped"):
        load_obmalloc(other, [])


def test_memory_another_allocator_claims_is_not_searched_for_pools():
    target, _ = _image(ARENAS)
    a = ARENAS[0].address
    state = load_obmalloc(target, [(a, a + (1 << 20))])
    assert [x.index for x in state.arenas] == [2]
