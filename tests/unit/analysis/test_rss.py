"""RSS by owner (heapwalk.analysis.rss): the address space cut at every mapping's and claim's edge, each piece
measured once and given to one owner, so that the rows add up to the whole, exactly."""

from __future__ import annotations

import numpy as np

from heapwalk.analysis.rss import Claim, rss_by_owner, rss_change, spans_of
from heapwalk.jemalloc.extents import extent_runs
from heapwalk.output.rsstext import rss_change_lines, rss_verdict
from heapwalk.inferior.residency import Residency

MiB = 1 << 20

def _measure(runs):
    return Residency(runs, "test").resident_each

def test_every_resident_byte_has_one_owner_and_the_rows_add_up_to_the_whole():
    """A brk heap half claimed by malloc's main arena, an anonymous mapping holding a thread heap and a pool of
    the program's, a thread's stack, a shared memory segment, a library's code and data, the vdso: each byte
    measured once, claims first, and the total is the resident bytes of the whole address space."""
    mappings = [(0x1000000, 0x1400000, "[heap]", True),
                (0x7F0000000000, 0x7F0004000000, "", True),
                (0x7F0010000000, 0x7F0010800000, "", True),
                (0x7F0020000000, 0x7F0020100000, "/dev/shm/pool", True),
                (0x7F0030000000, 0x7F0030200000, "/usr/lib/libc.so.6", False),
                (0x7F0030200000, 0x7F0030210000, "/usr/lib/libc.so.6", True),
                (0x7FFF00000000, 0x7FFF00002000, "[vdso]", False)]
    claims = [Claim(0x1000000, 0x1200000, "heap", "glibc's arenas"),
              Claim(0x7F0000000000, 0x7F0001000000, "heap", "glibc's arenas"),
              Claim(0x7F0010700000, 0x7F0010800000, "stack", "thread 2")]
    runs = [(0x1000000, 0x1300000),                 # 2 MiB claimed, 1 MiB of the brk heap past the arena
            (0x7F0000800000, 0x7F0002000000),       # 8 MiB of the thread heap, 16 MiB of the pool
            (0x7F0010780000, 0x7F0010800000),       # the stack's top half MiB
            (0x7F0020000000, 0x7F0020100000),
            (0x7F0030000000, 0x7F0030080000), (0x7F0030200000, 0x7F0030204000),
            (0x7FFF00000000, 0x7FFF00001000)]
    rss = rss_by_owner(spans_of(mappings), claims, _measure(runs), "resident", "test")
    got = {(r.kind, r.name): r.bytes for r in rss.rows}
    assert got == {("heap", "glibc's arenas"): 2 * MiB + 8 * MiB, ("stack", "thread 2"): MiB // 2,
                   ("anonymous", "[heap]"): MiB, ("anonymous", "at 0x7f0000000000"): 16 * MiB,
                   ("shared", "/dev/shm/pool"): MiB, ("file code", "/usr/lib/libc.so.6"): MiB // 2,
                   ("file data", "/usr/lib/libc.so.6"): 16384, ("other", "[vdso]"): 4096}
    assert rss.total == sum(b - a for a, b in runs) == sum(got.values())
    assert [r.kind for r in rss.rows][:2] == ["heap", "stack"]
    heap = next(r for r in rss.rows if r.kind == "heap")
    assert heap.count == 2 and heap.mapped == 2 * MiB + 16 * MiB

def test_a_core_s_anonymous_memory_is_what_its_segments_hold_beside_the_files_it_names():
    """In a core, the files mapped are named by its notes and the anonymous memory is only its load segments:
    a segment no mapping names is anonymous; one a file mapping covers is that file's."""
    spans = spans_of([(0x400000, 0x401000, "/usr/bin/prog", False)],
                     regions=[(0x400000, 0x401000), (0x500000, 0x540000)])
    assert [(s.start, s.kind, s.name) for s in spans] == [(0x400000, "file code", "/usr/bin/prog"),
                                                          (0x500000, "anonymous", "at 0x500000")]

def test_a_claim_that_stands_for_adjacent_extents_counts_each_of_them():
    """jemalloc claims each run of adjacent extents once (`extents.extent_runs`): its row counts every extent, and
    the bytes are those of the extents claimed one by one."""
    address = np.array([0x13000, 0x10000, 0x11000, 0x18000], dtype=np.uint64)
    size = np.array([0x1000, 0x1000, 0x2000, 0x800], dtype=np.int64)
    runs = extent_runs(address, size)
    assert runs == [(0x10000, 0x14000, 3), (0x18000, 0x18800, 1)] and extent_runs(address[:0], size[:0]) == []
    spans, measure = spans_of([(0x10000, 0x20000, "", True)]), _measure([(0x10000, 0x20000)])
    one_each = rss_by_owner(spans, [Claim(int(a), int(a) + int(n), "heap", "jemalloc: extents")
                                    for a, n in zip(address, size)], measure, "resident", "test")
    by_runs = rss_by_owner(spans, [Claim(a, b, "heap", "jemalloc: extents", n) for a, b, n in runs], measure,
                           "resident", "test")
    assert by_runs == one_each and by_runs.rows[0].count == 4


def test_a_claim_outside_every_mapping_counts_nowhere():
    """What an allocator claims beyond the address space (damage) adds nothing: the total stays the space's."""
    rss = rss_by_owner(spans_of([(0x10000, 0x20000, "", True)]), [Claim(0x18000, 0x30000, "heap", "jemalloc")],
                       _measure([(0x10000, 0x30000)]), "resident", "test")
    assert {(r.kind, r.bytes) for r in rss.rows} == {("heap", 0x8000), ("anonymous", 0x8000)}
    assert rss.total == 0x10000


def test_the_kernel_s_vsyscall_page_above_2_63_is_measured_like_any_other():
    """/proc/PID/maps lists [vsyscall] at 0xffffffffff600000, past a signed 64-bit address: it is measured like
    any other mapping (nothing resident, so no row: a mapping with nothing resident owns none of the RSS), not
    an error."""
    rss = rss_by_owner(spans_of([(0x10000, 0x11000, "", True), (0xFFFFFFFFFF600000, 0xFFFFFFFFFF601000,
                                                                 "[vsyscall]", False)]),
                       [], _measure([(0x10000, 0x11000)]), "resident", "test")
    assert {(r.kind, r.name, r.bytes) for r in rss.rows} == {("anonymous", "at 0x10000", 4096)}


def test_when_the_heaps_hold_little_of_the_rss_the_verdict_says_so_first_and_names_what_holds_it():
    """An Apache child's shape: malloc's arenas hold 96 KiB of 8.6 MiB resident, APR's own mappings 7.4 MiB: the
    verdict starts by saying the allocators explain 1% and that other anonymous memory holds the most."""
    mappings = [(0x1000000, 0x1100000, "[heap]", True), (0x7F0000000000, 0x7F0000800000, "", True),
                (0x7F0010000000, 0x7F0010200000, "/usr/sbin/apache2", False)]
    runs = [(0x1000000, 0x1018000), (0x7F0000000000, 0x7F0000766666 & ~0xFFF), (0x7F0010000000, 0x7F0010100000)]
    rss = rss_by_owner(spans_of(mappings), [Claim(0x1000000, 0x1100000, "heap", "glibc's malloc: arenas")],
                       _measure(runs), "resident", "test")
    (sentence,) = rss_verdict(rss)
    assert sentence.startswith("The allocators' heaps hold 96 KiB of the process's 8.49 MiB resident (1%). Most of "
                               "it is elsewhere")
    assert "anonymous, 7.4 MiB (87%)" in sentence and "file code, 1 MiB (12%)" in sentence
    assert rss_verdict(None) == []


def test_two_snapshots_are_compared_by_owner_and_growth_outside_the_heaps_is_said():
    """'heapwalk diff': the kinds before and after, the total last; a process whose anonymous mappings grew 40
    MiB while its heaps grew 2 MiB is said to grow outside the allocators' heaps."""
    a = {"measure": "resident", "total": 100 * MiB,
         "rows": [{"kind": "heap", "bytes": 60 * MiB}, {"kind": "anonymous", "bytes": 40 * MiB}]}
    b = {"measure": "resident", "total": 142 * MiB,
         "rows": [{"kind": "heap", "bytes": 62 * MiB}, {"kind": "anonymous", "bytes": 80 * MiB}]}
    change = rss_change(a, b)
    assert change == [("heap", 60 * MiB, 62 * MiB), ("anonymous", 40 * MiB, 80 * MiB), ("total", 100 * MiB, 142 * MiB)]
    lines = rss_change_lines(change)
    assert lines[-1] == "  most of the growth, 40 MiB of 42 MiB, is outside the allocators' heaps"
    assert rss_change(a, None) is None and "not compared" in rss_change_lines(None)[0]
    assert rss_change(a, {**b, "measure": "in the core"}) is None      # a plain core's bytes are not its RSS


def test_shared_anonymous_memory_is_shared_and_a_private_mapping_of_dev_zero_anonymous():
    """MAP_SHARED|MAP_ANONYMOUS memory (php's opcache, a forking server's scoreboard) is named "/dev/zero
    (deleted)" by the kernel: shared memory; a private mapping named /dev/zero is the process's own."""
    spans = spans_of([(0x10000, 0x20000, "/dev/zero (deleted)", True), (0x30000, 0x40000, "/dev/zero", True)])
    assert [s.kind for s in spans] == ["shared", "anonymous"]


def test_a_mapping_named_in_brackets_keeps_its_name_in_the_table():
    """'[heap]', '[anon:name]': the table prints the names the kernel gives, not as markup."""
    from rich.console import Console
    from heapwalk.output.rsstext import rss_table
    spans = spans_of([(0x10000, 0x20000, "[heap]", True), (0x30000, 0x40000, "[anon:pool]", True)])
    rss = rss_by_owner(spans, [], _measure([(0x10000, 0x40000)]), "resident", "test")
    console = Console(width=200, record=True)
    console.print(rss_table(rss, False))
    text = console.export_text()
    assert "[heap]" in text and "[anon:pool]" in text


def test_the_page_s_owner_table_shows_every_heap_and_sums_the_rest_so_its_rows_add_up():
    """The report page's RSS table: twenty owners, the allocator's heap among the smallest (as Apache's malloc
    is, at 1% of its RSS): the heap is shown, the biggest others fill the table, and the owners left out are
    one "rest" row, so that the rows add up to the total."""
    import re
    from heapwalk.analysis.report import counted
    from heapwalk.output.htmlreport import RSS_ROWS, rss_section
    rows = [{"kind": "file code", "name": f"/usr/lib/lib{i}.so", "bytes": (100 - i) << 20, "mapped": (200 - i) << 20}
            for i in range(19)] + [{"kind": "heap", "name": "malloc's arenas", "bytes": 1 << 20, "mapped": 4 << 20}]
    total = sum(r["bytes"] for r in rows)
    page = rss_section({"total": total, "rows": rows, "measure": "resident", "source": "smaps"})
    body = page[page.index("<tbody>"):page.index("</tbody>")]
    cells = re.findall(r"<tr>(.*?)</tr>", body)
    assert len(cells) == RSS_ROWS + 1
    assert [c for c in cells if ">heap<" in c and "arenas" in c]              # the heap, though the smallest
    assert f"the rest ({counted(20 - RSS_ROWS, 'owners')})" in body
    shown = sorted(rows, key=lambda r: -r["bytes"])[:RSS_ROWS - 1]
    rest = total - sum(r["bytes"] for r in shown) - (1 << 20)
    assert f"{rest >> 20} MiB" in cells[-1]
    few = rss_section({"total": 3 << 20, "rows": rows[:2] + rows[-1:], "measure": "resident", "source": "smaps"})
    assert "the rest" not in few and "all 3 owners" in few
    assert counted(1, "arenas") == "1 arena" and counted(2, "owners") == "2 owners"
