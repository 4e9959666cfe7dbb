"""How heapwalk reads a jemalloc build without symbols: the constants of its mallctl functions (its
configuration), the radix tree's geometry from its lookup code, and which object holds it; its slabs,
extents and TLS on memory made by hand (the builds on real cores: test_jemalloc_builds_cores.py)."""

from __future__ import annotations

import struct

from heapwalk.arch.x86_64 import code as x86
from heapwalk.inferior.elf import Mapping
from heapwalk.jemalloc.find import mapped_objects
from heapwalk.jemalloc.layout import LAYOUTS

from heapwalk.jemalloc.rtree import COMPACT_48, WIDE_57
from heapwalk.jemalloc.sizeclasses import size_classes
from heapwalk.jemalloc.tsdoffset import _states_plausible, static_module_offset
from heapwalk.inferior.image import ImageMemory

#: the first bytes of config.debug's ctl function in Debian's jemalloc 5.3.0 (libjemalloc_pic.a, gcc 12):
#: sub rsp; the stack guard; mov eax, 1; or r9, [rsp+0x20]; jne; movb [rsp+7], 0 (config_debug is false)
CONFIG_DEBUG_530 = bytes.fromhex("4883ec18 64488b042528000000 4889442408 b801000000 4c0b4c2420 751d c644240700"
                                 "4885c9 7411".replace(" ", ""))
#: arenas.nbins's: ... movl [rsp+4], 0x24 (36 small size classes)
ARENAS_NBINS_530 = bytes.fromhex("4883ec18 64488b342528000000 4889742408 be01000000 4c0b4c2420 7526 c744240424000000"
                                 "4889c8".replace(" ", ""))


def test_a_config_flag_is_the_byte_its_function_stores():
    assert x86.stored_constant(CONFIG_DEBUG_530) == 0
    assert x86.stored_constant(CONFIG_DEBUG_530.replace(bytes.fromhex("c644240700"), bytes.fromhex("c644240701"))) == 1


#: the same functions unoptimised (a plain './configure --enable-debug', -O0), written out by hand: the prologue
#: (push rbp; mov rbp, rsp), the error code EPERM to the slot returned in eax, the constant to a slot of its own
#: (a word; a bool through eax and al), and the end (mov eax, [rbp-4]; leave; ret)
_UNOPTIMISED = "554889e5 c745fc01000000 {} 8b45fc c9 c3"
NBINS_O0 = bytes.fromhex(_UNOPTIMISED.format("c745ec24000000").replace(" ", ""))
DEBUG_O0 = bytes.fromhex(_UNOPTIMISED.format("b801000000 8845ef").replace(" ", ""))


def test_unoptimised_code_s_constant_is_not_its_error_code():
    """The first immediate an unoptimised ctl function stores is EPERM, to the slot it returns: read as the
    constant, it made 5.3.0's debug build one of '1 small size classes'."""
    assert x86.stored_constant(NBINS_O0) == 36
    assert x86.stored_constant(DEBUG_O0) == 1
    assert x86.stored_constant(DEBUG_O0.replace(bytes.fromhex("b801000000"), bytes.fromhex("b800000000"))) == 0


def test_the_number_of_small_classes_is_the_word_its_function_stores():
    assert x86.stored_constant(ARENAS_NBINS_530) == 36
    assert x86.stored_constant(ARENAS_NBINS_530.replace(bytes.fromhex("c744240424000000"),
                                                    bytes.fromhex("c744240427000000"))) == 39
    assert x86.stored_constant(bytes.fromhex("4883ec18 31c0 c3".replace(" ", ""))) is None


def test_the_radix_trees_leaf_shift_is_the_first_shift_right():
    """arenas.lookup's code keys its cache of leaves by address >> 30 in a 48-bit build (shr r13, 0x1e) and
    >> 27 in a build for 57-bit addresses."""
    code = bytes.fromhex("4c89e7 49c1ed1e 49c1ef09".replace(" ", ""))
    assert x86.first_shift_right(code) == 30
    assert x86.first_shift_right(bytes.fromhex("49c1ed1b")) == 27
    assert x86.first_shift_right(bytes.fromhex("49c1e51e")) is None    # shl, not shr


def test_every_file_mapped_from_its_start_is_an_object_to_look_in():
    maps = [Mapping(0x5000, 0x6000, 0x1000, "/usr/bin/redis-server"),
            Mapping(0x4000, 0x5000, 0, "/usr/bin/redis-server"),
            Mapping(0x7000, 0x8000, 0, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            Mapping(0x9000, 0xA000, 0, "/dev/zero (deleted)"),
            Mapping(0xB000, 0xC000, 0, "[vdso]"),
            Mapping(0x3000, 0x4000, 0, "/usr/bin/redis-server")]
    assert mapped_objects(maps) == [(0x3000, "/usr/bin/redis-server"),
                                    (0x7000, "/usr/lib/x86_64-linux-gnu/libc.so.6")]


#: the 36 small classes Debian's builds print as arenas.bin (size/nregs/slab pages), a 16-byte quantum
PRINTED_Q16 = ("8/512/1 16/256/1 32/128/1 48/256/3 64/64/1 80/256/5 96/128/3 112/256/7 128/32/1 160/128/5 192/64/3 "
               "224/128/7 256/16/1 320/64/5 384/32/3 448/64/7 512/8/1 640/32/5 768/16/3 896/32/7 1024/4/1 1280/16/5 "
               "1536/8/3 1792/16/7 2048/2/1 2560/8/5 3072/4/3 3584/8/7 4096/1/1 5120/4/5 6144/2/3 7168/4/7 8192/1/2 "
               "10240/2/5 12288/1/3 14336/2/7")


#: the 52 small classes Debian's arm64 build (5.3.0, configured for 64 KiB pages) prints as arenas.bin, measured
#: under qemu-user (cores/scripts/foreign.py): size/nregs/slab pages
PRINTED_Q16_P64 = ("8/8192/1 16/4096/1 32/2048/1 48/4096/3 64/1024/1 80/4096/5 96/2048/3 112/4096/7 128/512/1 160/2048/5 "
                   "192/1024/3 224/2048/7 256/256/1 320/1024/5 384/512/3 448/1024/7 512/128/1 640/512/5 768/256/3 896/512/7 "
                   "1024/64/1 1280/256/5 1536/128/3 1792/256/7 2048/32/1 2560/128/5 3072/64/3 3584/128/7 4096/16/1 5120/64/5 "
                   "6144/32/3 7168/64/7 8192/8/1 10240/32/5 12288/16/3 14336/32/7 16384/4/1 20480/16/5 24576/8/3 28672/16/7 "
                   "32768/2/1 40960/8/5 49152/4/3 57344/8/7 65536/1/1 81920/4/5 98304/2/3 114688/4/7 131072/1/2 163840/2/5 "
                   "196608/1/3 229376/2/7")


def test_the_size_classes_follow_the_page():
    """With 64 KiB pages the small classes go on to 3.5 pages (52 of them, slabs of up to 7 pages), the large
    ones start at 4 pages (180 of them), and the page size classes are the 3 whole-page small ones and those."""
    p64 = size_classes(4, 16)
    assert [f"{c.size}/{c.nregs}/{c.pages}" for c in p64.bins] == PRINTED_Q16_P64.split()
    assert (p64.nlextents, p64.npsizes, p64.page) == (180, 183, 65536)
    assert p64.large_size(0) == 262144 and p64.size_index(229377) == 52
    assert p64.page_sizes()[:4] == (65536, 131072, 196608, 262144) and len(p64.page_sizes()) == 183
    assert size_classes(4, 12) == size_classes(4) and size_classes(4).page_sizes()[:4] == (4096, 8192, 12288, 16384)


def test_the_size_classes_follow_the_quantum():
    """With a 16-byte quantum the classes are what Debian's builds print; with 8 bytes (Redis) 24, 40 and 56
    come in below 64, 39 in all, and everything from 64 up is the same."""
    q16, q8 = size_classes(4), size_classes(3)
    assert [f"{c.size}/{c.nregs}/{c.pages}" for c in q16.bins] == PRINTED_Q16.split()
    assert q8.nbins == 39 and [c.size for c in q8.bins[:8]] == [8, 16, 24, 32, 40, 48, 56, 64]
    assert q8.bins[7:] == q16.bins[4:]
    assert (q8.bins[2].nregs, q8.bins[2].pages) == (512, 3)
    assert q16.size_index(17) == 2 and q8.size_index(17) == 2 and q8.class_size(2) == 24
    assert q16.class_size(36) == q8.class_size(39) == 16384 and q16.size_index(16385) == 37


def test_a_radix_tree_entry_reads_the_same_in_both_shapes():
    """One leaf entry naming the header 0x7f0012345600 of a slab of size class 5: as a 48-bit build's one word
    (5.3.0: the class in the top 16 bits, the slab flag in bit 0), and as a 57-bit build's 16 bytes (5.3.0: the
    class from bit 5 of the word after the address; 5.2.1: the class, then the slab flag in the next byte)."""
    header, szind = 0x7F0012345600, 5
    compact = struct.pack("<Q", szind << 48 | header | 1)
    wide_530 = struct.pack("<QII", header, szind << 5 | 0b01, 0)
    wide_521 = struct.pack("<QII", header, szind, 1)
    for shape, raw, layout in ((COMPACT_48, compact, LAYOUTS[(5, 3, 0)]), (WIDE_57, wide_530, LAYOUTS[(5, 3, 0)]),
                               (WIDE_57, wide_521, LAYOUTS[(5, 2, 1)])):
        headers, classes, slab = shape.decode(raw, layout)
        assert (int(headers[0]), int(classes[0]), bool(slab[0])) == (header, szind, True), shape
    assert COMPACT_48.leaf_of(0x7F0012345600) == (0x7F0000000000, 0x12345)
    assert WIDE_57.path(0x7F0012345600) == [0x7F0012345600 >> 42, (0x7F0012345600 >> 27) & 0x7FFF]
    assert WIDE_57.leaf_of(0x7F0012345600)[1] == (0x7F0012345600 >> 12) & 0x7FFF


def test_slab_bitmaps_are_read_together_and_checked_against_the_free_count(monkeypatch):
    """Headers near each other are read in one piece; a header in memory that is not there is unreadable, not a
    failure of its neighbours; a bitmap that does not count the slab's free regions gives no regions at all (its
    slab is unknown memory), in C as in numpy."""
    import numpy as np
    from heapwalk.inferior.image import ImageMemory
    from heapwalk.inferior.records import read_records
    from heapwalk.jemalloc import blocks, native as jenative
    from heapwalk.jemalloc.extents import ExtentTable
    base = 0x10000
    block = bytearray(4096)
    for k, header in enumerate((0, 128, 256)):
        block[header + 64:header + 72] = (0b1011 << k).to_bytes(8, "little")    # free regions: set bits
    mem = ImageMemory({base: block})
    reads = []
    real = mem.read
    mem.read = lambda address, size: reads.append((address, size)) or real(address, size)
    headers = np.array([base + 256, base, base + 128, 0x90000], dtype=np.uint64)
    got = read_records(mem, headers + np.uint64(64), 64)
    assert reads[0] == (base + 64, 256 + 64) and got.readable.tolist() == [True, True, True, False]
    table = ExtentTable(np.array([1 << 20, 2 << 20, 3 << 20, 4 << 20], dtype=np.uint64), np.full(4, 4096),
                        np.zeros(4, dtype=np.int64), np.zeros(4, dtype=np.int32), np.zeros(4, dtype=np.uint8),
                        np.ones(4, dtype=bool), np.zeros(4, dtype=np.int32), np.array([2, 3, 3, 0], dtype=np.int32),
                        headers)
    nregs, size = np.array([8]), np.array([16], dtype=np.uint64)
    for lib in (jenative._LIB, None):
        monkeypatch.setattr(jenative, "_LIB", lib)
        native = jenative.slab_regions(got.data, np.full(4, 8), np.full(4, 16), table.nfree, got.readable,
                                     table.address, table.arena)
        starts, _, _, unknown = (([native[0]], 0, 0, blocks._spans(table, np.flatnonzero(~native[3])))
                                 if native is not None else
                                 blocks._slab_regions_numpy(table, np.arange(4), got, nregs, size))
        regions = ((np.concatenate(starts) - np.uint64(2 << 20)) // np.uint64(16)).tolist()
        assert regions[:5] == [2, 4, 5, 6, 7] and len(regions) == 10          # the two slabs that count right
        assert unknown == [(1 << 20, (1 << 20) + 4096), (4 << 20, (4 << 20) + 4096)]


def test_the_free_extent_rings_are_walked_and_damage_is_named_where_it_is():
    """Arena 2's dirty ring holds two extents of 2 and 1 pages, which its counter says: nothing to report; a
    ring that loops back to its second extent is a cycle at that extent; an extent of the wrong state is named
    at its header."""
    from heapwalk.inferior.image import ImageMemory
    from heapwalk.jemalloc.freelists import ListedExtents, walk_free_lists
    layout = LAYOUTS[(5, 3, 0)]
    arena, first, second = 0x100000, 0x20000, 0x20080
    raw = bytearray(layout.arena_size)
    counter = layout.dirty_npages[0]
    struct.pack_into("<QQ", raw, counter - 8, first, 3)

    def extent(state: int, pages: int, following: int) -> bytes:
        header = bytearray(128)
        struct.pack_into("<QQQ", header, 0, state << layout.extent_state_shift | 2, 0x7F0000000000, pages * 4096)
        struct.pack_into("<Q", header, layout.extent_lru_link, following)
        return bytes(header)

    def walked(second_state: int, second_next: int):
        mem = ImageMemory({first: extent(1, 2, second) + extent(second_state, 1, second_next)})
        return walk_free_lists(mem, layout, 2, arena, bytes(raw))

    rings, findings = walked(1, first)
    assert rings[0] == ListedExtents(1, 2, 3, 3) and not findings
    assert all(r.extents == 0 for r in rings[1:])
    _, findings = walked(1, second)
    assert [(f.kind.ident, f.address) for f in findings] == [("list_cycle", second)]
    _, findings = walked(2, first)
    assert [(f.kind.ident, f.address, f.found) for f in findings] == [("arena", second, "arena 2, state 2")]


def _dtv_thread(fs: int, vector: int, module: int, block: int) -> dict[int, bytes]:
    """A thread's memory: its thread pointer's words (the DTV's address at fs+8) and a DTV of MODULE + 1
    entries whose entry MODULE names BLOCK."""
    entries = bytearray(16 * (module + 2))
    struct.pack_into("<Q", entries, 0, module + 1)                   # the length, before the generation
    struct.pack_into("<Q", entries, 16 * (module + 1), block)
    return {fs: struct.pack("<QQ", fs, vector), vector - 16: bytes(entries)}


def test_a_module_whose_tls_is_static_sits_at_one_offset_and_one_loaded_with_dlopen_does_not():
    """A library built --disable-initial-exec-tls is placed by its module's entry in each thread's DTV: at
    one offset below every thread pointer when it was loaded at start (static TLS); apart in each thread,
    so at no one offset, when it was loaded with dlopen."""
    module = 3
    static = {**_dtv_thread(0x7F0000100000, 0x5000, module, 0x7F0000100000 - 0x2000),
              **_dtv_thread(0x7F0000300000, 0x9000, module, 0x7F0000300000 - 0x2000)}
    assert static_module_offset(ImageMemory(static), module, [0x7F0000100000, 0x7F0000300000]) == -0x2000
    loaded = {**_dtv_thread(0x7F0000100000, 0x5000, module, 0x600000),
              **_dtv_thread(0x7F0000300000, 0x9000, module, 0x700000)}
    assert static_module_offset(ImageMemory(loaded), module, [0x7F0000100000, 0x7F0000300000]) is None


def test_a_tsd_offset_needs_a_state_jemalloc_sets_in_every_thread():
    """An arena pointer elsewhere in a thread's TLS (a dlopen'd jemalloc's threads keep theirs in blocks
    apart) names no tsd: the state byte where the tsd would keep it is checked in every thread."""
    layout = LAYOUTS[(5, 3, 0)]
    good = bytearray(layout.tsd_size)
    good[layout.tsd_state] = 6                                     # uninitialized: a thread that never allocated
    bad = bytearray(layout.tsd_size)
    bad[layout.tsd_state] = 128
    assert _states_plausible(ImageMemory({0x1000: bytes(good), 0x9000: bytes(good)}), layout, [0x1000, 0x9000])
    assert not _states_plausible(ImageMemory({0x1000: bytes(good), 0x9000: bytes(bad)}), layout, [0x1000, 0x9000])


def test_overdue_decay_agrees_with_whether_background_threads_run():
    """An arena's decay overdue at the snapshot: where background threads run, the sentence says they purge the
    pages when they next wake, never that the pages wait for a thread's call (the verdict's other sentence says
    they purge on time); where they are off, that the pages stay until a thread of the arena calls jemalloc; under
    a MiB overdue, nothing."""
    from types import SimpleNamespace
    from heapwalk.jemalloc.verdict import _overdue
    arena = SimpleNamespace(index=3, pdirty=256, dirty_bytes=256 * 4096, dirty_decay_ms=10000, dirty_clock=(10**9, 5 * 10**9))
    for running, says, never in ((True, "purge these pages when they next wake", "stay until one does"),
                                 (False, "no background thread purged them, so the pages stay until one does",
                                  "next wake")):
        state = SimpleNamespace(clock_ns=20 * 10**9, arenas=[arena], background_running=running)
        sentence = _overdue(state, [arena])
        assert sentence.startswith("Overdue: the decay of arena 3 (1 MiB of dirty pages) was due to step at least 15 s")
        assert says in sentence and never not in sentence
    small = SimpleNamespace(index=4, pdirty=1, dirty_bytes=4096, dirty_decay_ms=10000, dirty_clock=(10**9, 5 * 10**9))
    state = SimpleNamespace(clock_ns=20 * 10**9, arenas=[small], background_running=False)
    assert _overdue(state, [small]) == ""          # one page (4 KiB) overdue is no sentence


def test_a_64k_page_slab_of_8192_regions_reads_its_whole_bitmap(monkeypatch):
    """With 64 KiB pages a slab of the 8-byte class holds 8192 regions, its bitmap's first level 1024 bytes: the
    regions handed out past the first 512 are found too, in C as in numpy, and the count of free regions reads
    14 bits of the extent's word."""
    import numpy as np
    from heapwalk.inferior.image import ImageMemory
    from heapwalk.inferior.records import read_records
    from heapwalk.jemalloc import blocks, native as jenative
    from heapwalk.jemalloc.extents import ExtentTable
    layout = LAYOUTS[(5, 3, 0, "page16", "mutex48")]
    classes = layout.classes
    assert (classes.slab_maxregs, layout.slab_bitmap_bytes, layout.nfree_mask) == (8192, 1024, 0x3FFF)
    assert classes.bins[0].nregs == 8192 and classes.small_maxclass == 229376
    header = 0x10000
    bitmap = bytearray(b"\xff" * 1024)
    for region in (0, 700, 8191):                       # three regions in use: their bits clear
        bitmap[region // 8] &= ~(1 << region % 8) & 0xFF
    mem = ImageMemory({header: bytes(64) + bytes(bitmap)})
    got = read_records(mem, np.array([header + 64], dtype=np.uint64), layout.slab_bitmap_bytes)
    table = ExtentTable(np.array([1 << 20], dtype=np.uint64), np.array([65536]), np.zeros(1, dtype=np.int64),
                        np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.uint8), np.ones(1, dtype=bool),
                        np.zeros(1, dtype=np.int32), np.array([8189], dtype=np.int32),
                        np.array([header], dtype=np.uint64), classes)
    for lib in (jenative._LIB, None):
        monkeypatch.setattr(jenative, "_LIB", lib)
        starts, _ends, _arenas, unknown = blocks._slab_regions(mem, table, np.arange(1))
        assert ((np.concatenate(starts) - np.uint64(1 << 20)) // np.uint64(8)).tolist() == [0, 700, 8191]
        assert unknown == []
