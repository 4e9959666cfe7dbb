"""Which pages were in RAM (`heapwalk.inferior.residency`): the arithmetic over resident runs, a live process's
page map (this test's own), a core heapwalk's capture wrote, and what the report makes of it (the verdict,
what MALLOC_ARENA_MAX would have saved), without gdb."""

from __future__ import annotations

import dataclasses
import mmap
import os
from collections import Counter
from types import MappingProxyType

import numpy as np
import pytest

from heapwalk.analysis.report import build_report
from heapwalk.glibc.account.verdict import arena_max_saving, verdict
from heapwalk.capture.coreplan import PAGE, _codes, _mapping_segments
from heapwalk.inferior.pages import MapsLine, classify
from heapwalk.inferior.ranges import ranges_without
from heapwalk.inferior.residency import Pagemap, Residency, load_runs, of_core
from heapwalk.common.view import ArenaView, HeapView

MiB = 1 << 20
BASE = 0x7F0000000000


def test_resident_bytes_of_a_range_count_each_byte_inside_a_resident_run():
    r = Residency([(0x3000, 0x5000), (0x1000, 0x2000)], "test")
    assert r.total == 0x3000
    assert r.resident(0, 0x10000) == 0x3000
    assert r.resident(0x1800, 0x3800) == 0x800 + 0x800       # partial pages at both ends
    assert r.resident(0x2000, 0x3000) == 0 and r.resident(0x5000, 0x6000) == 0
    assert r.resident_sum([0x1000, 0x1000, 0x4000], [0x2000, 0x2000, 0x4010]) == 0x2000 + 0x10
    # ranges from damaged fields: an end before its start, addresses past the user half, hold nothing
    assert r.resident_sum(np.array([0x4000, 1 << 63], dtype=np.uint64), np.array([0x3000, (1 << 64) - 1],
                                                                                  dtype=np.uint64)) == 0
    assert Residency([], "none").resident(0, 1 << 40) == 0


def test_runs_less_the_runs_cut_from_them():
    assert ranges_without([(0, 100), (200, 300)], [(50, 60), (90, 210), (290, 400)]) == [(0, 50), (60, 90), (210, 290)]
    assert ranges_without([(0, 100)], []) == [(0, 100)]
    # overlapping cuts, and regions out of order, as the address space's may come
    assert ranges_without([(200, 300), (0, 100)], [(40, 60), (50, 70), (250, 260)]) == [
        (200, 250), (260, 300), (0, 40), (70, 100)]


def test_a_live_page_map_says_which_pages_were_touched():
    area = mmap.mmap(-1, 16 * PAGE)
    base = np.frombuffer(area, dtype=np.uint8).ctypes.data
    for page in (0, 1, 5, 15):
        area[page * PAGE] = 1
    known = Pagemap(os.getpid()).covering([(base, base + 16 * PAGE)])
    assert known.resident(base, base + 16 * PAGE) == 4 * PAGE
    assert known.resident(base + 2 * PAGE, base + 5 * PAGE) == 0
    assert known.resident(base + 5 * PAGE + 100, base + 6 * PAGE) == PAGE - 100
    area.close()


class _Core:
    """What `of_core` reads of a core: its load segments and its HEAPWALK note."""

    def __init__(self, loads, facts):
        self.loads, self.facts = loads, facts

    def capture_facts(self):
        return self.facts


def test_a_heapwalk_core_holds_what_was_resident_and_lists_what_it_holds_that_was_not():
    loads = [(BASE, 4 * PAGE, 0x1000, 2 * PAGE), (BASE + 4 * PAGE, 4 * PAGE, 0, 0),
             (BASE + 8 * PAGE, 2 * PAGE, 0x3000, 2 * PAGE)]
    r = of_core(_Core(loads, {"residency": "segments", "not_resident": [[BASE + 9 * PAGE, BASE + 10 * PAGE]]}))
    assert r.resident(BASE, BASE + 16 * PAGE) == 3 * PAGE
    assert r.resident(BASE + 9 * PAGE, BASE + 10 * PAGE) == 0
    assert of_core(_Core(loads, {"cpus_online": 2})) is None      # gcore's, or an older capture's


def test_the_core_writer_lists_the_pages_it_keeps_that_were_not_resident():
    present, swapped = (1 << 63) | (1 << 56), 1 << 62
    m = MapsLine(BASE, BASE + 8 * PAGE, "rw-p", 0, "00:00", 0, "")
    kinds = classify(np.array([present, swapped, 0, present, 0, 0, 0, present], dtype=np.uint64), m, False)
    absent: list = []
    segments = _mapping_segments(m, _codes(None, m, kinds, False), kinds, 2, absent, [])
    assert [(s.start, s.end) for s in segments if s.filesz] == [(BASE, BASE + 4 * PAGE), (BASE + 7 * PAGE, BASE + 8 * PAGE)]
    # the swapped page, and the page of zeros joined across between two kept runs
    assert absent == [(BASE + PAGE, BASE + 3 * PAGE)]


def test_recorded_runs_are_read_back_from_capture_json(tmp_path):
    path = tmp_path / "capture.json"
    path.write_text('{"resident_runs": [[4096, 12288]]}')
    assert load_runs(path).resident(0, 1 << 20) == 8192
    path.write_text('{"resident_runs": null}')
    assert load_runs(path) is None and load_runs(tmp_path / "missing.json") is None


def _arena(number: int, kind: str, system: int, in_use: int, free: int, free_resident: int | None,
           resident: int | None = None, top: int = 0, reclaim: int = 0) -> ArenaView:
    return ArenaView(number, 0x1000 * (number + 1), kind, 1, 1, system, in_use,
                     MappingProxyType({"tcache": 0, "fast": 0, "unsorted": 0, "small": 0, "large": free}), top, 0,
                     reclaim, True, resident if resident is not None else None if free_resident is None else
                     in_use + free_resident, free_resident, None if free_resident is None else 0)


def _view(arenas, residency: str = "the process's page map") -> HeapView:
    return HeapView("glibc", tuple(arenas), {a.number: Counter({a.free_total: 1}) for a in arenas}, (),
                    residency=residency)


def test_free_memory_no_longer_in_ram_is_not_called_a_problem():
    """After malloc_trim(0): 57 MiB free in the arenas, but only 1 MiB of it in RAM."""
    arenas = [_arena(0, "main", 2 * MiB, MiB, MiB, 0)] + \
        [_arena(n, "thread", 8 * MiB, MiB // 2, 7 * MiB, MiB // 8) for n in range(1, 9)]
    rep = build_report(_view(arenas), verdict=verdict)
    text = " ".join(rep.verdict)
    assert rep.verdict[0].startswith("Free memory, but not in RAM: 56 MiB of the 57 MiB free")
    assert "Fragmentation" not in text and "MALLOC_ARENA_MAX" not in text and "malloc_trim(0) would" not in text
    # the same heap where the target cannot say is fragmentation, said to be at most what it costs, with the
    # arena cap advised and what would tell
    blind = build_report(_view([_arena(a.number, a.kind, a.system, a.in_use, a.free_total, None) for a in arenas],
                               ""), verdict=verdict)
    assert blind.verdict[0].startswith("Fragmentation, not a leak") and "MALLOC_ARENA_MAX=2" in blind.verdict[2]
    assert blind.verdict[1].startswith("Whether this free memory costs RAM a plain core does not say") and \
        "'heapwalk capture PID'" in blind.verdict[1]


def test_fragmentation_in_ram_is_counted_in_ram_with_what_capping_arenas_would_have_saved():
    frees = [3, 4, 5, 6, 7]
    arenas = [_arena(0, "main", 2 * MiB, MiB, MiB, MiB // 2)] + \
        [_arena(n, "thread", 8 * MiB, MiB, 7 * MiB, f * MiB) for n, f in enumerate(frees, 1)]
    rep = build_report(_view(arenas), verdict=verdict)
    assert rep.verdict[0].startswith(f"Fragmentation, not a leak: {sum(frees) + 0.5:.3g} MiB of the ")
    assert rep.verdict[1].startswith("A further 10.5 MiB is free but not in RAM")
    # with 2 arenas, 4 of the 5 thread arenas are left out: the 4 smallest or the 4 largest
    assert arena_max_saving(rep, 2) == (4, (3 + 4 + 5 + 6) * MiB, (4 + 5 + 6 + 7) * MiB)
    assert arena_max_saving(rep, 4) == (2, (3 + 4) * MiB, (6 + 7) * MiB)
    assert arena_max_saving(rep, 6) is None
    assert "with 2, 4 arenas fewer, 18 MiB to 22 MiB; with 4, 2 arenas fewer, 7 MiB to 13 MiB" in rep.verdict[2]


def test_what_stays_in_ram_after_a_trim_is_said_after_what_was_given_back():
    """Most of the free memory given back, but pieces under a page still in RAM: the lead says the former,
    then the remedies for the latter, in RAM figures."""
    arenas = [_arena(0, "main", 2 * MiB, MiB, MiB, 0)] + \
        [_arena(n, "thread", 8 * MiB, MiB, 7 * MiB, 2 * MiB) for n in range(1, 5)]
    view = _view(arenas)
    view = HeapView(view.allocator, view.arenas, view.free_sizes, (), residency=view.residency,
                    reclaim_kept={"tcache": 0, "sub_page": 8 * MiB, "thread_top": 0, "main_top": 0})
    rep = build_report(view, verdict=verdict)
    assert rep.verdict[0].startswith("Free memory, but not in RAM: 21 MiB of the 29 MiB free")
    assert rep.verdict[1].startswith("4 thread arenas hold 12 MiB in RAM, 8 MiB of it free")
    assert rep.verdict[2].startswith("8 MiB of free memory lies in pieces under a page")


@pytest.mark.parametrize("free_resident", [0, 3 * MiB, 9 * MiB])
def test_no_share_is_over_100_percent_even_when_residency_says_more_than_the_walk(free_resident):
    """A damaged list can hold a chunk twice: its resident bytes are capped at the free bytes."""
    rep = build_report(_view([_arena(0, "main", 8 * MiB, 4 * MiB, 4 * MiB, free_resident, resident=8 * MiB)]),
                       verdict=verdict)
    for sentence in rep.verdict:
        for pct in (int(w.strip("(%),")) for w in sentence.split() if w.startswith("(") and w.endswith("%)")):
            assert 0 <= pct <= 100
    assert rep.idle_resident <= rep.free + rep.top


def test_remedies_are_weighed_against_the_process_rss():
    """The same fragmented heap: the arena cap is advised when its free memory is a fair share of the process's
    RSS; where the process holds forty times more elsewhere (a service whose memory is mostly not malloc's),
    the remedies are set aside with the figures that say why."""
    frees = [3, 4, 5, 6, 7]
    arenas = [_arena(0, "main", 2 * MiB, MiB, MiB, MiB // 2)] + \
        [_arena(n, "thread", 8 * MiB, MiB, 7 * MiB, f * MiB) for n, f in enumerate(frees, 1)]
    small = build_report(_view(arenas), verdict=verdict, process_rss=64 * MiB)
    assert "MALLOC_ARENA_MAX=2" in " ".join(small.verdict)
    large = build_report(_view(arenas), verdict=verdict, process_rss=2048 * MiB)
    text = " ".join(large.verdict)
    assert large.verdict[0].startswith("Fragmentation, not a leak") and "MALLOC_ARENA_MAX=2" not in text
    assert large.verdict[2] == ("Trimming, fewer arenas or another allocator would give back at most 25.5 MiB, "
                                "1.2% of the process's 2 GiB RSS: not worth a change here.")


def _main_top_view(thresholds: dict) -> HeapView:
    """php-fpm's shape after ImageMagick freed its big buffers: the main arena's top chunk holds 42 MiB of its
    44 MiB free, the thresholds as THRESHOLDS say (a core that does not say what is in RAM)."""
    main = _arena(0, "main", 48 * MiB, 4 * MiB, 2 * MiB, None, top=42 * MiB, reclaim=41 * MiB)
    view = _view([main], "")
    return dataclasses.replace(view, thresholds=thresholds)


def test_a_top_chunk_kept_under_a_raised_trim_threshold_is_named_with_its_reason_and_its_remedies():
    """When the main arena's top chunk holds most of the free memory and is under a trim threshold glibc raised
    on its own (the dynamic thresholds), the verdict says so first, gives the threshold and what pins it (the
    variables from the next start, mallopt in the program) and what malloc_trim(0) gives back now; with the
    default thresholds it does not, and a threshold set by the user is said to be set."""
    raised = build_report(_main_top_view({"trim_threshold": 48005120, "mmap_threshold": 24002560,
                                          "no_dyn_threshold": 0}), verdict=verdict)
    assert raised.verdict[0].startswith("Free memory glibc keeps under its trim threshold, not fragmentation")
    kept = next(s for s in raised.verdict if s.startswith("The main arena's top chunk holds 42 MiB"))
    assert "now 45.8 MiB, which glibc raised from 128 KiB on its own" in kept and "to 22.9 MiB" in kept
    assert "MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ in the environment (from the next start)" in kept
    assert kept.endswith("malloc_trim(0) gives back 41 MiB now, with neither.")
    assert not any("pin the break" in s for s in raised.verdict)
    pinned = build_report(_main_top_view({"trim_threshold": 48005120, "mmap_threshold": 24002560,
                                          "no_dyn_threshold": 1}), verdict=verdict)
    assert any("as MALLOC_TRIM_THRESHOLD_ or mallopt(M_TRIM_THRESHOLD) set it" in s for s in pinned.verdict)
    default = build_report(_main_top_view({"trim_threshold": 131072, "mmap_threshold": 131072,
                                           "no_dyn_threshold": 0}), verdict=verdict)
    assert default.verdict[0].startswith("Fragmentation, not a leak")
    assert not any("trim threshold, now" in s for s in default.verdict)


def test_large_free_chunks_kept_in_the_arenas_by_a_raised_mmap_threshold_are_named_with_the_reason():
    """A thread's arena holds 30 MiB free in chunks of 1-4 MiB after glibc raised its mmap threshold to 8 MiB on
    its own: the verdict says why such blocks are in the arenas, the threshold, and what pinning it does (and
    costs); with the default threshold, or one the user set, it says nothing of it."""
    def report(thresholds):
        arena = _arena(1, "thread", 64 * MiB, 30 * MiB, 30 * MiB, None, reclaim=2 * MiB)
        view = dataclasses.replace(_view([arena], ""), thresholds=thresholds,
                                   free_sizes={1: Counter({3 * MiB: 8, 2 * MiB: 3})})
        return build_report(view, verdict=verdict)
    said = [s for s in report({"trim_threshold": 16 * MiB, "mmap_threshold": 8 * MiB, "no_dyn_threshold": 0}).verdict
            if "mmap threshold" in s]
    assert len(said) == 1 and said[0].startswith("30 MiB of the free memory is in chunks of 128 KiB or more")
    assert "raised its mmap threshold from 128 KiB to 8 MiB on its own" in said[0]
    assert "MALLOC_MMAP_THRESHOLD_ in the environment (from the next start)" in said[0]
    for thresholds in ({"trim_threshold": 131072, "mmap_threshold": 131072, "no_dyn_threshold": 0},
                       {"trim_threshold": 16 * MiB, "mmap_threshold": 8 * MiB, "no_dyn_threshold": 1}):
        assert not any("mmap threshold" in s for s in report(thresholds).verdict)


def test_a_plain_core_holds_the_whole_pages_its_file_has_data_for(tmp_path):
    """`residency.in_core`: a core that says nothing of residency measures the pages of the process its file
    holds anything but zeros for (holes and pages of zeros alike: a copy of the core, sparse or not, says the
    same), whole pages of the process wherever its segment starts in the file."""
    from heapwalk.inferior.residency import in_core
    path = tmp_path / "core"
    with open(path, "wb") as f:
        f.write(b"\1" * 8192)
        f.write(bytes(4096))                   # written zeros: no different from a hole
        f.seek(40960)
        f.write(b"\2" * 4096)
        f.truncate(65536)

    class Core:
        loads = [(0x10000, 0x10000, 0, 0x10000), (0x30000, 0x1000, 0x900, 0x1000), (0x40000, 0x2000, 0, 0)]

        def __init__(self):
            self.f = open(path, "rb")

        def fileno(self):
            return self.f.fileno()

    core = Core()
    try:
        present = in_core(core)
    finally:
        core.f.close()
    assert present.within(0x10000, 0x20000).tolist() == [[0x10000, 0x12000], [0x1A000, 0x1B000]]
    assert present.resident(0x30000, 0x31000) == 0x1000       # at 0x900 of the file: all of it data
    assert present.total == 0x4000 and "does not say which were resident" in present.source


def test_a_plain_core_s_pages_a_walk_judged_are_not_read_again(tmp_path):
    """`residency.in_core` with the pages a walk already read (`pages.PagesSeen`): the same
    answer as reading them from the file, without reading them; what the walk says of its pages is taken as it
    says it, and only within the segment's bytes."""
    from heapwalk.analysis.pages import PagesSeen
    from heapwalk.inferior.residency import in_core
    image = bytearray(0x10000)
    image[0x0000:0x2000] = b"\1" * 0x2000
    image[0xA000:0xA008] = b"\2" * 8
    image[0xF000:0xF010] = b"\3" * 16
    path = tmp_path / "core"
    path.write_bytes(bytes(image))

    class Core:
        loads = [(0x10000, 0x10000, 0, 0x10000)]

        def __init__(self):
            self.f = open(path, "rb")

        def fileno(self):
            return self.f.fileno()

    words = PagesSeen()
    base = 0x10000 + 0x800                    # a window that starts inside a page, as a sweep's do
    words.note(base, np.frombuffer(bytes(image[0x800:0xC000]), dtype=np.uint64))
    judged, nonzero = words.seen()
    assert judged == [(0x11000, 0x1C000)] and nonzero == [(0x11000, 0x12000), (0x1A000, 0x1B000)]
    for seen in (None, (judged, nonzero)):
        core = Core()
        try:
            present = in_core(core, seen)
        finally:
            core.f.close()
        assert present.within(0x10000, 0x20000).tolist() == [[0x10000, 0x12000], [0x1A000, 0x1B000],
                                                              [0x1F000, 0x20000]]
    core = Core()
    try:
        said = in_core(core, ([(0x10000, 0x20000)], [(0x14000, 0x15000)]))   # taken as the walk says it
    finally:
        core.f.close()
    assert said.within(0x10000, 0x20000).tolist() == [[0x14000, 0x15000]]


def test_pages_another_reader_judged_are_not_judged_again():
    from heapwalk.analysis.pages import PagesSeen
    image = np.zeros(0x6000 // 8, dtype=np.uint64)
    image[0x1000 // 8] = image[0x5000 // 8] = 7
    seen = PagesSeen([(0x10000, 0x14000)])            # a sweep's: the scan's windows inside it are passed by
    seen.note(0x10000, image[:0x4000 // 8])
    assert seen.seen() == ([], [])
    seen.note(0x10000, image)                         # one that reaches past it is judged whole
    assert seen.seen() == ([(0x10000, 0x16000)], [(0x11000, 0x12000), (0x15000, 0x16000)])
