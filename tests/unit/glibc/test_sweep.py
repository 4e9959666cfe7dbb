"""The one pass (`sweep`, `indexlists`, `sweepwalk`) on synthetic heaps, without gdb: on a sound heap it gives
exactly the careful walkers' lists, account and trim estimate; on a damaged one it either steps aside (the
careful walkers then name the damage) or, when the damage is not of malloc's bookkeeping, gives the careful
walkers' numbers while they find nothing either.  It never vouches for a heap the careful walkers fault."""

from __future__ import annotations

import dataclasses
import random
import struct
import threading
import time

import pytest

from heapwalk.glibc.walk import arenas as arenas_module
from heapwalk.glibc.forensics import chunkinfo
from heapwalk.glibc.bulk import native
from heapwalk.glibc.forensics.chunkinfo import ChunkFilter
from heapwalk.glibc.walk.chunkwalk import account
from heapwalk.glibc.walk.chunks import Listing
from heapwalk.glibc.locate.layout import layout_for
from heapwalk.glibc.walk.lists import bin_index, walk_tcache
from heapwalk.glibc.model import Arena, BinKind, BinList, ChunkState, Heap
from heapwalk.glibc.bulk.onepass import OnePass
from heapwalk.glibc.bulk.sweptchunks import listing_arrays, swept_chunks
from heapwalk.glibc.walk.trim import TrimSimulation
from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.memory import CachedMemory, ReadError

ARENA = 0x7F0000001000
HEAP = 0x555555559000


@dataclasses.dataclass
class Synth:
    mem: ImageMemory
    layout: object
    arena: Arena
    tcaches: list
    words: list[int]         # addresses of the words a damage test may change


def _synth(seed: int, version: tuple[int, int], chunks: int = 3000) -> Synth:
    """A main arena whose heap holds CHUNKS chunks as glibc leaves them: in use, in a tcache, in fastbins, in
    the unsorted, small and large bins (never two binned ones side by side), then top."""
    rng = random.Random(seed)
    lay = layout_for(version)
    sizes = [rng.choice((0x20, 0x30, 0x50, 0x80, 0x110, 0x420, 0x1010, 0x3000)) for _ in range(chunks)]
    heap = bytearray(sum(sizes) + 0x2000)
    mem = ImageMemory({ARENA: bytes(lay.arena_size + 64)})
    tstruct_size = lay.tcache_chunk_size if lay.has_tcache else 0
    c, prev_binned = 0, False
    states: list[tuple[int, int, str]] = []
    if tstruct_size:
        struct.pack_into("<Q", heap, 8, tstruct_size | 1)
        states.append((HEAP, tstruct_size, "struct"))
        c = tstruct_size
    for size in sizes:
        kind = rng.choice(("used", "used", "used", "tcache", "fast", "unsorted", "bin"))
        if kind == "fast" and (not lay.has_fastbins or size > 0x80) or kind == "tcache" and (
                not lay.has_tcache or size > 0x410):
            kind = "used"
        if kind in ("unsorted", "bin") and prev_binned:
            kind = "used"
        binned = kind in ("unsorted", "bin")
        struct.pack_into("<Q", heap, c + 8, size | (0 if prev_binned else 1))
        if binned:
            struct.pack_into("<Q", heap, c + size, size)
        states.append((HEAP + c, size, kind))
        prev_binned, c = binned, c + size
    top = HEAP + c
    struct.pack_into("<Q", heap, c + 8, (len(heap) - c) | (0 if prev_binned else 1))
    mem.add(HEAP, heap)
    _link(mem, lay, states, rng)
    tcaches = [walk_tcache(mem, lay, HEAP + 16)] if tstruct_size else []
    mem.write_u64(ARENA + lay.off_top, top)
    mem.write_u64(ARENA + lay.off_system_mem, len(heap))
    mem.write_u64(ARENA + lay.off_next, ARENA)
    arena = Arena(address=ARENA, number=0, is_main=True, mutex=0, flags=0, have_fastchunks=None, top=top,
                  top_size=len(heap) - c, last_remainder=0, next=ARENA, next_free=0, attached_threads=1,
                  system_mem=len(heap), max_system_mem=len(heap), heaps=(Heap(HEAP, len(heap), len(heap), ARENA, 0),),
                  fastbins=(), unsorted=BinList(BinKind.UNSORTED, 1, lay.bin_header(ARENA, 1), (), ()), bins=())
    words = [a + off for a, size, _ in states for off in (8, 16, 24) if off < size] + [ARENA + lay.off_top]
    return Synth(mem, lay, arena, tcaches, words)


def _link(mem: ImageMemory, lay, states: list[tuple[int, int, str]], rng: random.Random) -> None:
    """The lists of STATES' free chunks, each in random order: the tcache (struct at the heap's start), the
    fastbins (safe-linked where the layout is) and the regular bins."""
    def protect(field: int, target: int) -> int:
        return (field >> 12) ^ target if lay.safe_linking else target

    groups: dict[tuple[str, int], list[int]] = {}
    for address, size, kind in states:
        if kind in ("tcache", "fast", "bin"):
            index = size // 16 - 2 if kind != "bin" else bin_index(size)
            groups.setdefault((kind, index), []).append(address)
        elif kind == "unsorted":
            groups.setdefault(("bin", 1), []).append(address)
    for (kind, index), chunks in sorted(groups.items()):
        rng.shuffle(chunks)
        if kind == "tcache":
            chunks = chunks[:7]
            raw = bytearray(mem.read(HEAP + 16, lay.tcache_struct_size))
            count = lay.tcache_fill_count - len(chunks) if lay.tcache_counts_down else len(chunks)
            struct.pack_into("<H" if lay.tcache_count_size == 2 else "<B", raw, index * lay.tcache_count_size, count)
            struct.pack_into("<Q", raw, lay.tcache_off_entries + 8 * index, chunks[0] + 16)
            mem.write(HEAP + 16, bytes(raw))
            for e, nxt in zip(chunks, chunks[1:] + [None]):
                mem.write_u64(e + 16, protect(e + 16, nxt + 16 if nxt else 0))
        elif kind == "fast":
            mem.write_u64(ARENA + lay.off_fastbins + 8 * index, chunks[0])
            for e, nxt in zip(chunks, chunks[1:] + [None]):
                mem.write_u64(e + 16, protect(e + 16, nxt or 0))
        else:
            head = lay.bin_header(ARENA, index)
            ring = [head] + chunks
            for i, c in enumerate(ring):
                mem.write_u64(c + 16, ring[(i + 1) % len(ring)])
                mem.write_u64(c + 24, ring[i - 1])
    for i in range(1, 128):
        head = lay.bin_header(ARENA, i)
        if ("bin", i) not in groups:
            mem.write_u64(head + 16, head)
            mem.write_u64(head + 24, head)


def _careful(s: Synth, page: int = 4096):
    findings: list = []
    fastbins, unsorted, bins = arenas_module._free_lists(s.mem, s.layout, ARENA, s.arena.system_mem, findings)
    arena = dataclasses.replace(s.arena, fastbins=fastbins, unsorted=unsorted, bins=bins)
    listed = {}
    for lst in arena.free_lists():
        state = {BinKind.FAST: ChunkState.FAST, BinKind.UNSORTED: ChunkState.UNSORTED,
                 BinKind.SMALL: ChunkState.SMALL, BinKind.LARGE: ChunkState.LARGE}[lst.kind]
        for c in lst.chunks:
            listed.setdefault(c, state)
    for tcache in s.tcaches:
        for b in tcache.bins:
            for e in b.entries:
                listed[e - 16] = ChunkState.TCACHE
        listed[tcache.address - 16] = ChunkState.TCACHE_STRUCT
    sim = TrimSimulation(s.mem, s.layout, arena, 0, True, page=page)
    acc = account(s.mem, s.layout, arena, Listing.of_states(listed), sim)
    return (fastbins, unsorted, bins), findings, acc, sim.result()


def _chunk_rows(s: Synth, flt: ChunkFilter, sweep: bool):
    """What `heapwalk chunks` lists of the synthetic arena (its lists walked carefully): the chunks FLT
    admits, swept when SWEEP and the sweep vouches (else None), walked carefully otherwise, with the walk's
    findings."""
    fastbins, unsorted, bins = arenas_module._free_lists(s.mem, s.layout, ARENA, s.arena.system_mem, [])
    arena = dataclasses.replace(s.arena, fastbins=fastbins, unsorted=unsorted, bins=bins)
    listed = {c: st for lst in arena.free_lists() for c, st in zip(lst.chunks, [_STATES[lst.kind]] * lst.count)}
    for tcache in s.tcaches:
        listed.update((e - 16, ChunkState.TCACHE) for b in tcache.bins for e in b.entries)
        listed[tcache.address - 16] = ChunkState.TCACHE_STRUCT
    listing = Listing.of_states(listed)
    if sweep:
        swept = swept_chunks(s.mem, s.layout, arena, listing_arrays(listing))
        if swept is None:
            return None
        return list(swept.chunks(swept.select(flt.free, flt.used, flt.min_size, flt.max_size))), []
    findings: list = []
    return [c for m in chunkinfo._walked(s.mem, s.layout, arena, listing, flt, findings) for c in m.chunks()], findings


def _one_pass(s: Synth, page: int = 4096):
    one = OnePass(s.mem, s.layout, s.tcaches, 0, True, page=page)
    lists = one.lists(s.arena, s.mem.read(ARENA, s.layout.arena_size))
    results = one.results((s.arena,))
    return (None if lists is None else (lists.fastbins, lists.unsorted, lists.bins)), results


VERSIONS = [(2, 31), (2, 36), (2, 43)]
_STATES = {BinKind.FAST: ChunkState.FAST, BinKind.UNSORTED: ChunkState.UNSORTED, BinKind.SMALL: ChunkState.SMALL,
           BinKind.LARGE: ChunkState.LARGE}
_FILTERS = (ChunkFilter(), ChunkFilter(free=True), ChunkFilter(used=True, min_size=0x50, max_size=0x1010))


@pytest.fixture(params=["c", "python"])
def loops(request, monkeypatch):
    """The one pass with its loops in C, then with the Python fallback."""
    if request.param == "python":
        monkeypatch.setattr(native, "_LIB", None)
    return request.param


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: "%d.%d" % v)
@pytest.mark.parametrize("seed", range(4))
def test_a_sound_heap_is_vouched_for_with_the_careful_walkers_numbers(seed, version, loops):
    s = _synth(seed, version)
    lists, findings, acc, trim = _careful(s)
    assert not findings and not acc.findings and acc.bytes[ChunkState.FAST] + acc.bytes[ChunkState.SMALL] > 0
    swept, results = _one_pass(s)
    assert swept == lists
    assert results == {ARENA: (acc, trim)}
    for flt in _FILTERS:
        rows = _chunk_rows(s, flt, sweep=True)
        assert rows is not None and rows == _chunk_rows(s, flt, sweep=False) and rows[0]


@pytest.mark.parametrize("seed", range(2))
def test_on_64k_pages_trim_gives_back_whole_64k_pages_in_both_walks(seed, loops):
    """A kernel of 64 KiB pages (AT_PAGESZ 65536, as some arm64 ones): the one pass and the careful walk agree,
    every range trim gives back is whole 64 KiB pages, and no more than with 4 KiB pages is given back."""
    s = _synth(seed, (2, 36), chunks=6000)
    _lists, findings, acc, trim = _careful(s, 65536)
    assert not findings and _one_pass(s, 65536)[1] == {ARENA: (acc, trim)}
    small = _careful(s)[3]
    assert trim.total < small.total and trim.total % 65536 == 0 and trim.systrim % 65536 == 0
    assert trim.total + sum(trim.kept.values()) == small.total + sum(small.kept.values())


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: "%d.%d" % v)
def test_damage_is_left_to_the_careful_walkers(version, loops):
    rng = random.Random(7)
    vouched = stepped_aside = 0
    for trial in range(150):
        s = _synth(trial % 3, version, chunks=400)
        at = rng.choice(s.words)
        value = rng.choice((0, 1, 0x21, 0x31, at & ~0xF, s.mem.read(at, 8)[0] ^ 0x10, 0x4141414141414141,
                            int.from_bytes(s.mem.read(at, 8), "little") + 0x10))
        s.mem.write_u64(at, value)
        swept, results = _one_pass(s)
        lists, findings, acc, trim = _careful(s)
        if results is None:
            stepped_aside += 1
            continue
        vouched += 1
        assert swept == lists and not findings and not acc.findings, f"trial {trial}: {at:#x} = {value:#x}"
        assert results == {ARENA: (acc, trim)}, f"trial {trial}: {at:#x} = {value:#x}"
    for trial in range(60):
        s = _synth(trial % 3, version, chunks=300)
        at = rng.choice(s.words)
        s.mem.write_u64(at, rng.choice((0, 1, 0x21, 0x31, at & ~0xF, 0x4141414141414141)))
        flt = _FILTERS[trial % 3]
        rows = _chunk_rows(s, flt, sweep=True)
        assert rows is None or rows == _chunk_rows(s, flt, sweep=False), f"trial {trial}: {at:#x}"
    assert stepped_aside > 50 and vouched > 5, (stepped_aside, vouched)


def test_heap_bounds_from_damaged_fields_are_left_to_the_careful_walkers():
    """A heap whose bounds lie past the address space (a damaged sbrk_base) is not swept."""
    s = _synth(0, (2, 36), chunks=50)
    s.arena = dataclasses.replace(s.arena, heaps=(Heap((1 << 64) - 1, 0x21000, 0x21000, ARENA, 0),))
    assert _one_pass(s) == (None, None)


def test_the_blocks_are_joined_from_lengths_and_sizes_alike_and_keep_ends_for_a_chunk_too_big():
    """`account.blocks._bounds`: one arena's in-use chunks as the one pass keeps them (lengths, `in_use_lengths`),
    another's as sizes (a sweep or the careful walk), joined in address order across the heaps' starts; a chunk
    whose usable length does not fit 32 bits of 8-byte units makes every block keep its end whole, the same ends."""
    import numpy as np
    from heapwalk.common.view import Blocks
    from heapwalk.glibc.account import blocks as glibc_blocks
    from heapwalk.glibc.bulk.onepass import in_use_lengths
    a = np.array([0x10000, 0x10040, 0x30000], dtype=np.uint64)
    a_sizes = np.array([0x40, 0x20, 0x100], dtype=np.int64)
    b = np.array([0x20000, 0x20400], dtype=np.uint64)
    kept = in_use_lengths(a, a_sizes)
    assert kept[1].dtype == np.uint32 and kept[1].tolist() == [7, 3, 31]
    for big in (0x30, (1 << 35) + 0x10):
        b_sizes = np.array([0x400, big], dtype=np.uint64)
        first, end, (numbers, index) = glibc_blocks._bounds([kept[0], b], [kept[1], b_sizes], [3, 1],
                                                            [0x10000, 0x20000, 0x30000])
        compact = end.dtype == np.uint32
        blocks = Blocks(first, None if compact else end, (numbers, index), 16, 8, lengths=end if compact else None)
        chunks = [0x10000, 0x10040, 0x20000, 0x20400, 0x30000]
        sizes = [0x40, 0x20, 0x400, big, 0x100]
        assert (blocks.lengths is None) == (big > 0x100000)
        assert blocks.starts.tolist() == [c + 16 for c in chunks]
        assert blocks.ends.tolist() == [c + s + 8 for c, s in zip(chunks, sizes)]
        assert blocks.arena.tolist() == [3, 3, 1, 1, 3] and numbers.tolist() == [1, 3]
        assert np.asarray(blocks.sizes()).tolist() == sizes


class _ReadAhead:
    """MEM (an ImageMemory) with a window read ahead as `CachedMemory.prefetch` reads it; how many were asked
    for and taken."""

    def __init__(self, mem: ImageMemory):
        from heapwalk.inferior.readahead import ReadAhead
        self.mem, self.asked, self.taken, self.ahead = mem, 0, 0, ReadAhead(self._early)

    def _early(self, address: int, buffer) -> bool:
        from heapwalk.inferior.memory import ReadError
        try:
            memoryview(buffer)[:] = self.mem.read(address, len(buffer))
        except ReadError:
            return False
        return True

    def read(self, address: int, size: int) -> bytes:
        return self.mem.read(address, size)

    def span_at(self, address: int):
        return self.mem.span_at(address)

    def prefetch(self, address: int, size: int) -> None:
        self.asked += 1
        self.ahead.start(address, size)

    def read_buffer(self, address: int, size: int) -> bytes:
        data = self.ahead.take(address, size)
        self.taken += data is not None
        return data if data is not None else self.mem.read(address, size)


@pytest.mark.parametrize("span", [4096, 8192 + 24, 1 << 16])
def test_a_sweep_in_small_windows_read_ahead_gives_what_one_window_gives(span, monkeypatch):
    """Windows smaller than some chunks (0x3000), of a size no chunk boundary keeps to, each next one read ahead
    where the chase will stop at the least, and read again from the chunk where that window does not hold it: the
    same lists, account and trim as the heap read in one window."""
    from heapwalk.glibc.bulk import sweep as sweep_module
    s = _synth(2, (2, 36))
    expected = _one_pass(s)
    mem = _ReadAhead(s.mem)
    monkeypatch.setattr(sweep_module, "SPAN", span)
    assert _one_pass(dataclasses.replace(s, mem=mem)) == expected
    assert mem.taken > (3 if span < 1 << 16 else 0)
    assert mem.asked > mem.taken or span > 4096            # some chunks outgrow the window read ahead


@pytest.mark.parametrize("block", [1, 5, 1 << 25])
@pytest.mark.parametrize("c_loop", [True, False])
def test_a_sweep_written_in_blocks_of_room_gives_what_one_block_gives(block, c_loop, monkeypatch):
    """The sweep's columns written in place in blocks of room (a window's chunks more than a block holds; one
    block), by the C loop or by numpy: the same lists, account and trim as one block written by the C loop."""
    from heapwalk.glibc.bulk import native, sweep as sweep_module
    s = _synth(2, (2, 36))
    expected = _one_pass(s)
    monkeypatch.setattr(sweep_module._Columns, "BLOCK", block)
    monkeypatch.setattr(sweep_module._Columns, "HEAP_BLOCK", block)
    if not c_loop:
        monkeypatch.setattr(native, "_LIB", None)
    assert _one_pass(s) == expected


@pytest.mark.parametrize("keep", [False, True])
def test_what_a_pass_keeps_is_not_the_room_it_gives_back(keep, monkeypatch):
    """The room an arena's sweep gives back is written over by the next one: the lists, account, trim, lengths in
    use and chunks the pass keeps are the same when that room is scribbled on as soon as it is given back."""
    from heapwalk.glibc.bulk.sweep import SweepRoom
    s = _synth(3, (2, 36))

    def kept():
        one = OnePass(s.mem, s.layout, s.tcaches, 0, True, keep_used=keep, keep_chunks=keep)
        lists = one.lists(s.arena, s.mem.read(ARENA, s.layout.arena_size))
        return ((lists.fastbins, lists.unsorted, lists.bins, lists.codes.tolist()), one.results((s.arena,)),
                {k: [a.tolist() for a in v] for k, v in one.used.items()},
                {k: {start: (r.first, r.end, r.bounds[1:len(r.labels) + 2].tolist(), r.labels.tolist())
                     for start, r in v.items()} for k, v in one.chunks.items()}, one.room)

    *expected, room = kept()
    assert sum(len(blocks) for blocks in room._free) == 4
    give_back = SweepRoom.give_back

    def scribbled(self, sweep):
        give_back(self, sweep)
        for blocks in self._free:
            for block in blocks:
                block[:] = 0xABABABABABABABAB

    monkeypatch.setattr(SweepRoom, "give_back", scribbled)
    assert list(kept()[:-1]) == expected


def test_in_use_lengths_made_a_step_at_a_time_as_at_once(monkeypatch):
    """`onepass.in_use_lengths` and `lengths_fit` judge and make the lengths a step of chunks at a time: the
    same lengths, the same sizes kept whole where one chunk in any step does not fit, the caller's sizes untouched."""
    import numpy as np
    from heapwalk.glibc.bulk import onepass
    monkeypatch.setattr(onepass, "_STEP", 3)
    sizes = np.array([0x20, 0x40, 0x30, 0x1000, 0x20, 0x50, 0x60], dtype=np.int64)
    address = np.arange(len(sizes), dtype=np.uint64) * np.uint64(0x1000)
    kept, lengths = onepass.in_use_lengths(address, sizes)
    assert kept is address and lengths.dtype == np.uint32
    assert lengths.tolist() == [(s - 8) // 8 for s in sizes.tolist()]
    assert sizes.tolist() == [0x20, 0x40, 0x30, 0x1000, 0x20, 0x50, 0x60]
    for bad in (0x58 + 4, (1 << 36) + 0x10):             # a size not of whole words, one too long, in the last step
        odd = sizes.copy()
        odd[-1] = bad
        assert not onepass.lengths_fit(odd.view(np.uint64))
        assert onepass.in_use_lengths(address, odd)[1].tolist() == odd.tolist()
    assert onepass.lengths_fit(np.zeros(0, dtype=np.uint64))


def _threaded(mem, own=None):
    """MEM as a core file's memory is read: a `CachedMemory` that another thread may read as OWN (else the same
    bytes through a cache of its own)."""
    return CachedMemory(mem.read, on_thread=lambda: own if own is not None else CachedMemory(mem.read))


def _kept(s: Synth, mem, ahead: bool):
    """What a one pass over MEM (S's bytes) keeps of S's arena, its sweep started ahead when AHEAD: the lists, the
    account and trim, the lengths in use, the pages seen, and the threads its sweeps ran on."""
    from heapwalk.analysis.pages import PagesSeen
    from heapwalk.glibc.bulk import ahead as ahead_module
    threads = []
    sweep = ahead_module.sweep_extents

    def recorded(*args):
        threads.append(threading.get_ident())
        return sweep(*args)

    one = OnePass(mem, s.layout, s.tcaches, 0, True, keep_used=True, pages=PagesSeen())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ahead_module, "sweep_extents", recorded)
        patch.setattr(ahead_module, "AHEAD_FROM", 0)          # the synthetic heaps are small
        if ahead:
            assert one.sweeps_ahead
            one.ahead(s.arena)
        lists = one.lists(s.arena, s.mem.read(ARENA, s.layout.arena_size))
    one.swept_all()
    return ((None if lists is None else (lists.fastbins, lists.unsorted, lists.bins, lists.codes.tolist())),
            one.results((s.arena,)), {k: [a.tolist() for a in v] for k, v in one.used.items()}, one.pages.seen(),
            threads)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: "%d.%d" % v)
def test_a_sweep_ahead_on_another_thread_gives_what_a_sweep_in_turn_gives(version, loops):
    """An arena swept ahead (`OnePass.ahead`, on a thread of heapwalk's own) gives the same lists, account, trim,
    lengths in use and pages as swept in turn, on sound heaps and damaged ones; a memory only gdb's thread may
    read (`ImageMemory` here, as a live process's) is swept in turn."""
    rng = random.Random(11)
    vouched = 0
    for trial in range(24):
        s = _synth(trial % 4, version, chunks=400)
        if trial % 2:
            at = rng.choice(s.words)
            s.mem.write_u64(at, rng.choice((0, 1, 0x21, at & ~0xF, 0x4141414141414141)))
        *expected, in_turn = _kept(s, s.mem, ahead=False)
        *got, swept_on = _kept(s, _threaded(s.mem), ahead=True)
        assert got == expected, f"trial {trial}"
        assert not in_turn and swept_on and threading.get_ident() not in swept_on
        vouched += expected[1] is not None
    assert vouched >= 12
    assert not OnePass(s.mem, s.layout, s.tcaches, 0, True).sweeps_ahead


def test_a_sweep_ahead_that_cannot_read_is_made_again_in_turn():
    """Where the other thread cannot read what gdb's thread can (bytes only gdb gives), its sweep gives up and the
    arena is swept again in turn: the same lists, account and pages, none noted twice."""
    s = _synth(2, (2, 36))
    blind = CachedMemory(lambda address, size: (_ for _ in ()).throw(ReadError(address, size)))
    *expected, _ = _kept(s, s.mem, ahead=False)
    *got, swept_on = _kept(s, _threaded(s.mem, blind), ahead=True)
    assert got == expected and expected[0] is not None and len(swept_on) == 1


def test_a_caller_waiting_for_a_sweep_ahead_is_told_its_progress(monkeypatch):
    """`SweepsAhead.take` tells the caller, on the caller's thread, how far the sweep ahead has come while it
    waits; the room given back before is let go once no sweep is to come."""
    from heapwalk.glibc.bulk import ahead as ahead_module
    from heapwalk.glibc.bulk.sweep import SweepRoom
    s = _synth(1, (2, 36))
    sweep = ahead_module.sweep_extents

    def slow(mem, extents, top, progress, pages, room):
        progress(123)
        time.sleep(0.3)
        return sweep(mem, extents, top, progress, pages, room)

    monkeypatch.setattr(ahead_module, "_TICK", 0.02)
    monkeypatch.setattr(ahead_module, "sweep_extents", slow)
    monkeypatch.setattr(ahead_module, "AHEAD_FROM", 0)          # the synthetic heaps are small
    room = SweepRoom()
    room.give_back(sweep(s.mem, [e for e in _extents(s)], s.arena.top, None, None, SweepRoom()))
    assert any(room._free)
    told = []
    ahead = ahead_module.SweepsAhead(CachedMemory(s.mem.read), room, None)
    try:
        ahead.start(ARENA, _extents(s), s.arena.top)
        swept = ahead.take(ARENA, lambda done: told.append((done, threading.get_ident())))
        assert ahead.take(ARENA) is ahead_module.NOT_AHEAD
    finally:
        ahead.close()
    assert swept is not None and swept.count > 1000
    assert (123, threading.get_ident()) in told and {thread for _, thread in told} == {threading.get_ident()}
    assert told[-1][0] == sum(e.end - e.start for e in _extents(s))      # its end told once it came
    assert not any(room._free)


def _extents(s: Synth):
    from heapwalk.glibc.walk.chunks import extents
    return sorted(extents(s.arena, s.layout), key=lambda e: e.start)


def test_a_small_arena_is_swept_in_turn(monkeypatch):
    """An arena whose heaps hold less than `AHEAD_FROM` is swept in turn on the caller's thread (handing it to
    another costs about what its sweep does), and no thread is made for it."""
    from heapwalk.glibc.bulk import ahead as ahead_module
    made = []
    monkeypatch.setattr(ahead_module, "own_pool", lambda name: made.append(name))
    s = _synth(2, (2, 36))
    assert sum(h.size for h in s.arena.heaps) < ahead_module.AHEAD_FROM
    one = OnePass(_threaded(s.mem), s.layout, s.tcaches, 0, True)
    assert one.sweeps_ahead
    one.ahead(s.arena)
    assert one.lists(s.arena, s.mem.read(ARENA, s.layout.arena_size)) is not None
    one.swept_all()
    assert not made


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: "%d.%d" % v)
def test_chunks_swept_ahead_are_the_chunks_swept_in_turn(version, loops, monkeypatch):
    """`heapwalk chunks`' sweeps started ahead (`Sweeper`, on a thread of heapwalk's own) give the chunks sweeps
    in turn give, on sound heaps and damaged ones (or leave the arena to the careful walk alike); a memory only
    gdb's thread may read is swept in turn, and an arena below `AHEAD_FROM` too."""
    from heapwalk.glibc.bulk import ahead as ahead_module
    from heapwalk.glibc.bulk.sweptchunks import Sweeper
    threads = []
    sweep = ahead_module.sweep_extents

    def recorded(*args):
        threads.append(threading.get_ident())
        return sweep(*args)

    monkeypatch.setattr(ahead_module, "sweep_extents", recorded)
    rng = random.Random(12)
    kept = []
    for trial in range(16):
        s = _synth(trial % 4, version, chunks=400)
        if trial % 2:
            at = rng.choice(s.words)
            s.mem.write_u64(at, rng.choice((0, 1, 0x21, at & ~0xF, 0x4141414141414141)))
        fastbins, unsorted, bins = arenas_module._free_lists(s.mem, s.layout, ARENA, s.arena.system_mem, [])
        arena = dataclasses.replace(s.arena, fastbins=fastbins, unsorted=unsorted, bins=bins)
        listed = listing_arrays(Listing.of_states(
            {c: st for lst in arena.free_lists() for c, st in zip(lst.chunks, [_STATES[lst.kind]] * lst.count)}))
        expected = swept_chunks(s.mem, s.layout, arena, listed)
        for memory, ahead_from, on_thread in ((_threaded(s.mem), 0, True), (s.mem, 0, False),
                                              (_threaded(s.mem), 1 << 40, False)):
            monkeypatch.setattr(ahead_module, "AHEAD_FROM", ahead_from)
            sweeper = Sweeper(memory, s.layout)
            threads.clear()
            try:
                sweeper.start(arena)
                got = swept_chunks(memory, s.layout, arena, listed, sweeper)
            finally:
                sweeper.close()
            assert (got is None) == (expected is None), f"trial {trial}"
            if got is not None:
                for flt in _FILTERS:
                    rows = got.select(flt.free, flt.used, flt.min_size, flt.max_size)
                    assert list(got.chunks(rows)) == list(expected.chunks(
                        expected.select(flt.free, flt.used, flt.min_size, flt.max_size))), f"trial {trial}"
            assert bool(threads) == on_thread and threading.get_ident() not in threads
        kept.append(expected is not None)
    assert sum(kept) >= 8
