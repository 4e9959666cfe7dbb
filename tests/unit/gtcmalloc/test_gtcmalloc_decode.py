"""Google's tcmalloc decoded from synthetic memory written where its measured layout keeps things
(tests/tools/gtc_synth.py): its static objects found by their shapes alone; each figure MallocExtension computes
(in use, page heap free and unmapped, central, transfer, per-CPU and thread caches) equal to the sum worked out
here by hand from what was written; damage named at the bytes that are wrong, never a traceback."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from heapwalk.common.findings import Severity
from heapwalk.gtcmalloc.check import check_gtcmalloc
from heapwalk.gtcmalloc.decode import _fragmentation, decode_gtcmalloc, thread_list
from heapwalk.gtcmalloc.find import GtcUnknown, locate
from heapwalk.gtcmalloc.layout import CRATE_0_1_19 as L
from heapwalk.gtcmalloc import objects as places
from heapwalk.gtcmalloc.objects import object_places
from gtc_synth import CPU, HEAP_PAGE, LEAF, PAGES, ROOT, SLABS, SPANS, THREAD_HEAPS, TRANSFER, Gtc

MiB, HUGE = 1 << 20, 2 << 20


def _filled(per_cpu: bool = True) -> Gtc:
    g = Gtc()
    g.size_class(1, 8, 1, free=10, spans=2)                        # 8192 % 8 = 0: no overhead
    g.listed_span(1, in_use=1019)                                  # 1,024 objects a span: 5 free in each
    g.listed_span(1, in_use=1019, bucket=3)
    g.size_class(2, 48, 1, free=3, spans=1, transfer=4)            # 8192 % 48 = 32 bytes at each span's end
    g.page_heap(0, from_system=3, in_use=2, filler=2, allocated=300, unmapped=10, cached=1)
    g.page_heap(1, from_system=1, in_use=1, filler=1, allocated=256, unmapped=0)
    if per_cpu:
        g.per_cpu((0, 1), {(0, 1): [Gtc.object(0, 8, 100 + i) for i in range(5)],
                           (1, 2): [Gtc.object(2, 48, 100), Gtc.object(2, 48, 101)]})
    return g


def _decoded(g: Gtc, tls=()):
    located = locate(g.mem, g.image())
    return located, decode_gtcmalloc(g.mem, located, "/synthetic/program", "synthetic",
                                     thread_list(g.mem, located, list(tls)))


def test_the_static_objects_are_found_by_their_shapes():
    located, _ = _decoded(_filled())
    assert (located.transfer, located.page_allocator, located.cpu_cache) == (TRANSFER, PAGES, CPU)


def test_every_figure_is_the_sum_tcmalloc_makes():
    _, state = _decoded(_filled())
    p = state.properties()
    central = 10 * 8 + 3 * 48 + 32
    transfer = 4 * 48
    cpu = 5 * 8 + 2 * 48
    free = HUGE + (2 * 256 - 300 - 10) * 8192 + (1 * 256 - 256) * 8192     # cached hugepage, filler's free pages
    unmapped = (3 - 2) * HUGE + 10 * 8192
    system = 4 * HUGE
    assert len(p) == 30 and p["generic.bytes_in_use_by_app"] == p["generic.current_allocated_bytes"]
    assert {k: p[k] for k in ("tcmalloc.pageheap_free_bytes", "tcmalloc.pageheap_unmapped_bytes")} == \
        {"tcmalloc.pageheap_free_bytes": free, "tcmalloc.pageheap_unmapped_bytes": unmapped}
    want = {"generic.current_allocated_bytes": system - central - transfer - cpu - free - unmapped,
                 "generic.heap_size": system - unmapped, "tcmalloc.page_heap_free": free,
                 "tcmalloc.page_heap_unmapped": unmapped, "tcmalloc.central_cache_free": central,
                 "tcmalloc.transfer_cache_free": transfer, "tcmalloc.cpu_free": cpu,
                 "tcmalloc.sharded_transfer_cache_free": 0, "tcmalloc.thread_cache_free": 0,
                 "tcmalloc.thread_cache_count": 0, "tcmalloc.per_cpu_caches_active": 1, "tcmalloc.local_bytes": cpu,
                 "tcmalloc.slack_bytes": free + unmapped}
    assert {k: p[k] for k in want} == want
    assert state.cpu_count == 2 and [(s.cpu, s.objects) for s in state.cpus] == [(0, 5), (1, 2)]
    assert [c.cpu_objects for c in state.classes[:2]] == [5, 2]


def test_thread_caches_are_the_list_a_thread_s_tls_leads_to():
    g = _filled(per_cpu=False)
    caches = g.thread_caches([1000, 24, 0], [0x7F0000100000, 0x7F0000200000, 0x7F0000300000])
    tls = [(11, 0x7F0000100000 - 8192, 0x7F0000100000), (12, 0x7F0000200000 - 8192, 0x7F0000200000)]
    located, state = _decoded(g, tls)
    assert located.cpu_cache is None and not state.per_cpu
    assert [(t.address, t.bytes, t.lwp) for t in state.threads] == [(caches[0], 1000, 11), (caches[1], 24, 12),
                                                                    (caches[2], 0, None)]
    assert state.properties()["tcmalloc.thread_cache_free"] == 1024


def test_a_cache_no_static_list_holds_is_not_counted():
    """With the per-CPU caches on a thread's TLS can still point at the cache it gave up: tcmalloc's list is empty
    (its head's word zero), and no thread cache is counted."""
    g = _filled()
    g.thread_caches([512], [0x7F0000100000])
    g.mem.write_u64(THREAD_HEAPS, 0)
    _, state = _decoded(g, [(11, 0x7F0000100000 - 8192, 0x7F0000100000)])
    assert state.threads == [] and state.properties()["tcmalloc.thread_cache_count"] == 0


def test_the_walk_of_the_central_lists_agrees_with_their_counters():
    g = _filled()
    g.listed_span(2, in_use=168)            # a 48-byte span holds 170 objects: 2 free there
    g.listed_span(2, in_use=169, bucket=5)  # and 1: the counter's 3
    _, state = _decoded(g)
    assert check_gtcmalloc(state, g.mem) == []


def test_a_counter_the_spans_do_not_bear_out_is_named_at_the_counter():
    g = _filled()
    g.listed_span(2, in_use=168)            # 2 free, the counter says 3
    _, state = _decoded(g)
    found = check_gtcmalloc(state, g.mem)
    assert [(f.severity, f.address) for f in found] == [(Severity.ERROR, Gtc.central(2) + L.cfl_counter)]
    assert "its spans hold 2 free objects, its counter says 3" in found[0].message


def test_a_full_span_on_a_list_of_spans_with_free_objects_is_named_at_the_span():
    g = _filled()
    span = g.listed_span(2, in_use=400)
    _, state = _decoded(g)
    found = check_gtcmalloc(state, g.mem)
    assert found[0].address == span + L.span_allocated and found[0].severity is Severity.ERROR


def test_impossible_counters_are_findings_and_leave_no_impossible_figure():
    g = _filled()
    g.mem.write(TRANSFER + 2 * L.tc_stride + L.tc_used, struct.pack("<ii", 900, 64))     # 900 of 64 slots
    g.mem.write(SLABS + 4 * 1, struct.pack("<HH", 9000, 10))                             # current past end
    _, state = _decoded(g)
    addresses = {f.address for f in state.findings if f.severity is Severity.ERROR}
    assert TRANSFER + 2 * L.tc_stride in addresses and SLABS + 4 in addresses
    assert all(v >= 0 for v in state.properties().values())


def test_a_build_of_another_layout_is_refused_in_one_line():
    g = _filled()
    g.mem.write_u64(TRANSFER + 5 * L.tc_stride + L.tc_owner, 0)      # the stride is not the measured one
    with pytest.raises(GtcUnknown, match="a build whose layout heapwalk has not measured") as raised:
        locate(g.mem, g.image())
    assert "\n" not in str(raised.value)


def test_the_page_map_is_found_by_the_pages_of_known_classes_and_names_every_span():
    g = _filled()
    third = g.listed_span(2, in_use=168)
    located, state = _decoded(g)
    assert located.pagemap == ROOT
    spans = state.spans
    assert spans.address.tolist() == [SPANS, SPANS + 64, third]
    assert spans.first_page.tolist() == [HEAP_PAGE + 1, HEAP_PAGE + 2, HEAP_PAGE + 3]
    assert spans.pages.tolist() == [1, 1, 1] and spans.size_class.tolist() == [1, 1, 2]
    assert spans.allocated.tolist() == [1019, 1019, 168] and spans.leaves.tolist() == [LEAF]


def test_a_leaf_that_cannot_be_read_is_named():
    g = _filled()
    g.mem.write_u64(ROOT + 8 * 5, 0x10)                  # a second leaf, nowhere
    _, state = _decoded(g)
    assert [(f.address, f.severity) for f in state.findings] == [(0x10, Severity.ERROR)]
    assert len(state.spans) == 2


def _objects(g: Gtc):
    _, state = _decoded(g)
    return state, object_places(g.mem, state)


def test_every_object_s_place_is_read_from_its_span_and_the_caches():
    """Class 1 (8 bytes: a cache of indexes and a chain) in two spans, class 2 (48 bytes) in one, each span's free
    objects read where it keeps them, the transfer cache's objects placed: the rest are in use."""
    g = _filled()                                       # spans 0, 1 of class 1: 5 free in each
    g.span_free(SPANS, 8, [0, 1, 2, 3, 4])             # all in the cache
    g.span_free(SPANS + 64, 8, [10, 11, 12, 13, 14])
    third = g.listed_span(2, in_use=167)               # 3 free: the chain's host and two more
    g.span_free(third, 48, [5, 6, 7])
    g.transfer_slots(2, [Gtc.object(2, 48, 9), Gtc.object(2, 48, 20), Gtc.object(2, 48, 30), Gtc.object(2, 48, 40)])
    state, o = _objects(g)
    assert o.findings == () and o.broken == frozenset()
    assert o.count.tolist() == [1024, 1024, 170]
    central = np.nonzero(o.place == places.CENTRAL)[0].tolist()
    assert central == [0, 1, 2, 3, 4, 1034, 1035, 1036, 1037, 1038, 2048 + 5, 2048 + 6, 2048 + 7]
    assert np.nonzero(o.place == places.TRANSFER)[0].tolist() == [2048 + 9, 2048 + 20, 2048 + 30, 2048 + 40]
    assert np.nonzero(o.place == places.CPU)[0].tolist() == [100, 101, 102, 103, 104, 2048 + 100, 2048 + 101]
    assert int((o.place == places.IN_USE).sum()) == 2048 + 170 - 13 - 4 - 7


def test_a_bitmap_of_free_objects_is_read():
    g = _filled()
    g.size_class(3, 64, 1, free=2, spans=1)
    span = g.listed_span(3, in_use=126)
    g.span_free(span, 64, [0, 127])
    state, o = _objects(g)
    k = int(np.nonzero(o.size_class == 3)[0][0])
    assert np.nonzero(o.place[o.first[k]:o.first[k] + o.count[k]] == places.CENTRAL)[0].tolist() == [0, 127]


def test_a_cached_pointer_into_an_object_is_named_at_its_slot():
    g = _filled()
    g.span_free(SPANS, 8, [0, 1, 2, 3, 4])
    g.span_free(SPANS + 64, 8, [10, 11, 12, 13, 14])
    third = g.listed_span(2, in_use=167)
    g.span_free(third, 48, [5, 6, 7])
    slots = g.transfer_slots(2, [Gtc.object(2, 48, 9), Gtc.object(2, 48, 20) + 8, Gtc.object(2, 48, 30),
                                 Gtc.object(2, 48, 40)])
    _, o = _objects(g)
    assert [(f.address, f.severity) for f in o.findings] == [(slots + 8, Severity.ERROR)]
    assert o.broken == frozenset({2})


def test_an_object_free_in_two_places_is_a_double_free_at_the_object():
    g = _filled()
    g.span_free(SPANS, 8, [0, 1, 2, 3, 4])
    g.span_free(SPANS + 64, 8, [10, 11, 12, 13, 14])
    third = g.listed_span(2, in_use=167)
    g.span_free(third, 48, [5, 6, 7])
    g.transfer_slots(2, [Gtc.object(2, 48, 6), Gtc.object(2, 48, 20), Gtc.object(2, 48, 30), Gtc.object(2, 48, 40)])
    _, o = _objects(g)
    assert [(f.address, f.kind.ident) for f in o.findings] == [(Gtc.object(2, 48, 6), "double_free")]


def test_a_span_whose_list_disagrees_with_its_count_is_named_at_its_count():
    g = _filled()
    g.span_free(SPANS, 8, [0, 1, 2, 3])                 # 4 free, the span says 1019 of 1024 are out
    g.span_free(SPANS + 64, 8, [10, 11, 12, 13, 14])
    _, o = _objects(g)
    assert SPANS + L.span_allocated in [f.address for f in o.findings] and 1 in o.broken


def test_realized_fragmentation_wraps_as_tcmalloc_s_unsigned_arithmetic_does():
    """tcmalloc subtracts its peak's sampled bytes from its backed ones unsigned: a deficit wraps to a huge figure,
    which heapwalk gives as tcmalloc does (measured: 2,787,230,977,531 for 641,244,910 sampled bytes 3% above)."""
    assert _fragmentation(1100, 1000) == 10 and _fragmentation(0, 0) == 0
    assert _fragmentation(620_000_000, 641_244_910) == int(100.0 * ((620_000_000 - 641_244_910) % (1 << 64))
                                                           / 641_244_910)
