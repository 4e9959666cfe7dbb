"""mimalloc's decoder without gdb: its version numbers, the system's rounding of its allocations, the segment
map found by its bits, and a segment's slices cut into pages and spans from bytes made by hand."""

from __future__ import annotations

import numpy as np
import pytest

from heapwalk.inferior.elf import Mapping
from heapwalk.mimalloc import decode, discovery
from heapwalk.mimalloc.find import version_of
from heapwalk.mimalloc.layout import LAYOUTS, layout_for

LAY = layout_for((2, 0, 9))
SEG = 32 << 20


def test_each_form_of_the_version_number():
    assert version_of(209) == (2, 0, 9)
    assert version_of(217) == (2, 1, 7)
    assert version_of(3010) == (3, 0, 10)
    assert version_of(30403) == (3, 4, 3)
    assert version_of(7) is None and version_of(1 << 20) is None


def test_the_system_s_rounding():
    assert decode.good_size(4600) == 8192
    assert decode.good_size(641 * 65536) == 44 << 20          # a huge segment of 40 MiB and a slice
    assert decode.good_size(SEG) == SEG
    assert decode.good_size(600 << 10) == 640 << 10
    assert decode.good_size(3 << 20 | 1) == (3 << 20) + (256 << 10)


def test_the_segment_map_is_the_array_whose_bits_are_the_segments():
    """To 2.1.7 the map is the array of the object's data whose bits hold every stamped segment with pages in
    use; a stamped segment with none (freed into 2.0's segment cache) may be out of it."""
    from heapwalk.mimalloc.segmap import flat_segment_map
    segments = [0x20000000000, 0x20002000000, 0x40000000000]
    words = np.zeros(20000, dtype=np.uint64)
    start = 500
    for s in segments:
        i, b = divmod(s >> LAY.segment_shift, 64)
        words[start + i] |= np.uint64(1 << b)
    words[start - 1] = np.uint64(1 << 0)        # a word before the map: no segment of it is known
    at, held = flat_segment_map(0x1000, words, segments, LAY, segments)
    assert at == 0x1000 + 8 * start and held == set(segments)
    at, held = flat_segment_map(0x1000, words, segments[:1], LAY, segments[:1])  # one stamped, other bits: no map
    assert at is None and held == {segments[0]}
    at, held = flat_segment_map(0x1000, words, segments[:2], LAY, segments[:2])  # one segment's stamp is lost
    assert at == 0x1000 + 8 * start and held == set(segments)
    cached = 0x20004000000                                                      # stamped, no page, not in the map
    at, held = flat_segment_map(0x1000, words, [*segments, cached], LAY, segments)
    assert at == 0x1000 + 8 * start and held == set(segments)
    assert flat_segment_map(0x1000, words, [*segments, cached], LAY, [*segments, cached])[0] is None


def test_the_map_s_candidates_are_every_place_holding_each_segment_s_bit():
    """The candidate maps (word places) are found by the required segments' bits over the whole array at once:
    the places where a window's bits hold every one of them, among many words with the lowest one's bit (a
    program's data that holds many addresses)."""
    from heapwalk.mimalloc.segmap import _holding
    rng = np.random.default_rng(7)
    segments = [0x20000000000, 0x20002000000, 0x20040000000, 0x40000000000]
    places = [divmod(s >> LAY.segment_shift, 64) for s in segments]
    n = 3 * LAY.segment_map_words
    words = np.zeros(n, dtype=np.uint64)
    for word, bit in places:
        words[rng.random(n) < 0.6] |= np.uint64(1 << bit)
    listed = words.tolist()
    for k in (1, 2, 4):
        slow = [s for s in range(n)
                if all(s + w < n and listed[s + w] >> b & 1 for w, b in places[:k])]
        assert _holding(words, LAY, set(segments[:k])).tolist() == slow and slow
    assert not len(_holding(words, LAY, {0x20000000000, (LAY.segment_map_words * 64) << LAY.segment_shift}))


def test_files_and_unread_pages_are_no_segments():
    regions = [(0x1000, 0x9000), (0x20000000000, 0x20004000000)]
    maps = [Mapping(0x2000, 0x3000, 0, "/lib/x.so")]
    assert discovery._anonymous(regions, maps, None) == [(0x1000, 0x2000), (0x3000, 0x9000),
                                                          (0x20000000000, 0x20004000000)]
    assert discovery._anonymous(regions, maps, [(0x20000000000, 0x20000001000)]) == [(0x20000000000, 0x20000001000)]


class _Memory:
    """Bytes at addresses, as a target's memory."""

    def __init__(self, at: int, data: bytes):
        self.at, self.data = at, data

    def read(self, address: int, size: int) -> bytes:
        from heapwalk.inferior.memory import ReadError
        lo = address - self.at
        if lo < 0 or lo + size > len(self.data):
            raise ReadError(address, size, "not in the test's memory")
        return self.data[lo:lo + size]


def _segment_bytes(pages: list[tuple[int, int, int, int]]) -> bytearray:
    """A normal segment's header: one info slice, then PAGES as (first slice, slices, block size, used), the rest
    one free span; every slice committed."""
    head = bytearray(LAY.seg_slices + 513 * LAY.page)
    put = lambda off, value, n=8: head.__setitem__(slice(off, off + n), value.to_bytes(n, "little"))  # noqa: E731
    put(LAY.seg_slices_count, LAY.slices_per_segment)
    put(LAY.seg_info_slices, 1)
    put(LAY.seg_slice_entries, 512)
    put(LAY.seg_thread_id, 0x7F0000001000)
    head[LAY.seg_commit_mask:LAY.seg_commit_mask + 64] = b"\xff" * 64
    slot = lambda i: LAY.seg_slices + i * LAY.page                                        # noqa: E731
    put(slot(0) + LAY.page_slice_count, 1, 4)
    put(slot(0) + LAY.page_block_size, 65536, 4)
    end = 1
    for first, count, size, used in pages:
        put(slot(first) + LAY.page_slice_count, count, 4)
        put(slot(first) + LAY.page_block_size, size, 4)
        put(slot(first) + LAY.page_used, used, 4)
        put(slot(first) + LAY.page_capacity, used, 2)
        put(slot(first) + LAY.page_reserved, (count * 65536 - 384) // size, 2)
        end = first + count
    put(slot(end) + LAY.page_slice_count, 512 - end, 4)
    return head


def test_a_segment_s_slices_are_cut_into_pages_and_a_free_span():
    at = 0x20000000000
    mem = _Memory(at, bytes(_segment_bytes([(1, 1, 64, 10), (2, 8, 8192, 3)])))
    findings = []
    found = discovery.MiDiscovery(LAY, (2, 0, 9), "x", 0, 0, (at,), (), None, None, ())
    seg = decode._segment(mem, found, at, True, findings)
    assert not findings
    assert [(p.index, p.slices, p.block_size, p.used, p.start - at) for p in seg.pages] == [
        (1, 1, 64, 10, 65536 + 384), (2, 8, 8192, 3, 2 * 65536)]
    assert [(s.index, s.slices, s.committed) for s in seg.spans] == [(10, 502, 502 * 65536)]
    assert seg.reserved == SEG and seg.committed == SEG


def test_a_slice_that_starts_nothing_stops_the_walk_with_a_finding():
    at = 0x20000000000
    head = _segment_bytes([(1, 1, 64, 10)])
    head[LAY.seg_slices + 2 * LAY.page:LAY.seg_slices + 3 * LAY.page] = bytes(LAY.page)    # slice 2: count 0
    findings = []
    found = discovery.MiDiscovery(LAY, (2, 0, 9), "x", 0, 0, (at,), (), None, None, ())
    seg = decode._segment(_Memory(at, bytes(head)), found, at, True, findings)
    assert len(seg.pages) == 1 and not seg.spans
    assert findings and findings[0].kind is decode.SEGMENT and "slice 2" in findings[0].message


def _state(seg) -> decode.MiState:
    found = discovery.MiDiscovery(LAY, (2, 0, 9), "x", 0, 0, (seg.address,), (), None, None, ())
    return decode.MiState(found, [seg], [], [], [])


def test_check_names_a_page_whose_counters_do_not_add_up():
    """A page that counts more blocks in use than it cut, and one whose blocks in use and free are not its capacity,
    are each an error at the page; a segment that counts other pages than it holds too."""
    from heapwalk.mimalloc import check
    at = 0x20000000000
    head = _segment_bytes([(1, 1, 64, 10), (2, 8, 8192, 3)])
    findings = []
    found = discovery.MiDiscovery(LAY, (2, 0, 9), "x", 0, 0, (at,), (), None, None, ())
    seg = decode._segment(_Memory(at, bytes(head)), found, at, True, findings)
    seg.used = 2
    assert check.check_mimalloc(_Memory(at, bytes(head)), _state(seg)) == []
    seg.pages[0].used, seg.pages[1].free, seg.used = 11, 1, 3
    got = check.check_mimalloc(_Memory(at, bytes(head)), _state(seg))
    assert [(f.address, f.kind) for f in got] == [(at, check.COUNTS), (seg.pages[0].address, check.COUNTS),
                                                 (seg.pages[1].address, check.COUNTS)]
    assert "counts 11 blocks in use of 10" in got[1].message


def test_each_release_has_its_own_layout():
    """The layouts measured: 2.0.5 (64 MiB segments), 2.0.6, 2.0.7 (a heap with an arena id), 2.0.9 (32 MiB
    segments), 2.1.2 (arenas), 2.1.4 (a page's explicit block size and start), 2.1.8 (no segment map for arena
    segments), 2.2.2, 2.2.6 (other heaps and thread data), 2.3.0 and 2.3.2 (a purge no longer counted on Linux);
    releases between or around them have none (named, not guessed), those never tagged included."""
    assert [lay.versions for lay in LAYOUTS] == ["2.0.5", "2.0.6", "2.0.7", "2.0.9", "2.1.2", "2.1.4 to 2.1.6",
                                                 "2.1.7", "2.1.8 to 2.1.9", "2.2.2 to 2.2.4", "2.2.6 to 2.2.7",
                                                 "2.3.0 to 2.3.1", "2.3.2"]
    assert layout_for((2, 0, 5)).segment_size == 64 << 20 and layout_for((2, 0, 9)).segment_size == 32 << 20
    assert layout_for((2, 0, 7)).heap_cookie == 2864 and layout_for((2, 0, 6)).heap_cookie == 2856
    assert layout_for((2, 0, 5)).mask_bytes == 128 and layout_for((2, 0, 9)).mask_bytes == 64
    assert layout_for((2, 0, 8)) is None and layout_for((2, 0, 4)) is None and layout_for((3, 0, 1)) is None
    assert all(layout_for(v) is None for v in ((2, 1, 0), (2, 1, 1), (2, 1, 3), (2, 2, 0), (2, 2, 5), (2, 3, 3)))
    assert layout_for((2, 1, 2)).seg_memkind == 20 and layout_for((2, 1, 5)).page_start_field == 48
    assert not layout_for((2, 1, 6)).segment_map_parts and layout_for((2, 1, 8)).segment_map_parts == 25
    assert not layout_for((2, 1, 6)).collect_purges_own and layout_for((2, 1, 7)).collect_purges_own
    assert layout_for((2, 2, 4)).thread_data == 8240 and layout_for((2, 2, 6)).thread_data == 8216
    assert layout_for((2, 3, 2)).page_start_field == 48 and layout_for((2, 3, 1)).heap_pages == 1288
    assert layout_for((2, 3, 2)).segment_map_parts and not layout_for((2, 3, 2)).purge_counted
    assert layout_for((2, 3, 1)).purge_counted and layout_for((2, 3, 1)).stat_drifts
    assert not layout_for((2, 3, 2)).stat_drifts and not layout_for((2, 0, 9)).stat_drifts


def test_where_a_page_s_blocks_start():
    """2.0.5 to 2.0.7: 128 bytes into the slice for blocks up to 1 KiB; 2.0.9: 384; 2.1.2: 3 blocks up to 64
    bytes, one block up to 512, else none."""
    assert [layout_for((2, 0, 5)).page_start(n) for n in (8, 1024, 2048)] == [128, 128, 0]
    assert [layout_for((2, 0, 9)).page_start(n) for n in (8, 1024, 2048)] == [384, 384, 0]
    assert [layout_for((2, 1, 2)).page_start(n) for n in (8, 64, 80, 512, 640)] == [24, 192, 80, 512, 0]


class _Pieces:
    """Memory made of pieces at addresses."""

    def __init__(self, pieces: dict[int, bytes]):
        self.pieces = pieces

    def read(self, address: int, size: int) -> bytes:
        from heapwalk.inferior.memory import ReadError
        for at, data in self.pieces.items():
            if at <= address and address + size <= at + len(data):
                return data[address - at:address - at + size]
        raise ReadError(address, size, "not in the test's memory")


def _arena_bytes(lay, arena_id: int, start: int, blocks: int, inuse: int, committed_at: int) -> bytes:
    fields = -(-blocks // 64)
    head = bytearray(lay.arena_inuse + 8 * fields)
    if lay.arena_id is not None:
        head[lay.arena_id:lay.arena_id + 4] = arena_id.to_bytes(4, "little")
    head[lay.arena_start:lay.arena_start + 8] = start.to_bytes(8, "little")
    head[lay.arena_blocks:lay.arena_blocks + 8] = blocks.to_bytes(8, "little")
    head[lay.arena_fields:lay.arena_fields + 8] = fields.to_bytes(8, "little")
    head[lay.arena_committed:lay.arena_committed + 8] = committed_at.to_bytes(8, "little")
    head[lay.arena_inuse:lay.arena_inuse + 8 * fields] = inuse.to_bytes(8 * fields, "little")
    return bytes(head)


def test_the_arenas_are_found_from_a_segment_s_memid():
    """2.1.2: a segment taken from arena 2 at its block 3 gives the arena's start; the table of the library's data
    whose second entry describes an arena starting there gives both arenas, with their blocks committed and in
    use; a table whose entries do not carry their ids is not it."""
    from heapwalk.mimalloc import arenas
    lay = layout_for((2, 1, 2))
    base = 0x7F0000000000
    a1, a2, bits = 0x7F1000000000, 0x7F1000001000, 0x7F1000002000
    start1, start2 = 0x20000000000, 0x20040000000
    words = np.zeros(64, dtype=np.uint64)
    words[3] = np.uint64(0xDEAD0)                     # a word before the table, no pointer
    words[8], words[9] = np.uint64(a1), np.uint64(a2)
    mem = _Pieces({a1: _arena_bytes(lay, 1, start1, 32, (1 << 32) - 1, 0),
                   a2: _arena_bytes(lay, 2, start2, 32, 0b1111, bits), bits: (0b11).to_bytes(8, "little")})
    segment = start2 + 3 * lay.segment_size
    found = arenas.find_arenas(mem, base, words, lay, (segment, 2, 3))
    assert [(a.id, a.start, a.blocks, a.committed_blocks(), a.inuse) for a in found] == [
        (1, start1, 32, 32, (1 << 32) - 1), (2, start2, 32, 2, 0b1111)]
    assert found[1].block_of(segment) == 3 and found[0].reserved == 1 << 30
    assert arenas.find_arenas(mem, base, words, lay, (segment, 2, 4)) == ()    # the segment names another start
    words[9] = np.uint64(a1)                                                       # entry 2 is arena 1: no table
    assert arenas.find_arenas(mem, base, words, lay, (segment, 2, 3)) == ()


@pytest.mark.parametrize("version", [(2, 0, 6), (2, 0, 9)])
def test_2_0_arenas_are_found_from_a_segment_s_memid_word(version):
    """To 2.0.9 a segment's memid is a word: its arena's number in the low 7 bits (0: from the system), its block
    from bit 8; an arena's number is in its description from 2.0.7, its place in the table before; its description
    and bitmaps come from the system (two bitmaps when it is committed whole, three when it decommits)."""
    from heapwalk.mimalloc import arenas
    lay = layout_for(version)
    base, a1, a2, bits = 0x7F0000000000, 0x7F1000000000, 0x7F1000001000, 0x7F1000002000
    start1, start2 = 0x7E0000000000, 0x7E0100000000
    words = np.zeros(80, dtype=np.uint64)
    words[16], words[17] = np.uint64(a1), np.uint64(a2)
    mem = _Pieces({a1: _arena_bytes(lay, 1, start1, 128, 0b111, 0),
                   a2: _arena_bytes(lay, 2, start2, 16, 0b1, bits), bits: (0b1).to_bytes(8, "little")})
    head = bytearray(24)
    assert arenas.segment_arena(bytes(head), lay) is None                              # from the system
    head[0:8] = (3 << 8 | 2).to_bytes(8, "little")
    segment = start2 + 3 * lay.segment_size
    assert arenas.segment_arena(bytes(head), lay) == (2, 3)
    assert arenas.arena_segment(_Pieces({segment: bytes(head)}), lay, [segment]) == (segment, 2, 3)
    found = arenas.find_arenas(mem, base, words, lay, (segment, 2, 3))
    assert [(a.id, a.start, a.blocks, a.committed_blocks()) for a in found] == [(1, start1, 128, 128),
                                                                                (2, start2, 16, 1)]
    assert [a.meta for a in found] == [lay.arena_inuse + 8 + 2 * 8 * 2, lay.arena_inuse + 8 + 3 * 8]
    assert found[0].purge == 0 and found[1].reserved == 16 * lay.segment_size


def test_what_reclaiming_an_abandoned_2_0_segment_decommits():
    """2.0: mi_collect(true) on the main thread reclaims an abandoned segment slice by slice.  In 2.0.9 the first
    free span (a page that holds no block, with the free span after it) decommits what waited, its own committed
    slices with it, when something waited; nothing when nothing did, nor before 2.0.9; a segment left with no page
    goes whole (its committed slices); one of an arena committed as a whole gives nothing."""
    from heapwalk.mimalloc.arenas import MiArena
    from heapwalk.mimalloc.collect import _reclaimed20
    at = 0x20000000000

    def page(index: int, used: int) -> decode.MiPage:
        return decode.MiPage(at, index, at + 0x100 + index * 80, 1, at + index * 65536, 64, 64, 1024, used, 0, False)

    def segment(pages, spans, pending, arena=None) -> decode.MiSegment:
        return decode.MiSegment(at, 0, 512, 1, 0, len(pages), len(pages), 0, SEG, SEG, 0, pending_mask=pending,
                                commit_mask=(1 << 512) - 1, arena=arena, pages=pages,
                                spans=[decode.MiSpan(at, i, n, 0, 0) for i, n in spans])

    held, empty = page(1, 5), page(3, 0)
    seg = segment([held, empty], [(4, 2), (8, 504)], 0b11 << 10)
    assert _reclaimed20(seg, True) == [(at + 3 * 65536, at + 6 * 65536), (at + 10 * 65536, at + 12 * 65536)]
    assert _reclaimed20(seg, False) == []
    assert _reclaimed20(segment([held, empty], [(4, 2)], 0), True) == []
    assert _reclaimed20(segment([page(1, 0), page(3, 0)], [(4, 508)], 0), False) == [(at, at + SEG)]
    pinned = MiArena(0x1000, 1, at, 4, SEG, 0b1111, 0b1, pinned=True)
    assert _reclaimed20(segment([page(1, 0)], [(2, 510)], 0b1 << 5, pinned), True) == []


def test_what_collect_gives_back_follows_the_main_heap_s_queues():
    """2.3: mi_collect(true) visits the main heap's pages queue by queue; each visit purges what waits in its
    segment, and a page with no block in use is freed then, its slices waiting in turn (a retired one is freed
    before the visit); a segment of the main thread left with no page in use goes whole; another thread's
    segment gives nothing."""
    from heapwalk.mimalloc.collect import collected
    lay = layout_for((2, 3, 2))
    main, other, at = 0x7F0000001000, 0x7F0000002000, 0x20000000000

    def page(seg: int, index: int, used: int) -> decode.MiPage:
        return decode.MiPage(seg, index, seg + 0x100 + index * lay.page, 1, seg + index * 65536, 64, 64, 1024, used,
                             0x55000000, False, free=64 - used)

    def segment(address: int, thread: int, pages: list, pending: int = 0) -> decode.MiSegment:
        return decode.MiSegment(address, 0, 512, 1, thread, len(pages), 0, 0, SEG, SEG, 0, pending_mask=pending,
                                pages=pages)

    retired, held, last = page(at, 1, 0), page(at, 2, 5), page(at, 3, 0)
    emptied = page(at + SEG, 1, 0)
    theirs = page(at + 2 * SEG, 1, 0)
    segments = [segment(at, main, [retired, held, last], pending=1 << 20),
                segment(at + SEG, main, [emptied]), segment(at + 2 * SEG, other, [theirs], pending=1 << 7)]
    found = discovery.MiDiscovery(lay, (2, 3, 2), "x", 0, 0, tuple(s.address for s in segments), (), None, None, ())
    state = decode.MiState(found, segments, [], [], [], main_thread=main)
    state.main_queues = [(last.address, False), (held.address, False), (retired.address, True),
                         (emptied.address, False)]
    assert collected(state) == [(at + 65536, at + 2 * 65536), (at + 3 * 65536, at + 4 * 65536),
                                (at + 20 * 65536, at + 21 * 65536), (at + SEG, at + 2 * SEG)]
    state.main_queues = [(held.address, False), (retired.address, True), (last.address, False)]
    assert collected(state) == [(at + 65536, at + 2 * 65536), (at + 20 * 65536, at + 21 * 65536)]


def test_the_segment_map_s_parts_hold_the_segments_from_the_system():
    """2.2 on: the table of the data whose part holds the bit of a segment taken from the system is the segment
    map; a stamped segment whose bit is clear is not held (freed); a table with an entry that is no part (its
    memory does not start with its address) is not it; with no segment below 48 TiB no table is looked for."""
    from heapwalk.mimalloc.segmap import find_map_parts
    lay = layout_for((2, 3, 2))
    part, span = 0x7F0000000000, (8 * (8 * 1024 - 128)) << 25
    live, freed = span + (3 << 25), span + (5 << 25)        # in the second part's span: bits 3 and 5
    bitmap = bytearray(8 * 1024)
    bitmap[:8] = part.to_bytes(8, "little")     # its memory id: the system's memory at its own address
    bitmap[lay.map_part_head] = 1 << 3
    words = np.zeros(40, dtype=np.uint64)
    words[10 + 1] = part                        # the table at word 10: its entry 1 is the part
    words[3 + 1] = part + 4096                  # a table at word 3 would name no part
    got = find_map_parts(_Memory(part, bytes(bitmap)), 0x1000, words, lay, [live, freed])
    assert got is not None and got.table == 0x1000 + 8 * 10 and got.parts == (part,)
    assert got.held == {live} and got.part_size(lay) == 8088
    assert find_map_parts(_Memory(part, bytes(bitmap)), 0x1000, words, lay, [49 << 40]) is None


def test_a_segment_above_the_map_s_addresses_is_live_and_the_map_still_found():
    """mimalloc's hints reach 30 TiB, and its flat segment map covers 20 TiB (40 TiB in 2.1.2 to 2.1.7): a
    segment above is in no map, and live while mapped; the map is found by the segments below."""
    from types import SimpleNamespace
    low, high = 0x20000000000, 25 << 40
    words = np.zeros(LAY.segment_map_words + 600, dtype=np.uint64)
    i, b = divmod(low >> LAY.segment_shift, 64)
    words[500 + i] = np.uint64(1 << b)
    found = SimpleNamespace(version=(2, 0, 9), named="libmimalloc.so.2.0")
    at, in_map, arenas, segments, freed, unstamped = discovery._by_map(_Memory(0, b""), 0x1000, words, LAY,
                                                                      [low, high], found)
    assert at == 0x1000 + 8 * 500 and segments == (low, high) and not freed and not unstamped
    assert LAY.segment_map_words == 10241 and layout_for((2, 1, 2)).segment_map_words == 20481


def test_the_2_0_segment_cache_is_found_by_its_slots_and_bitmap():
    """2.0.9's segment cache: the slots in use (a segment-aligned address, its memid, pinned 0 or 1, its commit
    mask) sit at one stride in the data, at the places of the bits of a 16-word bitmap, and another has all the
    other bits set; a segment-aligned word elsewhere (mimalloc's address hint) and a live segment's address are
    not slots; without both bitmaps there is no table."""
    from heapwalk.mimalloc.segcache import SLOTS, find_segment_cache, slot_words
    lay = layout_for((2, 0, 9))
    stride, base = slot_words(lay), 0x7F0000000000
    words = np.zeros(64 + SLOTS * stride + 64, dtype=np.uint64)
    table, bitmap = 64, 16
    words[8], words[9] = np.uint64(0x47376000000), np.uint64(0x200000)       # an address hint, not a slot
    kept = {3: (0x47362000000, 0xFF), 700: (0x47364000000, 0)}
    for index, (segment, mask) in kept.items():
        at = table + index * stride
        words[at], words[at + 3] = np.uint64(segment), np.uint64(mask)
    words[bitmap + 0], words[bitmap + 10] = np.uint64(1 << 3), np.uint64(1 << (700 - 640))
    words[40:56] = ~words[bitmap:bitmap + 16]
    at, slots = find_segment_cache(base, words, lay, set())
    assert at == base + 8 * table
    assert [(s.segment, s.commit_mask, s.pinned) for s in slots] == [(0x47362000000, 0xFF, False),
                                                                      (0x47364000000, 0, False)]
    assert find_segment_cache(base, words, lay, {0x47362000000}) == (None, ())     # a live segment is no slot
    words[40] = ~np.uint64(0)
    assert find_segment_cache(base, words, lay, set()) == (None, ())               # no bitmap of those available
    words[40], words[bitmap + 10] = ~np.uint64(1 << 3), np.uint64(0)
    assert find_segment_cache(base, words, lay, set()) == (None, ())               # the bitmap does not hold it


def test_a_segment_whose_slices_run_past_its_arena_is_a_finding_held_to_the_arena():
    """2.0.9: a segment taken from arena 1's block 2 of 4 whose slice count (damaged) claims 2 TiB is an error at
    the segment; it is counted to the arena's end, and the arena's free blocks are never below zero."""
    from heapwalk.mimalloc.arenas import MiArena
    start = 0x20000000000
    at = start + 2 * SEG
    arena = MiArena(0x7F0000002000, 1, start, 4, SEG, committed=0b1111, inuse=0b0100)
    head = _segment_bytes([(1, 1, 64, 10)])
    head[LAY.seg_memid:LAY.seg_memid + 8] = (1 | 2 << 8).to_bytes(8, "little")
    found = discovery.MiDiscovery(LAY, (2, 0, 9), "x", 0, 0, (at,), (), None, None, (), arenas=(arena,))
    findings = []
    seg = decode._segment(_Memory(at, bytes(head)), found, at, True, findings)
    assert not findings and seg.arena is arena and seg.reserved == SEG
    assert decode.MiState(found, [seg], [], [], []).arena_free() == 3 * SEG
    head[LAY.seg_slices_count:LAY.seg_slices_count + 8] = (LAY.slices_per_segment | 1 << 25).to_bytes(8, "little")
    seg = decode._segment(_Memory(at, bytes(head)), found, at, True, findings)
    assert [(f.address, f.kind) for f in findings] == [(at, decode.SEGMENT)]
    assert "run past the end of its arena" in findings[0].message
    assert seg.reserved == 2 * SEG and seg.slices == 2 * LAY.slices_per_segment
    assert decode.MiState(found, [seg], [], [], []).arena_free() == 2 * SEG
    assert decode.MiState(found, [seg, seg, seg], [], [], []).arena_free() == 0
