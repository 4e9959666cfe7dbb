"""tcmalloc's objects one by one, on a page heap laid out in memory by hand: which objects the program holds
(every object of a span less those its own list, a thread cache and a transfer cache hold), each span's bytes
by use as the heap map draws them, and what damage to each list gives: a finding at its address, and the
class's spans scanned as unknown memory, never judged."""

from __future__ import annotations

import numpy as np

from heapwalk.common.findings import Kind
from heapwalk.inferior.image import ImageMemory
from heapwalk.inferior.memory import ReadError
from heapwalk.common.mapkinds import MAP_KINDS
from heapwalk.tcmalloc.blocks import tcmalloc_blocks
from heapwalk.tcmalloc.check import _objects
from heapwalk.tcmalloc.decode import IN_USE, NORMAL, TcClass, TcSpan, TcState, TcThread
from heapwalk.tcmalloc.discovery import TcDiscovery
from heapwalk.tcmalloc.heapmap import span_strips, span_use
from heapwalk.tcmalloc.layout import LAYOUTS
from heapwalk.tcmalloc import objects
from heapwalk.tcmalloc.objects import SpanTable, cached_objects

PAGE = 8192
LAY = LAYOUTS[0]
SMALL = 0x10000000          # one page of class 1 (64-byte objects)
LARGE = SMALL + PAGE        # two pages: one allocation
FREE = LARGE + 2 * PAGE     # three free pages
CENTRAL = 0x20000000
THREAD = 0x30000000
SIZE = 64


def slot(i: int) -> int:
    return SMALL + i * SIZE


class Heap:
    """A page heap: objects 0-2 in a thread cache, 3-4 in a transfer batch, 5-9 the program's, 10-127 on the
    span's own list; a large span in use; a free span."""

    def __init__(self):
        self.mem = ImageMemory()
        self.mem.add(SMALL, bytearray(6 * PAGE))
        self.mem.add(CENTRAL, bytearray(3 * LAY.central_stride))
        self.mem.add(THREAD, bytearray(LAY.thread_prev + 8))
        self.link([0, 1, 2])
        self.link([3, 4])
        self.link(list(range(10, 128)))
        self.mem.write_u64(CENTRAL + LAY.central_stride + LAY.central_slots, slot(3))
        self.thread_list = ((1, slot(0), 3),)
        self.refcount, self.objects, self.central_objects = 10, slot(10), 118

    def link(self, order: list[int]) -> None:
        for a, b in zip(order, order[1:]):
            self.mem.write_u64(slot(a), slot(b))
        self.mem.write_u64(slot(order[-1]), 0)

    def state(self) -> TcState:
        found = TcDiscovery(LAY, "2.10", "libtcmalloc_minimal.so.4", 0, 0, 128, PAGE, 0, CENTRAL, 2, THREAD)
        classes = (TcClass(0, 0, 0, 0, 0, 0, 0, 0),
                   TcClass(1, SIZE, 1, 2, self.central_objects, 1, 1, 3))
        spans = (TcSpan(SMALL // PAGE, 1, IN_USE, 1, self.refcount, self.objects, False, 0x40000000),
                 TcSpan(LARGE // PAGE, 2, IN_USE, 0, 0, 0, False, 0x40000040),
                 TcSpan(FREE // PAGE, 3, NORMAL, 0, 0, 0, False, 0x40000080))
        thread = TcThread(THREAD, None, 3 * SIZE, 1 << 20, 3, self.thread_list)
        return TcState("hand-made", found, {}, classes, (thread,), spans)

    def walked(self):
        state = self.state()
        table = SpanTable.of(state)
        return state, table, cached_objects(self.mem, state, table)


def test_the_program_holds_what_no_list_holds():
    heap = Heap()
    state, table, cached = heap.walked()
    assert cached[1] == [] and sorted(cached[0].address.tolist()) == [slot(i) for i in range(5)]
    blocks, findings = tcmalloc_blocks(heap.mem, state, table, cached)
    assert findings == []
    assert blocks.starts.tolist() == [slot(i) for i in range(5, 10)] + [LARGE]
    assert blocks.sizes().tolist() == [SIZE] * 5 + [2 * PAGE]
    assert blocks.heaps == ((SMALL, FREE + 3 * PAGE),) and blocks.unknown == ()
    assert _objects(state, heap.mem, table, *cached) == []


def test_the_caches_keep_each_object_s_owner_and_class_in_the_narrowest_type():
    """Owners and classes a byte each while they fit one; the place each object is in, whose and of which class,
    as the lists say."""
    heap = Heap()
    _, _, (cached, _) = heap.walked()
    assert cached.owner.dtype == np.uint8 and cached.size_class.dtype == np.uint8
    by = {a: (p, o, k) for a, p, o, k in zip(cached.address.tolist(), cached.place.tolist(), cached.owner.tolist(),
                                          cached.size_class.tolist())}
    assert {by[slot(i)][1:] for i in range(5)} == {(0, 1), (1, 1)}
    assert objects._narrow([0, 255]).dtype == np.uint8 and objects._narrow([256]).dtype == np.uint16
    assert objects._narrow([]).dtype == np.uint8 and objects._narrow([70_000]).tolist() == [70_000]


def test_each_span_is_drawn_by_use_and_adds_up():
    heap = Heap()
    state, table, (cached, _) = heap.walked()
    use = span_use(table, cached)
    assert [int(use[k][0]) for k in ("held", "thread", "transfer", "central", "rounding")] == \
        [5 * SIZE, 3 * SIZE, 2 * SIZE, 118 * SIZE, 0]
    assert int(use["held"][1]) == 2 * PAGE
    strip, = span_strips(table, cached, leaked=np.array([slot(5)], dtype=np.uint64))
    drawn = {}
    for s, e, k in zip(strip.run_starts.tolist(), strip.run_ends.tolist(), strip.kinds.tolist()):
        drawn[MAP_KINDS[k]] = drawn.get(MAP_KINDS[k], 0) + e - s
    assert drawn == {"in_use": 4 * SIZE + 2 * PAGE, "leaked": SIZE, "tc_thread": 3 * SIZE,
                     "tc_transfer": 2 * SIZE, "tc_central": 118 * SIZE, "tc_free": 3 * PAGE}
    assert strip.trimmable.tolist() == [[FREE, FREE + 3 * PAGE]]


def test_a_thread_cache_list_that_loops_is_found_and_its_class_not_judged():
    heap = Heap()
    heap.mem.write_u64(slot(1), slot(0))
    state, table, cached = heap.walked()
    assert [(f.kind, f.address) for f in cached[1]] == [(Kind.LIST_CYCLE, slot(0))]
    blocks, _ = tcmalloc_blocks(heap.mem, state, table, cached)
    assert blocks.starts.tolist() == [LARGE] and blocks.unknown == ((SMALL, SMALL + PAGE),)


def test_a_list_whose_last_counted_object_links_back_is_a_loop():
    """The transfer batch holds two objects; the second linking back to the first loops only past the count,
    where a sound list ends with a null link."""
    heap = Heap()
    heap.mem.write_u64(slot(4), slot(3))
    _, _, (cached, findings) = heap.walked()
    assert [(f.kind, f.address, f.structure) for f in findings] == [(Kind.LIST_CYCLE, slot(3), "transfer cache")]
    assert 1 in cached.broken


def test_a_list_that_goes_on_past_its_count_is_found():
    heap = Heap()
    heap.mem.write_u64(slot(2), slot(7))
    _, _, (cached, findings) = heap.walked()
    assert [(f.kind, f.address, f.structure) for f in findings] == [(Kind.TCACHE_COUNT, THREAD + LAY.thread_list_entry,
                                                                     "thread cache")]
    assert findings[0].expected == "3" and 1 in cached.broken


def test_a_list_that_leaves_its_class_is_found_where_it_leaves():
    heap = Heap()
    heap.mem.write_u64(slot(3), LARGE + 8)
    _, _, (cached, findings) = heap.walked()
    assert [(f.kind, f.address, f.structure) for f in findings] == [(Kind.OTHER, LARGE + 8, "transfer cache")]
    assert 1 in cached.broken


def test_an_object_two_caches_hold_is_a_double_free():
    heap = Heap()
    heap.mem.write_u64(CENTRAL + LAY.central_stride + LAY.central_slots, slot(1))
    _, _, (cached, findings) = heap.walked()
    assert {(f.kind, f.address) for f in findings} >= {(Kind.DOUBLE_FREE, slot(1))}
    assert 1 in cached.broken


def test_a_span_list_shorter_than_its_refcount_says_leaves_the_span_unknown():
    heap = Heap()
    heap.mem.write_u64(slot(100), 0)
    state, table, cached = heap.walked()
    blocks, findings = tcmalloc_blocks(heap.mem, state, table, cached)
    assert [(f.kind, f.address, f.expected, f.found) for f in findings] == [
        (Kind.TCACHE_COUNT, 0x40000000, "118", "91")]
    assert blocks.unknown == ((SMALL, SMALL + PAGE),) and blocks.starts.tolist() == [LARGE]


def test_a_central_counter_the_spans_do_not_leave_is_an_accounting_error():
    heap = Heap()
    heap.central_objects = 117
    state, table, cached = heap.walked()
    findings = _objects(state, heap.mem, table, *cached)
    assert [(f.kind, f.expected, f.found) for f in findings] == [(Kind.ACCOUNTING, "118", "117")]
    assert findings[0].address == CENTRAL + LAY.central_stride + LAY.central_counter


def test_a_refcount_below_what_the_caches_hold_is_found():
    heap = Heap()
    heap.refcount, heap.central_objects, heap.objects = 4, 124, slot(4)
    heap.link(list(range(4, 128)))           # the transfer batch's second object is on the span's list too
    state, table, cached = heap.walked()
    kinds = {(f.kind, f.structure) for f in _objects(state, heap.mem, table, *cached)}
    assert (Kind.ACCOUNTING, "span") in kinds and (Kind.DOUBLE_FREE, "span") in kinds



def test_the_metadata_is_where_its_objects_lie_and_never_in_a_span():
    """Spans' headers, a thread cache and the allocator's next free byte close together make one range, whole
    pages, cut back where a span begins; a page map leaf far away is a range of its own."""
    from dataclasses import replace
    from heapwalk.tcmalloc.metadata import metadata_ranges
    base = FREE + 3 * PAGE                           # the metadata chunk starts where the spans end
    state = replace(Heap().state(), leaves=(0x50000000,), metadata_next=base + 0x3_1000 + 10)
    spans = tuple(s._replace(header=base + 48 * i) for i, s in enumerate(state.spans))
    thread = replace(state.threads[0], address=base + 0x2_0000)
    state = replace(state, spans=spans, threads=(thread,))
    assert metadata_ranges(state) == [(base, base + 0x3_2000), (0x50000000, 0x50000000 + 8 * LAY.pagemap_leaf)]
    inside = replace(state, leaves=(), metadata_next=None, threads=(replace(thread, address=SMALL - 0x100),))
    assert metadata_ranges(inside)[0] == (SMALL - PAGE // 2, SMALL)        # its page, up to the span


def test_the_verdict_names_the_classes_and_the_thread_caches_that_hold_the_free_memory():
    """When the central lists' free objects, or the thread caches', are a quarter of what tcmalloc holds free,
    the verdict says so with the classes that hold most (their share in use) and the caches' limit."""
    from dataclasses import replace
    from heapwalk.tcmalloc.allocator import TcmallocHeap
    from heapwalk.tcmalloc.decode import STATS_FIELDS
    heap = Heap()
    heap.central_objects = 256 * PAGE // SIZE - 10         # the small span made 256 pages long, 10 objects taken
    stats = {**dict.fromkeys(STATS_FIELDS, 0), "system_bytes": 1024 * PAGE, "free_bytes": 3 * PAGE,
             "committed_bytes": 1024 * PAGE, "aggressive_decommit": 0}
    state = replace(heap.state(), stats=stats, overall=32 << 20)
    state = replace(state, threads=(replace(state.threads[0], size=4 << 20),),
                    spans=(state.spans[0]._replace(pages=256),) + state.spans[1:])
    said = " ".join(TcmallocHeap(state, heap.mem).verdict(TcmallocHeap(state, heap.mem).report()))
    assert "fragmentation by size class: 64 B objects 2 MiB (0% of their objects in use)" in said
    assert "4 MiB of free objects sit in 1 thread caches, whose limit TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES is 32 MiB" \
        in said


class _Followed:
    """Memory that reads a list at once (`memory.links_from`, as a core's file does), around an `ImageMemory`."""

    def __init__(self, mem: ImageMemory):
        self.mem = mem

    def read(self, address: int, size: int) -> bytes:
        return self.mem.read(address, size)

    def follow(self, head: int, count: int) -> list[int]:
        out, link = [head], head
        while link and len(out) <= count and link not in out[:-1]:
            try:
                link = int.from_bytes(self.mem.read(link, 8), "little")
            except ReadError:
                break
            out.append(link)
        return out


def test_a_long_list_read_at_once_is_judged_as_a_list_walked_a_node_at_a_time():
    """A thread cache's list of 60 objects, sound or broken at any place (a loop, an object of no class, a null
    link, one past the count, a link out of memory): the same objects and the same findings either way."""
    def damaged(kind: str, at: int) -> Heap:
        heap = Heap()
        heap.link(list(range(10, 70)))
        heap.link(list(range(70, 128)))
        heap.thread_list = ((1, slot(10), 60),)
        heap.objects, heap.central_objects = slot(70), 58
        heap.mem.write_u64(slot(10 + at), {"loop": slot(12), "class": LARGE + 8, "null": 0, "past": slot(70),
                                           "unmapped": 0x50000000, "sound": slot(11 + at)}[kind])
        return heap
    for kind in ("sound", "loop", "class", "null", "unmapped"):
        for at in (0, 17, 40, 58):
            heap = damaged(kind, at)
            plain = heap.walked()[2]
            state = heap.state()
            table = SpanTable.of(state)
            followed = cached_objects(_Followed(heap.mem), state, table)
            assert sorted(followed[0].address.tolist()) == sorted(plain[0].address.tolist())
            assert [(f.kind, f.address, f.message) for f in followed[1]] == \
                [(f.kind, f.address, f.message) for f in plain[1]]
            assert followed[0].broken == plain[0].broken
    heap = damaged("past", 59)
    assert [f.kind for f in cached_objects(_Followed(heap.mem), heap.state(), SpanTable.of(heap.state()))[1]] == \
        [f.kind for f in heap.walked()[2][1]] == [Kind.TCACHE_COUNT]
