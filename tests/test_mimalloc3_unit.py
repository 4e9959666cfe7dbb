"""mimalloc 3's decoder without gdb, on memory made by hand: the arenas' bitmaps read as runs of slices, the
arenas found through the subprocess (and their commit counted as mimalloc counts it), the page map found by
its shape and walked, the system's settings, and a version not measured named."""

from __future__ import annotations

import numpy as np
import pytest

from heapwalk.mimalloc import bits, discovery
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
    mem.pieces[table] = top.tobytes() + _words(0)           # from 3.2 the first sub-map starts with NULL
    assert pagemap.find_page_map(mem, 0x7F9000080000, words, lib, None).address == table
    top[0] = np.uint64(table + size + 8)                   # not just past the table: no map
    mem.pieces[table] = top.tobytes() + _words(lib[0] + 0x40)
    assert pagemap.find_page_map(mem, 0x7F9000080000, words, lib, None) is None


def test_the_system_s_settings_say_whether_it_overcommits():
    settings = [4096, 2 << 20, 4096, 24 << 30, 47, 0x000101]
    assert _overcommit(np.array([7, *settings, 0], dtype=np.uint64)) is True
    settings[5] = 0x000100
    assert _overcommit(np.array([7, *settings, 0], dtype=np.uint64)) is False
    assert _overcommit(np.array([7, 4096, 3, 4096, 1, 47, 1, 0], dtype=np.uint64)) is None


def test_a_mimalloc_3_not_measured_is_named():
    """A release heapwalk has not measured (3.6.0, Debian sid's, whose sources are not at hand) is named with
    those it decodes; 3.0.1, 3.3.2 (the Rust crate's) and 3.4.3 have their layouts."""
    with pytest.raises(discovery.MimallocUnknown, match=r"mimalloc 3\.6\.0 is not a version heapwalk has measured "
                                                        r"\(it decodes 2\.0\.5, .*, 3\.0\.1, 3\.3\.2, 3\.4\.3"):
        discovery._candidates((3, 6, 0))
    assert discovery._candidates((3, 0, 1)) == [LAY]
    assert [lay.versions for lay in (*discovery._candidates((3, 3, 2)), *discovery._candidates((3, 4, 3)))] == [
        "3.3.2", "3.4.3"]
