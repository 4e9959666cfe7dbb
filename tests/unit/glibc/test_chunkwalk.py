"""The chunk walk on synthetic heaps: its fast loop must agree with the full treatment of every chunk.

`walk_batches` with every=True gives each chunk the full treatment; without it, runs of chunks whose
headers are what their neighbours say go through a counting loop.  Both must add up the same bytes,
counts and findings, on sound heaps and on heaps with damaged headers, whatever the window size.
"""

from __future__ import annotations

import random
import struct

import pytest

from heapwalk.glibc.walk import chunkwalk, mmapped, resync
from heapwalk.glibc.walk.chunks import Extent, Listing, Tally
from heapwalk.glibc.model import ChunkState
from heapwalk.glibc.walk.chunkwalk import walk_batches
from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.ranges import ranges_without

BASE = 0x7F0000000000
LISTED = (ChunkState.TCACHE, ChunkState.FAST, ChunkState.UNSORTED, ChunkState.SMALL, ChunkState.LARGE)
BINS = (ChunkState.UNSORTED, ChunkState.SMALL, ChunkState.LARGE)


def synthetic_heap(rng: random.Random, chunks: int, non_main: bool) -> tuple[bytearray, dict[int, ChunkState], int]:
    """A heap as glibc leaves it: in-use chunks, tcache and fastbin chunks (which look in use), and binned
    chunks (the next chunk's PREV_INUSE clear, its prev_size their size), never two free ones together;
    then top.  Returns the bytes, the listed chunks and top's address."""
    arena_bit = 4 if non_main else 0
    heap = bytearray(chunks * 0x1010 + 0x10000)
    states: dict[int, ChunkState] = {}
    c, prev_free = 0, False
    for _ in range(chunks):
        size = rng.choice((0x20, 0x30, 0x40, 0x90, 0x110, 0x420)) if rng.random() < 0.97 else 0x1010
        st = rng.choice(LISTED) if rng.random() < 0.35 else None
        if st in BINS and prev_free:
            st = None
        bits = (0 if prev_free else 1) | (arena_bit if st not in BINS else 0)
        struct.pack_into("<Q", heap, c + 8, size | bits)
        if st is not None:
            states[BASE + c] = st
        prev_free = st in BINS
        c += size
        if prev_free:
            struct.pack_into("<Q", heap, c, size)  # the next chunk's prev_size
    struct.pack_into("<Q", heap, c + 8, (len(heap) - c) | (0 if prev_free else 1))
    return heap, states, BASE + c


def walk(heap: bytes, states, top: int, non_main: bool, every: bool) -> tuple:
    acc = Tally(BASE, len(heap))
    listing = Listing.of_states(states)
    batches = [b for batch in walk_batches(ImageMemory({BASE: bytes(heap)}), Extent(BASE, BASE, BASE + len(heap)),
                                            top, listing, acc, non_main, every) for b in batch]
    met = [b for b in batches if every or b[3] is not ChunkState.IN_USE]
    return (dict(acc.bytes), dict(acc.counts), acc.overhead, acc.unwalked,
            sorted((f.kind.ident, f.address, f.message) for f in acc.findings)), met


def damage(rng: random.Random, heap: bytearray, used: int, count: int) -> None:
    """Flips a bit or rewrites a byte in the size field or prev_size of COUNT chunks (of the first USED bytes)."""
    starts, c = [], 0
    while c < used:
        starts.append(c)
        c += struct.unpack_from("<Q", heap, c + 8)[0] & ~7
    for _ in range(count):
        at = rng.choice(starts) + rng.choice((0, 8, 8))
        if rng.random() < 0.5:
            heap[at + rng.randrange(2)] ^= 1 << rng.randrange(8)
        else:
            heap[at] = rng.randrange(256)


@pytest.mark.parametrize("non_main", [True, False])
@pytest.mark.parametrize("seed", range(40))
def test_fast_loop_agrees_with_the_full_treatment(seed, non_main, monkeypatch):
    rng = random.Random(seed)
    heap, states, top = synthetic_heap(rng, 3000, non_main)
    if seed % 2:
        damage(rng, heap, top - BASE, 3 + seed % 7)
    if seed % 3 == 0:
        monkeypatch.setattr(chunkwalk, "_WINDOW", 4096)  # many windows: headers and prev_size at their edges
    full, every_chunk = walk(heap, states, top, non_main, every=True)
    fast, not_plain = walk(heap, states, top, non_main, every=False)
    assert fast == full
    assert not_plain == [b for b in every_chunk if b[3] is not ChunkState.IN_USE]
    if seed % 2 == 0:
        assert full[4] == [] and full[3] == 0 and sum(full[0].values()) + full[2] == len(heap)


def test_sound_heap_accounts_every_listed_chunk_by_its_state():
    rng = random.Random(99)
    heap, states, top = synthetic_heap(rng, 2000, True)
    (by_bytes, by_count, _, _, findings), _ = walk(heap, states, top, True, every=False)
    assert findings == []
    for st in LISTED:
        assert by_count[st] == sum(1 for s in states.values() if s is st)
    assert by_count[ChunkState.TOP] == 1


def test_last_piece_of_an_old_top_is_a_fencepost_not_a_held_chunk():
    """sysmalloc, moving a thread arena to a new heap, leaves an old top smaller than MINSIZE as a 0x20
    chunk with a foot and no NON_MAIN_ARENA bit, before the 0-size header that ends the heap."""
    heap = bytearray(0x1000)
    struct.pack_into("<QQ", heap, 0, 0, 0x40 | 5)            # an in-use chunk of the thread arena
    struct.pack_into("<QQ", heap, 0x40, 0, 0x20 | 1)          # the old top's last piece: no arena bit
    struct.pack_into("<QQ", heap, 0x60, 0x20, 0 | 1)          # its foot, and the header that ends the heap
    for every in (True, False):
        (by_bytes, by_count, overhead, _, findings), _ = walk(heap[:0x80], {}, 0, True, every)
        assert findings == []
        assert by_count[ChunkState.FENCEPOST] == 1 and by_count[ChunkState.IN_USE] == 1
        assert by_bytes[ChunkState.FENCEPOST] == 0x20 and overhead == 0x80 - 0x60


def chunk_starts(heap: bytes, top: int) -> list[int]:
    """The offsets of HEAP's chunks before TOP, by their sizes."""
    starts, c = [], 0
    while BASE + c < top:
        starts.append(c)
        c += struct.unpack_from("<Q", heap, c + 8)[0] & ~7
    return starts


def test_a_zero_size_inside_a_heap_is_damage_and_the_walk_goes_on():
    """A size of 0 is a fencepost only in the last bytes of a heap that no longer holds top; in the middle
    of a heap it is damage at that chunk: named there (not as a free chunk before it, whose PREV_INUSE the
    zeroed header clears), and the walk resumes after it."""
    rng = random.Random(5)
    heap, states, top = synthetic_heap(rng, 400, False)
    starts = chunk_starts(heap, top)
    victim = next(s for s in starts[100:] if BASE + s not in states and BASE + starts[starts.index(s) - 1] not in states
                  and BASE + starts[starts.index(s) + 1] not in states)
    struct.pack_into("<Q", heap, victim + 8, 0)
    for every in (True, False):
        (by_bytes, _, overhead, unwalked, findings), _ = walk(heap, states, top, False, every)
        assert [(k, a) for k, a, _ in findings] == [("chunk_size", BASE + victim)]
        assert 0 < unwalked <= 0x10000 and by_bytes[ChunkState.TOP] == len(heap) - (top - BASE)
        assert sum(by_bytes.values()) + overhead + unwalked == len(heap)


def test_a_size_that_runs_into_the_next_chunk_is_named_at_its_own_chunk():
    """An overflow that enlarges a chunk's size (by a multiple of 16 short of the chunk after next): the
    finding names the chunk whose size is wrong, not the place inside the next chunk where the size leads."""
    rng = random.Random(6)
    heap, states, top = synthetic_heap(rng, 400, False)
    starts = chunk_starts(heap, top)
    i = next(i for i in range(100, len(starts) - 2) if not {BASE + starts[j] for j in range(i - 1, i + 3)} & set(states)
             and starts[i + 2] - starts[i + 1] >= 0x40)
    bad = starts[i]
    size = starts[i + 1] - bad + 0x20  # 0x20 into the next chunk
    struct.pack_into("<Q", heap, bad + 8, size | 1)
    for every in (True, False):
        (_, _, overhead, unwalked, findings), _ = walk(heap, states, top, False, every)
        assert [(k, a) for k, a, _ in findings] == [("chunk_size", BASE + bad)], findings
        assert unwalked == starts[i + 1] - bad


def _overrun_case(seed: int, listed_state: ChunkState | None, garbage: int):
    """A synthetic heap in which one chunk (in use, or held by LISTED_STATE's list) has a size 0x20 too big,
    and where that size lands, GARBAGE plausible in-use headers chain on before an impossible one, as when
    an overflow runs into user data that happens to hold small numbers."""
    rng = random.Random(seed)
    heap, states, top = synthetic_heap(rng, 400, False)
    starts = chunk_starts(heap, top)
    i = next(i for i in range(100, len(starts) - 2) if not {BASE + starts[j] for j in range(i - 1, i + 3)} & set(states)
             and starts[i + 2] - starts[i + 1] >= 0x20 + 0x20 * garbage + 0x20)
    bad, nxt = starts[i], starts[i + 1]
    sound = walk(heap, dict(states), top, False, True)[0]
    if listed_state is not None:
        states[BASE + bad] = listed_state
    sound_listed = walk(heap, dict(states), top, False, True)[0]
    struct.pack_into("<Q", heap, bad + 8, (nxt - bad + 0x20) | 1)
    landed = nxt + 0x20
    for k in range(garbage):  # headers of 0x20-byte "chunks" that look in use
        struct.pack_into("<QQ", heap, landed + 0x20 * k, 0, 0x21)
    struct.pack_into("<Q", heap, landed + 0x20 * garbage + 8, 0xA5A5A5A5A5A5A5A5)
    return heap, states, top, bad, nxt, sound_listed if listed_state is not None else sound


@pytest.mark.parametrize("listed_state", [None, ChunkState.TCACHE, ChunkState.FAST])
@pytest.mark.parametrize("garbage", [0, 3])
def test_the_size_that_sent_the_walk_astray_is_named_even_chunks_later(listed_state, garbage):
    """The walk meets the impossible size several chunks after the damaged one (the bad size landed on
    user data that reads as headers), or the damaged chunk is one the lists hold: the finding still names
    the chunk whose size is wrong, the walk resumes at its real next chunk, and only that chunk's bytes are
    left unwalked: every other chunk is counted as the sound heap counts it."""
    heap, states, top, bad, nxt, sound = _overrun_case(7 + garbage, listed_state, garbage)
    for every in (True, False):
        (by_bytes, by_count, overhead, unwalked, findings), met = walk(heap, states, top, False, every)
        assert [(k, a) for k, a, _ in findings] == [("chunk_size", BASE + bad)], findings
        assert unwalked == nxt - bad
        st = listed_state or ChunkState.IN_USE
        assert by_bytes[st] == sound[0][st] - (nxt - bad) and by_count[st] == sound[1][st] - 1
        assert all(by_bytes[s] == sound[0][s] for s in ChunkState if s is not st)
        assert all(m[0] != BASE + bad for m in met)


def test_an_mmapped_chunk_merged_with_the_heap_above_it_is_found():
    """The kernel places a chunk's mapping in the gap glibc leaves below a thread heap when it aligns the
    heap, and merges it with the heap's first pages into one region: the chunk is found all the same."""
    from heapwalk.glibc.locate.layout import layout_for
    chunk, heap = 0x7f0000000000 - 0x3000, 0x7f0000000000
    region = bytearray(0x3000 + 0x2000)
    struct.pack_into("<QQ", region, 0, 0, 0x3000 | 2)         # the mmapped chunk, alone in its mapping
    struct.pack_into("<QQ", region, 0x3000, heap + 0x20, 0)   # the heap's heap_info (ar_ptr, prev)
    mem = ImageMemory({chunk: region})
    found = mmapped.find_mmapped(mem, layout_for((2, 36)), [(chunk, heap + 0x2000)], [(heap, heap + (64 << 20))])
    assert [(c.address, c.size, c.span) for c in found] == [(chunk, 0x3000, 0x3000)]


def test_without_cuts_ranges_out_of_regions():
    regions = [(0, 100), (200, 300), (400, 500)]
    assert ranges_without(regions, [(50, 60), (250, 450)]) == [(0, 50), (60, 100), (200, 250), (450, 500)]
    assert ranges_without(regions, [(0, 100)]) == [(200, 300), (400, 500)]
    assert ranges_without(regions, []) == regions


def test_an_mmapped_chunk_merged_with_anonymous_memory_below_it_is_found_page_by_page():
    """A chunk's mapping placed right above a thread's stack merges with it: the region starts with the
    stack, so only the page-by-page search finds the chunk (collect keeps it when mp_'s totals agree)."""
    from heapwalk.glibc.locate.layout import layout_for
    base = 0x7f0000000000
    region = bytearray(0x2000 + 0x3000)
    region[:0x2000] = bytes(range(256)) * 32                      # the stack's top pages: any data
    struct.pack_into("<QQ", region, 0x2000, 0, 0x3000 | 2)      # the chunk, alone in its mapping
    mem = ImageMemory({base: region})
    layout = layout_for((2, 31))
    assert mmapped.find_mmapped(mem, layout, [(base, base + len(region))], []) == []
    found = mmapped.find_mmapped_in_pages(mem, layout, [(base, base + len(region))], [])
    assert [(c.address, c.span) for c in found] == [(base + 0x2000, 0x3000)]


def test_without_mp_only_a_merged_chunk_that_ends_its_region_is_kept():
    """With no mp_ to count against, a chunk found page by page is kept only when its mapping ends the range
    that holds it (or ends where the next kept chunk starts): a header-shaped pair of words in the middle of
    other data is not taken for a chunk."""
    from heapwalk.glibc.model import MmappedChunk
    base = 0x7f0000000000
    ends = MmappedChunk(base + 0x5000, 0x2ff0, 0x3000)
    below = MmappedChunk(base + 0x3000, 0x1ff0, 0x2000)
    stray = MmappedChunk(base + 0x1000, 0xff0, 0x1000)
    kept = mmapped._ending_their_ranges([stray, below, ends], [(base, base + 0x8000)])
    assert sorted(c.address for c in kept) == [below.address, ends.address]
    assert mmapped._ending_their_ranges([stray], [(base, base + 0x8000)]) == []


@pytest.mark.parametrize("seed", range(8))
def test_the_kept_path_from_an_anchor_is_the_path_read_afresh(seed):
    """`resync.Chain` keeps the chunks from an anchor between the overruns a walk asks of it: for breaks
    asked in any order (on a chunk, past the end of the steps, inside a chunk, past a size too small to be
    a chunk's), its answer is the path read from the anchor each time."""
    rng = random.Random(seed)
    heap, starts = bytearray(0x4000), []
    c = 0
    while c < 0x3000:
        size = rng.choice((0x20, 0x30, 0x90, 0x110)) if rng.random() < 0.98 else rng.choice((0, 8))
        struct.pack_into("<Q", heap, c + 8, size | 1)
        starts.append(BASE + c)
        c += size or 0x10
    word = lambda address: struct.unpack_from("<Q", heap, address - BASE)[0]    # noqa: E731

    def afresh(anchor: int, c: int):
        path, b = [], anchor
        while b < c:
            size = word(b + 8) & ~7
            if size < 0x20:
                return None
            path.append((b, size))
            b += size
        return path if b == c else None
    kept, anchor, found = resync.Chain(), starts[0], 0
    for _ in range(400):
        if rng.random() < 0.05:
            anchor = rng.choice(starts)
        c = rng.choice([s for s in starts if s >= anchor][:80]) if rng.random() < 0.6 else \
            anchor + rng.randrange(0, 0x1000, 16)
        path = kept.to(word, anchor, c)
        assert path == afresh(anchor, c)
        found += path is not None
    assert found > 50


def _pieces_image():
    """A non-contiguous main arena's memory: one region where foreign data (one page of it starting with a
    header-shaped pair of words) runs into a piece closed by two fenceposts and then the piece of top, and
    a second region holding a third piece; system_mem is the three pieces."""
    from heapwalk.glibc.model import Arena
    base, other = 0x7f0000000000, 0x7f0000100000
    region = bytearray(0x8000)
    region[:0x3000] = bytes(range(256)) * 48
    struct.pack_into("<QQ", region, 0x1000, 0, 0x80 | 1)                  # looks like a chunk, leads nowhere
    struct.pack_into("<QQ", region, 0x1080, 0, 0x7)
    for offset, size in ((0x3000, 0x100), (0x3100, 0x1ee0), (0x4fe0, 0x10), (0x4ff0, 0x10)):
        struct.pack_into("<QQ", region, offset, 0, size | 1)              # in use, then the two fenceposts
    struct.pack_into("<QQ", region, 0x5000, 0, 0x200 | 1)
    struct.pack_into("<QQ", region, 0x5200, 0, 0x2e00 | 1)                # top, to the region's end
    third = bytearray(0x1000)
    for offset, size in ((0, 0xfe0), (0xfe0, 0x10), (0xff0, 0x10)):
        struct.pack_into("<QQ", third, offset, 0, size | 1)
    mem = ImageMemory({base: region, other: third})
    main = Arena(address=0x7f0000200000, number=0, is_main=True, mutex=0, flags=2, have_fastchunks=0,
                 top=base + 0x5200, top_size=0x2e00, last_remainder=0, next=0, next_free=0, attached_threads=1,
                 system_mem=0x6000, max_system_mem=0x6000, heaps=(), fastbins=(), unsorted=None, bins=())
    return mem, main, [(base, base + 0x8000), (other, other + 0x1000)]


def test_the_pieces_of_a_main_arena_are_found_past_foreign_memory_merged_with_them():
    """The kernel merges a piece with whatever anonymous memory lies next to it: every page of a region may
    start a piece, so one after foreign data is found, and so is the piece beside it and one elsewhere."""
    mem, main, regions = _pieces_image()
    base, other = regions[0][0], regions[1][0]
    assert mmapped.main_regions(mem, main, regions, []) == [
        (base + 0x3000, base + 0x5000), (base + 0x5000, base + 0x8000), (other, other + 0x1000)]


def test_a_main_arena_with_a_piece_missing_keeps_the_pieces_found_and_says_what_is_missing():
    """A piece not in the target's memory: the arena keeps the pieces found (never a heap from sbrk_base to a
    top below it) and a finding says how much of system_mem is not walked."""
    from types import SimpleNamespace
    mem, main, regions = _pieces_image()
    disc = SimpleNamespace(heap_max_size=64 << 20, libc_range=None)
    whole = mmapped.with_main_regions(mem, disc, main, [main], regions)
    assert sum(h.size for h in whole.heaps) == main.system_mem and whole.findings == ()
    part = mmapped.with_main_regions(mem, disc, main, [main], regions[:1])
    assert [(h.address, h.size) for h in part.heaps] == [(regions[0][0] + 0x3000, 0x2000),
                                                        (regions[0][0] + 0x5000, 0x3000)]
    (finding,) = part.findings
    assert "0x5000 of its system_mem 0x6000" in finding.message, finding.message


@pytest.mark.parametrize("seed", range(8))
def test_a_listing_is_the_same_as_ints_and_as_arrays(seed):
    """`Listing.of_state`: its ints (the careful walk's) and its arrays (the one pass's, made from the lists' own
    arrays without them) agree, with chunks in two lists, misaligned links and tcache entries below 16."""
    from array import array
    from types import SimpleNamespace
    import numpy as np
    from heapwalk.glibc.model import BinKind, BinList, Tcache, TcacheBin
    rng = random.Random(seed)
    pool = [BASE + 16 * rng.randrange(4096) + rng.choice((0, 0, 0, 8)) for _ in range(300)]

    def binlist(kind):
        chunks = rng.sample(pool, rng.randrange(0, 40))
        return BinList(kind, 1, 0, array("Q", chunks), array("Q", [0x21] * len(chunks)))
    arenas = [SimpleNamespace(free_lists=lambda lists=tuple(binlist(k) for k in (BinKind.FAST, BinKind.UNSORTED,
                                                                                    BinKind.SMALL, BinKind.LARGE)):
                              tuple(b for b in lists if len(b.chunks)))
              for _ in range(3)]
    tcaches = [("t", Tcache(rng.choice(pool + [8]), (TcacheBin(0, 0x20, 3, tuple(rng.choice(pool + [8, 0]) + 16 * k
                                                                                  for k in range(3))),)))]
    state = SimpleNamespace(arenas=arenas, tcaches=lambda: tcaches)
    listing = Listing.of_state(state)
    ints = Listing(listing.keys)
    codes = {BinKind.FAST: 2, BinKind.UNSORTED: 3, BinKind.SMALL: 4, BinKind.LARGE: 5}
    keys = [c | codes[b.kind] for a in arenas for b in a.free_lists() for c in b.chunks]
    keys += [tc.address - 16 | 0 for _, tc in tcaches] + [e - 16 | 1 for _, tc in tcaches for b in tc.bins
                                                          for e in b.entries]
    assert listing.keys == sorted(keys)
    fresh = Listing.of_state(state)          # its arrays made before its ints, from the lists' own
    for made, want in zip(fresh.arrays(), ints.arrays()):
        assert made.dtype == want.dtype and np.array_equal(made, want)
