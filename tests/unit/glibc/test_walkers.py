"""Walkers on synthetic memory: right answers on good lists, findings (never exceptions) on bad ones."""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest

from heapwalk.glibc.locate.layout import layout_for
from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.memory import CachedMemory, ReadError, drop_cached
from heapwalk.glibc.model import BinKind, BinList
from heapwalk.common.findings import Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.walk.lists import bin_index, largebin_index, reveal, walk_bin, walk_fastbin, walk_tcache
from heapwalk.glibc.walk.ring import walk_arena_ring, walk_heaps
from synth import ARENA, HEAP, SynthHeap


def test_empty_arena_has_empty_bins_and_no_findings():
    s = SynthHeap()
    for i in range(1, 128):
        b, findings = walk_bin(s.mem, s.layout, ARENA, i, 0x10000)
        assert b.count == 0 and b.complete and findings == []
    for i in range(s.layout.nfastbins):
        fb, findings = walk_fastbin(s.mem, s.layout, ARENA, i, 0x10000)
        assert fb.count == 0 and findings == []
    ring, findings = walk_arena_ring(s.mem, s.layout, ARENA)
    assert ring == [ARENA] and findings == []


def test_one_chunk_small_bin_is_read_with_its_raw_size():
    s = SynthHeap()
    c = s.chunk(HEAP + 0x100, 0x91)
    s.link_bin(9, [c])
    b, findings = walk_bin(s.mem, s.layout, ARENA, 9, 0x10000)
    assert findings == []
    assert (b.kind, b.count, b.total, b.raw_total, tuple(b.chunks)) == (BinKind.SMALL, 1, 0x90, 0x91, (c,))


def test_large_bin_with_mixed_sizes():
    s = SynthHeap()
    chunks = [s.chunk(HEAP + off, size | 1) for off, size in ((0x0, 0x470), (0x800, 0x450), (0x1000, 0x440))]
    s.link_bin(65, chunks)
    b, findings = walk_bin(s.mem, s.layout, ARENA, 65, 0x10000)
    assert findings == [] and tuple(b.sizes) == (0x470, 0x450, 0x440) and b.kind is BinKind.LARGE


def test_bin_whose_list_loops_not_through_its_head_ends_with_a_finding():
    s = SynthHeap()
    a, b_, c = (s.chunk(HEAP + off, 0x91) for off in (0x100, 0x200, 0x300))
    s.link_bin(9, [a, b_, c])
    s.w(c + 16, a)  # c->fd points back to a: a cycle that never returns to the head
    b, findings = walk_bin(s.mem, s.layout, ARENA, 9, 0x10000)
    assert b.count == 3 and not b.complete
    (f,) = findings  # reported at c, whose fd is the bad link
    assert (f.severity, f.kind, f.address, f.found) == (Severity.ERROR, Kind.LIST_CYCLE, c, hex(a))
    assert "cycle not through its head" in f.message


def test_fastbin_pointer_that_is_misaligned_is_reported_and_the_walk_stops():
    s = SynthHeap()
    good = s.chunk(HEAP + 0x40, 0x21)
    s.w(s.fastbin_slot(0), good)
    s.w(good + 16, s.protect(good + 16, HEAP + 0x88))  # next is 8 mod 16
    fb, findings = walk_fastbin(s.mem, s.layout, ARENA, 0, 0x10000)
    assert tuple(fb.chunks) == (good,) and not fb.complete
    (f,) = findings
    assert (f.kind, f.address, f.found) == (Kind.MISALIGNED, good, hex(HEAP + 0x88)) and "misaligned" in f.message


def test_pointer_into_unreadable_memory_is_a_finding_not_an_exception():
    s = SynthHeap()
    c = s.chunk(HEAP + 0x100, 0x91)
    s.link_bin(9, [c])
    s.w(c + 16, 0x10000)  # fd into nothing
    b, findings = walk_bin(s.mem, s.layout, ARENA, 9, 0x10000)
    assert tuple(b.chunks) == (c,) and not b.complete
    (f,) = findings
    assert (f.kind, f.address, f.found) == (Kind.UNMAPPED, c, "0x10000") and "not in the target's memory" in f.message


def test_fd_bk_mismatch_is_noted_but_the_list_is_still_walked():
    s = SynthHeap()
    a, b_ = s.chunk(HEAP + 0x100, 0x91), s.chunk(HEAP + 0x200, 0x91)
    s.link_bin(9, [a, b_])
    s.w(b_ + 24, HEAP + 0x500)
    b, findings = walk_bin(s.mem, s.layout, ARENA, 9, 0x10000)
    assert b.count == 2 and b.complete
    (f,) = findings
    assert (f.kind, f.address, f.expected, f.found) == (Kind.FD_BK, b_, hex(a), hex(HEAP + 0x500))
    assert "fd->bk != p" in f.message


def test_fastbin_entry_of_wrong_size_is_reported():
    s = SynthHeap()
    a = s.chunk(HEAP + 0x40, 0x31)
    s.w(s.fastbin_slot(0), a)
    s.w(a + 16, s.protect(a + 16, 0))
    fb, findings = walk_fastbin(s.mem, s.layout, ARENA, 0, 0x10000)
    assert fb.count == 1 and "wrong size" in findings[0].message
    assert (findings[0].kind, findings[0].address, findings[0].expected, findings[0].found) == (
        Kind.FASTBIN_SIZE, a, "0x20", "0x30")


def test_safe_linked_tcache_lists_decode_head_first():
    s = SynthHeap()
    entries = [HEAP + 0x2010, HEAP + 0x2030, HEAP + 0x2050]
    tc = s.tcache(HEAP + 0x10, {0: entries, 5: [HEAP + 0x3010]})
    t = walk_tcache(s.mem, s.layout, tc)
    assert t.findings == ()
    assert [(b.index, b.chunk_size, b.entries) for b in t.bins] == [(0, 0x20, tuple(entries)),
                                                                     (5, 0x70, (HEAP + 0x3010,))]
    assert t.count == 4 and t.total == 3 * 0x20 + 0x70


def test_raw_links_before_safe_linking():
    s = SynthHeap(version=(2, 31))
    entries = [HEAP + 0x2010, HEAP + 0x2030]
    tc = s.tcache(HEAP + 0x10, {1: entries})
    (b,) = walk_tcache(s.mem, s.layout, tc).bins
    assert b.entries == tuple(entries)


def test_tcache_count_that_disagrees_with_the_list_is_a_finding():
    s = SynthHeap()
    tc = s.tcache(HEAP + 0x10, {0: [HEAP + 0x2010]}, counts={0: 3})
    t = walk_tcache(s.mem, s.layout, tc)
    assert "count does not match" in t.findings[0].message
    assert t.bins[0].count == 3 and len(t.bins[0].entries) == 1


def test_tcache_whose_list_loops_terminates():
    s = SynthHeap()
    a, b = HEAP + 0x2010, HEAP + 0x2030
    tc = s.tcache(HEAP + 0x10, {0: [a, b]})
    s.w(b, s.protect(b, a))
    t = walk_tcache(s.mem, s.layout, tc)
    assert t.bins[0].entries == (a, b) and not t.bins[0].complete


def test_count_down_tcache_slots_of_glibc_2_43():
    lay = layout_for((2, 43))
    assert lay.tcache_counts_down and lay.tcache_bins == 76 and not lay.has_fastbins
    s = SynthHeap(version=(2, 43))
    tc = s.tcache(HEAP + 0x10, {0: [HEAP + 0x2010, HEAP + 0x2030]}, counts={i: 16 for i in range(76)} | {0: 14})
    t = walk_tcache(s.mem, s.layout, tc, fill_count=16)
    assert [(b.index, b.count, len(b.entries)) for b in t.bins] == [(0, 2, 2)]


def test_arena_ring_that_never_returns_to_main_arena_is_cut():
    s = SynthHeap()
    other = HEAP + 0x4000
    s.w(ARENA + s.layout.off_next, other)
    s.w(other + s.layout.off_next, other)
    ring, findings = walk_arena_ring(s.mem, s.layout, ARENA)
    assert ring == [ARENA, other] and "loops" in findings[0].message


def _first_heap():
    """A synthetic thread arena's first heap (0x21000 bytes, its heap_info and the arena at its start):
    (the SynthHeap, the heap's address, the arena's)."""
    s = SynthHeap()
    heap = 0x7F1000000000
    s.mem.add(heap, bytes(0x1000))
    arena = heap + s.layout.heap_info_size
    s.w(heap, arena)
    s.w(heap + 16, 0x21000)
    s.w(heap + 24, 0x21000)
    return s, heap, arena


def test_heap_chain_is_checked_against_its_arena():
    s, heap, arena = _first_heap()
    heaps, findings = walk_heaps(s.mem, s.layout, arena, heap + 0x900)
    assert [(h.address, h.size, h.prev) for h in heaps] == [(heap, 0x21000, 0)] and findings == []
    heaps, findings = walk_heaps(s.mem, s.layout, arena + 0x10, heap + 0x900)
    assert heaps == [] and "ar_ptr" in findings[0].message


def test_the_arena_s_own_heap_is_kept_when_the_heap_of_top_is_gone():
    """A core cut above the arena's first heap, taking the newer heap that holds top: the chain from top is an
    error at the missing heap_info, and the heap holding the arena is still walked (its chunks, and where
    they stop, named) instead of none of the arena's."""
    s, heap, arena = _first_heap()
    newer = heap + 0x4000000
    heaps, findings = walk_heaps(s.mem, s.layout, arena, newer + 0x900)
    assert [(h.address, h.size, h.prev) for h in heaps] == [(heap, 0x21000, 0)]
    assert [(f.kind, f.address) for f in findings] == [(Kind.HEAP_INFO, newer)]


def test_bin_index_functions_follow_glibc():
    assert bin_index(0x20) == 2 and bin_index(0x3f0) == 63
    assert [largebin_index(s) for s in (0x400, 0x440, 0xc40, 0x1000, 0x3000, 0x10000, 0x100000)] == \
        [64, 65, 97, 99, 113, 121, 126]
    assert reveal(0x555555559010, (0x555555559010 >> 12) ^ 0x55555555a000) == 0x55555555a000


def test_cached_memory_reads_across_blocks_and_reports_holes():
    image = ImageMemory({0x10000: bytes(range(256)) * 1024})  # 256 KiB
    mem = CachedMemory(image.read)
    assert mem.read(0x10000 + 0xFFFE, 4) == bytes([0xFE, 0xFF, 0x00, 0x01])
    try:
        mem.read(0x10000 + 256 * 1024 - 2, 4)
    except ReadError as exc:
        assert exc.address >= 0x10000 + 256 * 1024 - 2
    else:
        raise AssertionError("reading past the image must fail")
    big = mem.read(0x10000, 256 * 1024)
    assert len(big) == 256 * 1024 and big[:4] == bytes([0, 1, 2, 3])


def test_a_dropped_cache_holds_nothing_and_reads_the_same_again():
    image = ImageMemory({0x10000: bytes(range(256)) * 1024})
    reads: list[int] = []

    def raw(address: int, size: int) -> bytes:
        reads.append(address)
        return image.read(address, size)

    mem = CachedMemory(raw)
    first = [mem.read(0x10000 + k * 0x3000, 8) for k in range(20)]
    asked = len(reads)
    assert [mem.read(0x10000 + k * 0x3000, 8) for k in range(20)] == first and len(reads) == asked
    drop_cached(mem)
    drop_cached(image)                   # memory that caches nothing: nothing to drop
    assert mem._held == 0 and not mem._blocks
    assert [mem.read(0x10000 + k * 0x3000, 8) for k in range(20)] == first and len(reads) > asked


def test_the_cache_reads_a_page_a_hop_and_whole_blocks_along_a_walk():
    """Hops far apart (lists through a heap, larger than the cache or not) load one page each, a walk upwards
    loads whole blocks (after one page where it starts), a second page wanted of a block while the cache has
    room loads it whole, and every byte read is the target's, holes included."""
    block, page = CachedMemory.BLOCK, CachedMemory.PAGE
    rng = random.Random(5)
    low = bytes(rng.getrandbits(8) for _ in range(40 * block + 3 * page))
    high = bytes(rng.getrandbits(8) for _ in range(24 * block - 5 * page))
    image = ImageMemory({0x100000: low, 0x100000 + 40 * block + 5 * page: high})   # a hole of 2 pages
    end = 0x100000 + 64 * block
    reads: list[int] = []

    def raw(address: int, size: int) -> bytes:
        reads.append(size)
        return image.read(address, size)

    mem = CachedMemory(raw, max_blocks=4)
    for at in range(0x100000, 0x100000 + 8 * block, 64):
        assert mem.read(at, 16) == image.read(at, 16)
    assert reads == [page] + [block] * 8
    del reads[:]
    roomy = CachedMemory(raw, max_blocks=64)
    for at in (0x100000 + 20 * block + 5 * page, 0x100000 + 20 * block + 9 * page, 0x100000 + 20 * block):
        assert roomy.read(at, 8) == image.read(at, 8)
    assert reads == [page, block]
    del reads[:]
    for _ in range(2000):
        at = rng.randrange(0x100000, end - 16)
        hole = 0x100000 + 40 * block + 3 * page <= at + 16 and at < 0x100000 + 40 * block + 5 * page
        if hole:
            with pytest.raises(ReadError):
                mem.read(at, 16)
            continue
        assert mem.read(at, 16) == image.read(at, 16)
        start, span = mem.span_at(at)
        assert start <= at < start + len(span) and bytes(span) == image.read(start, len(span))
        held = sum(len(b) if isinstance(b, bytes) else sum(len(p or b"") for p in b.values())
                   for b in mem._blocks.values())
        assert held <= 4 * block
    assert reads.count(page) > 10 * reads.count(block)
    del reads[:]
    for at in range(0x100000 + 48 * block, end, 256):
        assert mem.read(at, 16) == image.read(at, 16)
    assert reads.count(block) >= 14 and reads.count(page) <= 2 * CachedMemory.PAGES_BEFORE_BLOCK


class _PlainMemory:
    """Memory with reads only (no spans): the walkers' careful path for every list."""

    def __init__(self, mem):
        self.read = mem.read


def _cached(s: SynthHeap) -> CachedMemory:
    """S's memory behind a block cache, its arena padded to a whole page (the cache reads whole pages)."""
    arena = s.mem.segments[ARENA]
    arena.extend(bytes(-len(arena) % 0x1000))
    return CachedMemory(s.mem.read)


def _scattered(s: SynthHeap, count: int, size: int, block_end: int) -> list[int]:
    """COUNT chunks of SIZE spread over the heap in a shuffled order, one with its header across the
    64 KiB block boundary BLOCK_END."""
    import random
    spots = [HEAP + 0x100 + k * 0x400 for k in range(count - 1)] + [block_end - 0x10]
    random.Random(7).shuffle(spots)
    return [s.chunk(c, size | 1) for c in spots]


def test_sound_lists_read_in_one_pass_equal_the_careful_walk():
    from heapwalk.glibc.walk.lists import _sound_bin, _sound_fastbin
    s = SynthHeap(heap_size=0x40000)
    block_end = (HEAP + 0x10000) & ~0xFFFF
    chunks = _scattered(s, 150, 0x90, block_end)
    s.link_bin(9, chunks)
    cached = _cached(s)
    head = s.layout.bin_header(ARENA, 9)
    assert _sound_bin(cached, head, 9, 1 << 20) is not None
    quick, careful = walk_bin(cached, s.layout, ARENA, 9, 0x40000), walk_bin(_PlainMemory(s.mem), s.layout,
                                                                               ARENA, 9, 0x40000)
    assert quick == careful and tuple(quick[0].chunks) == tuple(chunks) and quick[1] == []

    t = SynthHeap(heap_size=0x40000)
    entries = _scattered(t, 150, 0x20, block_end)
    t.w(t.fastbin_slot(0), entries[0])
    for e, nxt in zip(entries, entries[1:] + [0]):
        t.w(e + 16, t.protect(e + 16, nxt))
    cached = _cached(t)
    assert _sound_fastbin(cached, t.fastbin_slot(0), 0x20, True, 1 << 20) is not None
    quick, careful = walk_fastbin(cached, t.layout, ARENA, 0, 0x40000), walk_fastbin(_PlainMemory(t.mem), t.layout,
                                                                                   ARENA, 0, 0x40000)
    assert quick == careful and tuple(quick[0].chunks) == tuple(entries) and quick[1] == []


def test_a_long_cycle_is_caught_and_reported_by_the_careful_walk():
    s = SynthHeap(heap_size=0x40000)
    chunks = [s.chunk(HEAP + 0x100 + k * 0x100, 0x91) for k in range(300)]
    s.link_bin(9, chunks)
    s.w(chunks[-1] + 16, chunks[37])      # the last chunk leads back into the middle: 263 chunks go round
    b, findings = walk_bin(s.mem, s.layout, ARENA, 9, 0x40000)
    assert b.count == 300 and not b.complete
    cycle = [f for f in findings if f.kind is Kind.LIST_CYCLE]
    assert [(f.address, f.found) for f in cycle] == [(chunks[-1], hex(chunks[37]))]

    t = SynthHeap(heap_size=0x40000)
    entries = [t.chunk(HEAP + 0x100 + k * 0x100, 0x21) for k in range(300)]
    t.w(t.fastbin_slot(0), entries[0])
    for e, nxt in zip(entries, entries[1:] + [entries[37]]):
        t.w(e + 16, t.protect(e + 16, nxt))
    fb, findings = walk_fastbin(t.mem, t.layout, ARENA, 0, 0x40000)
    assert fb.count == 300 and not fb.complete
    assert [(f.address, f.kind) for f in findings] == [(entries[-1], Kind.LIST_CYCLE)]


def test_a_bin_lists_sizes_are_the_same_from_an_array_or_a_tuple():
    """BinList masks the flags off its raw sizes on whole arrays when given array('Q'), one by one otherwise."""
    raw = (0x21, 0x7FFFFFFFFFFFFFF5, 0xFFFFFFFFFFFFFFFF, 0x30, 0x457)
    from_array = BinList(BinKind.SMALL, 2, 0, array("Q", [1] * 5), array("Q", raw))
    from_tuple = BinList(BinKind.SMALL, 2, 0, (1,) * 5, raw)
    assert list(from_array.sizes) == list(from_tuple.sizes) == [s & ~7 for s in raw]
    assert (from_array.total, from_array.raw_total, from_array.min_size, from_array.max_size) == \
        (from_tuple.total, from_tuple.raw_total, 0x20, 0xFFFFFFFFFFFFFFF8)


def test_each_bin_s_size_range_is_what_bin_index_gives_it():
    """The one pass checks a list's sizes against its bin's range (`indexlists._BIN_RANGES`): every size, at
    every step of glibc's bin_index and at random, lies in the range of exactly the bin bin_index gives it."""
    from heapwalk.glibc.bulk.indexlists import _BIN_RANGES, _sizes_in
    rng = random.Random(7)
    sizes = list(range(32, 1 << 21, 16)) + [rng.randrange(1 << 21, 1 << 63) for _ in range(2000)] + [(1 << 63) - 16]
    for size in sizes:
        index = bin_index(size)
        assert [i for i in range(2, 127) if _BIN_RANGES[i][0] <= size < _BIN_RANGES[i][1]] == [index]
        assert _sizes_in(np.array([size], dtype=np.uint64), *_BIN_RANGES[index])
    assert not _sizes_in(np.array([1 << 63], dtype=np.uint64), *_BIN_RANGES[126])     # no bin's, as bin_indices says


def test_a_bin_list_s_totals_are_exact_whatever_its_sizes():
    """A list's sizes, totals and extremes from arrays (numpy) equal those summed one by one, even where the
    sizes of a damaged list would wrap a 64-bit sum."""
    rng = random.Random(3)
    for raw in ([0x21, 0x31, 0x405], [], [2 ** 64 - 1, 2 ** 64 - 9, 0x20], [rng.getrandbits(64) for _ in range(500)],
                [0x410] * 1000):
        fast = BinList(BinKind.SMALL, 2, 0, array("Q", range(len(raw))), array("Q", raw))
        slow = BinList(BinKind.SMALL, 2, 0, list(range(len(raw))), list(raw))
        assert (list(fast.sizes), fast.total, fast.raw_total, fast.min_size, fast.max_size) == \
            (list(slow.sizes), slow.total, slow.raw_total, slow.min_size, slow.max_size)
        assert all(type(v) is int for v in (fast.total, fast.raw_total, fast.min_size, fast.max_size))
