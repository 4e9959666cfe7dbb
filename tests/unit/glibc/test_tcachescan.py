"""Finding tcache structs by scanning an arena's chunks (no TLS), on synthetic heaps."""

from __future__ import annotations

import dataclasses
import struct

from heapwalk.glibc.walk.chunks import Listing
from heapwalk.glibc.model import ChunkState
from heapwalk.glibc.walk.arenas import blank_arena
from heapwalk.glibc.model import Heap
from heapwalk.glibc.walk.tcachescan import scan_tcaches
from synth import ARENA, HEAP, SynthHeap

HEAP_SIZE = 0x2000


def _arena(top: int):
    blank = blank_arena(ARENA, 0, True, set())
    return dataclasses.replace(blank, heaps=(Heap(HEAP, HEAP_SIZE, HEAP_SIZE, ARENA, 0),), top=top, findings=())


def _heap(version, chunks: list[int]) -> tuple[SynthHeap, int]:
    """A heap of chunks of the given sizes (each in use: PREV_INUSE set on every next chunk), then top;
    returns the heap and top's address."""
    h = SynthHeap(version, heap_size=HEAP_SIZE)
    at = HEAP
    for size in chunks:
        h.w(at + 8, size | 1)
        at += size
    h.w(at + 8, (HEAP + HEAP_SIZE - at) | 1)
    return h, at


def test_a_sound_tcache_is_found_and_a_zeroed_buffer_elsewhere_is_only_counted():
    size = 0x290
    h, top = _heap((2, 36), [0x20, size, 0x20, 0x20, 0x20, size, size])
    tcache = HEAP + 0x20 + 16
    first, second, third = (HEAP + 0x20 + size + 0x20 * i for i in range(3))
    h.tcache(tcache, {0: [first + 16, second + 16]})
    h.tcache(HEAP + 0x80 + size + 16, {1: [third + 16]})   # claims a 0x30 entry that is a 0x20 chunk
    scan = scan_tcaches(h.mem, h.layout, [_arena(top)], Listing.of_states({}), 7, set())
    (found,) = scan.tcaches
    assert found.address == tcache and found.arena == ARENA
    assert [(b.chunk_size, b.entries) for b in found.bins] == [(0x20, (first + 16, second + 16))]
    assert scan.ambiguous == 1                       # the last struct-sized chunk holds only zeros


def test_entries_already_listed_are_not_taken_again():
    """A struct whose entries a bin, a known tcache or an earlier scanned one holds is not another tcache."""
    h, top = _heap((2, 36), [0x290, 0x20, 0x290, 0x290])
    entry = HEAP + 0x290 + 16
    h.tcache(HEAP + 16, {0: [entry]})
    h.tcache(HEAP + 0x2b0 + 16, {0: [entry]})
    h.tcache(HEAP + 0x540 + 16, {0: [entry]})
    scan = scan_tcaches(h.mem, h.layout, [_arena(top)], Listing.of_states({}), 7, set())
    assert [tc.address for tc in scan.tcaches] == [HEAP + 16]
    known = {HEAP: ChunkState.TCACHE_STRUCT, entry - 16: ChunkState.TCACHE}
    assert scan_tcaches(h.mem, h.layout, [_arena(top)], Listing.of_states(known), 7, {HEAP + 16}).tcaches == ()
    assert scan_tcaches(h.mem, h.layout, [_arena(top)], Listing.of_states({entry - 16: ChunkState.SMALL}), 7, set()).tcaches == ()


def test_an_all_zero_struct_at_the_arenas_first_chunk_is_an_empty_tcache():
    h, top = _heap((2, 31), [0x290, 0x290])
    scan = scan_tcaches(h.mem, h.layout, [_arena(top)], Listing.of_states({}), 7, set())
    assert [tc.address for tc in scan.tcaches] == [HEAP + 16] and scan.tcaches[0].bins == ()
    assert scan.ambiguous == 1


def test_counts_above_the_fill_count_are_not_a_tcache():
    h, top = _heap((2, 36), [0x290, 0x20])
    entry = HEAP + 0x290 + 16
    h.tcache(HEAP + 16, {0: [entry]}, counts={0: 1})
    assert len(scan_tcaches(h.mem, h.layout, [_arena(top)], Listing.of_states({}), 7, set()).tcaches) == 1
    h.tcache(HEAP + 16, {0: [entry]}, counts={0: 9, 1: 0})
    assert scan_tcaches(h.mem, h.layout, [_arena(top)], Listing.of_states({}), 7, set()).tcaches == ()


def test_glibc_2_43_empty_tcache_counts_down_from_the_fill_count_anywhere():
    """From 2.42 num_slots starts at the fill count, so an empty tcache is not all zeros: taken anywhere."""
    h, top = _heap((2, 43), [0x20, 0x300, 0x300])
    lay = h.layout
    empty = HEAP + 0x20 + 16
    slots = struct.pack(f"<{lay.tcache_bins}H", *[16] * lay.tcache_bins)
    for i in range(0, len(slots), 8):
        h.w(empty + i, struct.unpack_from("<Q", slots.ljust(len(slots) + 8, b"\0"), i)[0])
    scan = scan_tcaches(h.mem, lay, [_arena(top)], Listing.of_states({}), 16, set())
    assert [tc.address for tc in scan.tcaches] == [empty] and scan.ambiguous == 0
