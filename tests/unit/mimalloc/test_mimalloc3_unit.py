"""mimalloc 3's decoder without gdb, on memory made by hand: the arenas' bitmaps read as runs of slices, the
arenas found through the subprocess (and their commit counted as mimalloc counts it), the page map found by
its shape and walked, the system's settings, and a version not measured named."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from heapwalk.mimalloc import bits, discovery, families
from heapwalk.mimalloc.v3 import arenas, pagemap
from heapwalk.mimalloc.v3.discovery import _overcommit
from heapwalk.mimalloc.v3.layout import layout3_for
from test_mimalloc_unit import _Pieces

LAY = layout3_for((3, 0, 1))


def _words(*values: int) -> bytes:
    return b"".join(v.to_bytes(8, "little") for v in values)


def test_bit_runs_and_counts():
    assert bits.bit_runs(0b1110_0110_0001) == [(0, 1), (5, 7), (9, 12)]
    assert bits.bit_runs(0) == []
    assert bits.bit_runs((1 << 600) - 1 << 10) == [(10, 610)]
    assert bits.bits_in(0b1110_0110_0001, 4, 6) == 3


def _bitmap(bits: int, binned: bool = False) -> bytes:
    """A mi_bitmap_t (a binned one: BINNED) of one chunk holding BITS."""
    head = bytearray(LAY.bbitmap_chunks if binned else LAY.bitmap_chunks)
    head[0:8] = (1).to_bytes(8, "little")
    return bytes(head) + bits.to_bytes(64, "little")


def _arena(at: int, subproc: int, slices: int, info: int, maps: dict[str, int], eager: bool) -> dict[int, bytes]:
    """An arena at AT of SLICES, its bitmaps (free, committed, dirty, purge, pages) from MAPS, each placed after
    its description."""
    head = bytearray(LAY.arena_bitmaps + 40)
    head[0:16] = _words(at, slices * 65536)
    head[LAY.arena_memkind] = 4                        # from the system
    head[LAY.arena_initially_committed] = 1 if eager else 0
    head[LAY.arena_subproc:LAY.arena_subproc + 8] = subproc.to_bytes(8, "little")
    head[LAY.arena_slice_count:LAY.arena_slice_count + 8] = slices.to_bytes(8, "little")
    head[LAY.arena_info_slices:LAY.arena_info_slices + 8] = info.to_bytes(8, "little")
    pieces, where = {}, at + 0x1000
    for k, name in enumerate(("free", "committed", "dirty", "purge", "pages")):
        head[LAY.arena_bitmaps + 8 * k:LAY.arena_bitmaps + 8 * k + 8] = where.to_bytes(8, "little")
        pieces[where] = _bitmap(maps[name], name == "free")
        where += 0x1000
    pieces[at] = bytes(head)
    return pieces


def test_the_arenas_come_from_the_subprocess_and_count_their_commit_as_mimalloc_does():
    """Two arenas the subprocess lists, each pointing back to it: an arena committed at once on a system that
    overcommits counts the slices it touched (not its own), else its committed bitmap; its free slices whose
    purge waits are what a purge decommits (those its committed bitmap holds); an arena that points to another
    subprocess is no arena of it."""
    sub, a1, a2 = 0x7F0000001000, 0x7F1000000000, 0x7F2000000000
    maps = {"free": 0b1111_0000, "committed": (1 << 12) - 1, "dirty": 0b0011_1111, "purge": 0b0011_0000,
            "pages": 0b1000}
    pieces = {sub: _words(2, a1, a2), **_arena(a1, sub, 12, 3, maps, True), **_arena(a2, sub, 12, 3, maps, False)}
    found = arenas.read_arenas(_Pieces(pieces), LAY, sub, True)
    assert [(a.id, a.start, a.blocks, a.info) for a in found] == [(1, a1, 12, 3), (2, a2, 12, 3)]
    assert found[0].committed_blocks() == 3 and found[1].committed_blocks() == 9
    assert found[0].free_bytes() == 4 * 65536 and found[0].reserved == 12 * 65536
    assert found[0].purge_ranges() == [(a1 + 4 * 65536, a1 + 6 * 65536)]
    assert arenas.read_arenas(_Pieces(pieces), LAY, sub, False)[0].committed_blocks() == 9
    assert arenas.read_arenas(_Pieces(pieces), LAY, sub + 8, True) is None


def test_the_page_map_is_found_by_its_shape_and_names_every_page():
    """A word of the library's data points to a table whose first entry points just past it, to a sub-map whose
    first entry is in the library; the table's other entries are sub-maps of the pages of their 512 MiB; a table
    that does not start so is not it."""
    lib = (0x7F9000000000, 0x7F9000100000)
    table, size, sub = 0x7F3000000000, 1 << 16, 0x7F4000000000
    top = np.zeros(size // 8, dtype=np.uint64)
    top[0] = np.uint64(table + size)
    top[5] = np.uint64(sub)
    entries = np.zeros(8192, dtype=np.uint64)
    entries[10:16] = np.uint64(0x7F5000000000)          # one page of six slices
    entries[20] = np.uint64(0x7F5000100000)
    mem = _Pieces({table: top.tobytes() + _words(lib[0] + 0x40), sub: entries.tobytes()})
    words = np.array([0, 0x1234, table, 0], dtype=np.uint64)
    found = pagemap.find_page_map(mem, 0x7F9000080000, words, lib, None)
    assert (found.address, found.subs, found.pages) == (table, 1, {0x7F5000000000, 0x7F5000100000})
    assert (sub, sub + 65536) in found.ranges
    mem.pieces[table] = top.tobytes() + _words(0)           # from 3.1 the first sub-map starts with NULL
    assert pagemap.find_page_map(mem, 0x7F9000080000, words, lib, None).address == table
    assert pagemap.find_page_map(mem, 0x7F9000080000, words, lib, None, null_first=False) is None   # not before
    top[0] = np.uint64(table + size + 8)                   # not just past the table: no map
    mem.pieces[table] = top.tobytes() + _words(lib[0] + 0x40)
    assert pagemap.find_page_map(mem, 0x7F9000080000, words, lib, None) is None


L36 = layout3_for((3, 6, 0))


def test_from_3_6_the_page_map_is_a_structure_that_names_itself():
    """3.6's page map: its size and its memid's base (itself) before its table, whose first entry points just
    past the table (the first sub-map, in the same allocation); a structure whose memid names another address,
    or whose first entry points elsewhere, is not it."""
    lib = (0x7F9000000000, 0x7F9000100000)
    at, size, sub = 0x7F3000000000, 0x201000, 0x7F4000000000
    head = _words(3, size, at, size + 65536, 3) + bytes(L36.page_map_header - 40)
    table = np.zeros((size - L36.page_map_header) // 8, dtype=np.uint64)
    table[0] = np.uint64(at + size)
    table[7] = np.uint64(sub)
    entries = np.zeros(8192, dtype=np.uint64)
    entries[3:5] = np.uint64(0x7F5000080200)            # a page of two slices: its mi_page_t in its area's table
    mem = _Pieces({at: head + table.tobytes(), sub: entries.tobytes()})
    words = np.array([0, at, 0], dtype=np.uint64)
    found = pagemap.find_page_map(mem, 0x7F9000080000, words, lib, None, L36.page_map_header)
    assert (found.address, found.subs, found.pages, found.size) == (at, 1, {0x7F5000080200}, size)
    assert (at, at + size + 65536) in found.ranges
    mem.pieces[at] = _words(3, size, at + 4096) + head[24:] + table.tobytes()
    assert pagemap.find_page_map(mem, 0x7F9000080000, words, lib, None, L36.page_map_header) is None


def _arena36(sub: int, at: int, base: int) -> dict[int, bytes]:
    """3.6: subprocess SUB listing one arena of 16 slices (11 its own) described at AT, its memory from BASE;
    nothing free, all committed; no heap."""
    head = bytearray(L36.arena_bitmaps + 32)
    head[L36.arena_memkind] = 3
    fields = ((L36.arena_subproc, sub), (L36.arena_start, base), (L36.arena_slice_count, 16),
              (L36.arena_info_slices, 11), *((L36.arena_bitmaps + 8 * k, at + 0x1000 * (k + 1)) for k in range(4)))
    for off, value in fields:
        head[off:off + 8] = value.to_bytes(8, "little")
    pieces = {at: bytes(head), sub: bytes(L36.sub_arena_count) + _words(1, at) + bytes(L36.sub_heaps)}
    for k in range(4):
        chunks = L36.bbitmap_chunks if k == 0 else L36.bitmap_chunks
        pieces[at + 0x1000 * (k + 1)] = _words(1) + bytes(chunks - 8) + (0 if k != 1 else 0xFFFF).to_bytes(64, "little")
    return pieces


def test_from_3_6_a_page_s_mi_page_t_is_found_through_its_area_s_table():
    """3.6: an arena's memory starts before its description (the table of its first 256 MiB's mi_page_t comes
    first); a page's slice entry in that table points to itself (the page's mi_page_t) or to one at the page's
    start; anything else is an error at the entry.  A page from the system names the aligned area it sits in."""
    sub, base = 0x7F0000001000, 0x7F1000000000
    at = base + 8 * 65536                                   # its description after the table's 8 slices
    found = arenas.read_arenas(_Pieces(_arena36(sub, at, base)), L36, sub, True)
    assert [(a.address, a.start, a.blocks, a.info) for a in found] == [(at, base, 16, 11)]
    assert arenas.read_arenas(_Pieces(_arena36(sub, at, at + 65536)), L36, sub, True) is None
    from heapwalk.mimalloc.v3 import decode
    slice12 = base + 12 * 65536
    entry = base + 12 * L36.page
    findings = []
    mem = _Pieces({entry: _words(slice12)})
    assert decode._page_meta(mem, L36, slice12, found[0], 12, findings) == slice12 and not findings
    mem.pieces[entry] = _words(entry)
    assert decode._page_meta(mem, L36, slice12, found[0], 12, findings) == entry and not findings
    mem.pieces[entry] = _words(entry + 8)
    assert decode._page_meta(mem, L36, slice12, found[0], 12, findings) is None
    assert findings[0].address == entry and "neither itself nor the page's start" in findings[0].message
    area = 0x7F2000000000
    assert decode.own_memory(L36, area + 2 * L36.page, area, 42 << 20)
    assert not decode.own_memory(L36, area + 2 * L36.page, area + 65536, 42 << 20)
    assert decode.own_memory(LAY, area, area, 42 << 20) and not decode.own_memory(LAY, area + 64, area, 42 << 20)


def test_from_3_6_a_page_from_the_system_commits_only_its_slices():
    """3.6: a page taken from the system commits (and counts) only its slices past the table at its start, not
    the rounding of its reservation: a small, medium or large page its page size (the one whose room makes its
    count of blocks), a page of one block that block and its greatest start offset in whole slices, or the
    block alone when the system aligned it (cases measured on sid's build against /proc/PID/maps)."""
    from heapwalk.mimalloc.v3.decode import os_committed
    base = 0x2BDE0000000
    slices = base + 65536
    assert os_committed(L36, base, slices + 0x500, 65536, 63, 4456448) == 4 << 20
    assert os_committed(L36, base, slices + 0x280, 20480, 25, 589824) == 512 << 10
    assert os_committed(L36, base, slices + 512, 8, 8128, 131072) == 64 << 10
    assert os_committed(L36, base, slices + 0x980, 40 << 20, 1, 46137344) == 641 * 65536
    assert os_committed(L36, base, base + (256 << 10), 1 << 20, 1, 2 << 20) == 1 << 20
    assert os_committed(LAY, base, slices, 8, 8128, 131072) == 131072       # before 3.6: all of it


def test_a_purge_takes_whole_aligned_groups_of_its_minimal_purge_size():
    """From 3.3 a purge takes, in each 64-bit word of the purge bitmap, only the aligned groups of its minimal
    purge size whose every slice waits (3.6: 32 slices, 2 MiB, where the system has transparent huge pages);
    with groups of one, every waiting run."""
    waiting = ((1 << 32) - 1) << 32 | 0b1111 | ((1 << 40) - 1) << 64 | 1 << 127
    arena = arenas.Mi3Arena(0x7F1000000000, 1, 128, 3, waiting, (1 << 128) - 1, waiting, 0, (1 << 128) - 1)
    at = lambda first, end: (arena.start + first * 65536, arena.start + end * 65536)     # noqa: E731
    assert arena.purged_ranges() == arena.purge_ranges() == [at(0, 4), at(32, 104), at(127, 128)]
    assert replace(arena, purge_group=32).purged_ranges() == [at(32, 96)]
    assert replace(arena, purge_group=64).purged_ranges() == []


def test_the_minimal_purge_size_comes_from_the_options_and_the_system():
    """The option (KiB) when set; else a large page when the system has transparent huge pages and allow_thp is
    set (from 3.3.2: is 2); else a system page: one slice.  A release before 3.1.6 purges every run."""
    from heapwalk.mimalloc.options import MiOption
    from heapwalk.mimalloc.v3.discovery import purge_group
    thp, no_thp = (2 << 20, 0x01000101), (2 << 20, 0x00000101)
    opts = {"arena_purge_min_size": MiOption((0, "default")), "allow_thp": MiOption((2, "default"))}
    assert purge_group(opts, thp, 65536, "thp2") == 32 and purge_group(opts, no_thp, 65536, "thp2") == 1
    one = {**opts, "allow_thp": MiOption((1, "default"))}
    assert purge_group(one, thp, 65536, "thp2") == 1 and purge_group(one, thp, 65536, "thp") == 32
    assert purge_group({**one, "allow_thp": MiOption((0, "from the environment"))}, thp, 65536, "thp") == 1
    assert purge_group({**opts, "arena_purge_min_size": MiOption((256, "from the environment"))}, thp, 65536,
                       "thp2") == 4
    assert purge_group({"minimal_purge_size": MiOption((0, "default"))}, thp, 65536, "thp2") == 1
    assert purge_group(opts, thp, 65536, "") == 1 and purge_group({}, thp, 65536, "thp2") == 1


def test_the_system_s_settings_say_whether_it_overcommits():
    settings = [4096, 2 << 20, 4096, 24 << 30, 47, 0x000101]
    assert _overcommit(np.array([7, *settings, 0], dtype=np.uint64)) is True
    settings[5] = 0x000100
    assert _overcommit(np.array([7, *settings, 0], dtype=np.uint64)) is False
    assert _overcommit(np.array([7, 4096, 3, 4096, 1, 47, 1, 0], dtype=np.uint64)) is None


def test_a_mimalloc_3_not_measured_is_named():
    """A release heapwalk has not measured (3.5.0, or 3.7.0) is named with those it decodes; 3.0.1, 3.3.2 (the
    Rust crate's), 3.4.3 and 3.6.0 (Debian sid's) have their layouts, and 3.1.5 (the crate's v3 in 0.1.44)."""
    for version in ((3, 5, 0), (3, 7, 0)):
        with pytest.raises(discovery.MimallocUnknown, match=r"mimalloc 3\.[57]\.0 is not a version heapwalk has "
                                                            r"measured \(it decodes 2\.0\.5, .*, 3\.0\.1, 3\.1\.4 to "
                                                            r"3\.1\.5, .*, 3\.4\.0 to 3\.4\.3, 3\.6\.0"):
            families.candidates(version)
    assert families.candidates((3, 0, 1)) == [LAY]
    assert [lay.versions for lay in (*families.candidates((3, 3, 2)), *families.candidates((3, 4, 3)),
                                     *families.candidates((3, 6, 0)), *families.candidates((3, 1, 5)))] == [
        "3.3.2", "3.4.0 to 3.4.3", "3.6.0", "3.1.4 to 3.1.5"]
