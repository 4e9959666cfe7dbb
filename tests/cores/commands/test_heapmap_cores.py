"""Heap maps on every reproducer of every glibc (symbols hidden) and on jemalloc's: an SVG whose rectangles add up to
each arena's report, the walks' chunks, what trim gives back, the leaked chunks; a page that stands alone."""

from __future__ import annotations

import functools
import html
import json
import re
import xml.etree.ElementTree as ET

import pytest

from browser import chunks_per_arena, heap_groups, png_pixels
from conftest import GLIBCS, JEMALLOCS, NO_SYMBOLS, capture, capture_jemalloc, glibc, rotating, run_gdb
from harness import REPRODUCERS

from heapwalk import registry
from heapwalk.common.mapkinds import MAP_KINDS
from heapwalk.output.heapmaps import COLOURS

registry.allocators()        # each allocator adds its kinds of run
K = {name: i for i, name in enumerate(MAP_KINDS)}


def _colours(png: bytes) -> tuple[int, int, set[str]]:
    width, height, rows = png_pixels(png)
    return width, height, {"#" + bytes(row[i:i + 3]).hex() for row in rows for i in range(0, len(row), 3)}


#: each reproducer under the system glibc and one other in turn (conftest's fixed subset)
CASES = [pytest.param(g, n, id=f"{g}-{n}") for i, n in enumerate(REPRODUCERS) for g in rotating(i)]


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    """mapped(glibc, name) -> (the SVG's root, the report's JSON, gdb's stdout, the HTML page's path) of
    'heapwalk map' and 'heapwalk report --no-leaks --html' on the core, symbols hidden."""
    tmp = tmp_path_factory.mktemp("maps")

    @functools.cache
    def compute(g: str, name: str):
        c = capture(g, name)
        svg, js, page = tmp / f"{g}-{name}.svg", tmp / f"{g}-{name}.json", tmp / f"{g}-{name}.html"
        result = run_gdb([str(c.exe), str(c.core)], [f"heapwalk map --svg {svg} --png {svg.with_suffix('.png')}",
                                                     f"heapwalk report --no-leaks --json {js} --html {page}"],
                         iex=glibc(g).gdb_settings(False))
        assert result.returncode == 0 and svg.exists() and page.exists(), result.stderr
        return ET.parse(svg).getroot(), json.loads(js.read_text()), result.stdout, page
    return compute


@pytest.mark.cores
@pytest.mark.parametrize("g,name", CASES)
def test_the_maps_hold_every_byte_the_report_counts(mapped, g, name):
    """Each heap's rectangles add up to its bytes; per arena, the map's bytes of each kind are the report's:
    in use (the tcache structs with it), each kind of free chunk, top, headers, and all but the mapped tail
    add up to system_mem."""
    root, doc, out, page = mapped(g, name)
    svg = page.with_suffix(".svg")
    kinds: dict[int, dict[str, int]] = {}
    for group in root.findall("{http://www.w3.org/2000/svg}g"):
        rects = [r for r in group.findall("{http://www.w3.org/2000/svg}rect") if r.get("data-kind")]
        assert sum(int(r.get("data-bytes")) for r in rects) == int(group.get("data-bytes"))
        arena = kinds.setdefault(int(group.get("data-arena")), {})
        for r in rects:
            arena[r.get("data-kind")] = arena.get(r.get("data-kind"), 0) + int(r.get("data-bytes"))
    rows = {a["number"]: a for a in doc["report"]["arenas"]}
    assert set(kinds) == set(rows)
    for number, got in kinds.items():
        row = rows[number]
        assert got.get("in_use", 0) + got.get("tcache_struct", 0) == row["in_use"], number
        for kind in ("tcache", "fast", "unsorted", "small", "large"):
            assert got.get(kind, 0) == row["free"].get(kind, 0), (number, kind)
        assert got.get("top", 0) == row["top"] and got.get("overhead", 0) == row["overhead"], number
        assert "unwalked" not in got and "reserved" not in got
        assert sum(got.values()) - got.get("unused", 0) == row["system"], number
    assert out.count(" heap ") + out.count("main arena ") >= len(kinds)
    # the PNG of the same strips: a strip of 1024 pixels each, painted in the colours of the kinds that hold
    # at least a hundredth of the bytes
    width, _, colours = _colours(svg.with_suffix(".png").read_bytes())
    total = sum(sum(k.values()) for k in kinds.values())
    big = {COLOURS[kind] for arena in kinds.values() for kind, n in arena.items() if n >= total / 100}
    assert width == 1024 + 16 and big <= colours


def _per_arena(root) -> dict[int, dict[str, int]]:
    """Arena number -> its strips' chunks per kind (data-chunks), trimmable bytes (the "trim" band's
    rectangles) and "strips", from a maps SVG's root."""
    out: dict[int, dict[str, int]] = {}
    for group in root.findall("{http://www.w3.org/2000/svg}g"):
        arena = out.setdefault(int(group.get("data-arena")), {"trim": 0, "strips": 0})
        arena["strips"] += 1
        for pair in group.get("data-chunks").split():
            kind, n = pair.split("=")
            arena[kind] = arena.get(kind, 0) + int(n)
        band = sum(int(r.get("data-bytes")) for r in group.findall("{http://www.w3.org/2000/svg}rect")
                   if r.get("class") == "trim")
        assert band == int(group.get("data-trim"))
        arena["trim"] += band
    return out


@pytest.mark.cores
@pytest.mark.parametrize("g,name", CASES)
def test_the_maps_count_the_walks_chunks_and_what_trim_gives_back(mapped, g, name):
    """Per arena, the strips hold as many chunks of each state as the walk counted (fenceposts aside), one
    strip per heap, and the trim band marks exactly the bytes of the trim estimate: the pages madvise would
    give back inside free runs and the end of the main arena's top."""
    root, doc, _, _ = mapped(g, name)
    got = _per_arena(root)
    for arena in doc["arenas"]:
        mine = dict(got[arena["number"]])
        assert mine.pop("strips") == len(arena["heaps"]), arena["number"]
        assert mine.pop("trim") == arena["trim"]["madvise"] + arena["trim"]["systrim"], arena["number"]
        want = {k: n for k, n in arena["accounting"]["chunks"].items() if n and k != "fencepost"}
        assert mine == want, arena["number"]


@pytest.mark.cores
@pytest.mark.parametrize("g,name", CASES)
def test_the_report_page_stands_alone_and_says_what_the_json_says(mapped, g, name):
    """'heapwalk report --html': one file that fetches nothing (no script, no link, no image or style from
    elsewhere), whose verdict is the JSON's, and whose maps hold each arena's chunks as the walk counted them."""
    _, doc, out, page = mapped(g, name)
    text = page.read_text()
    assert not re.search(r"<script|<link|<img|<iframe|\bsrc=|url\(|@import", text)
    assert set(re.findall(r"https?://[^\"' <]+", text)) <= {"http://www.w3.org/2000/svg"}
    for sentence in doc["report"]["verdict"]:
        assert html.escape(sentence, quote=True) in text
    got = chunks_per_arena(heap_groups(text))
    for arena in doc["arenas"]:
        want = {k: n for k, n in arena["accounting"]["chunks"].items() if n and k != "fencepost"}
        assert got[arena["number"]] == want, arena["number"]
    assert f"the report as a page: {page}" in out


def _leaked_bytes(root) -> int:
    return sum(int(r.get("data-bytes")) for r in root.iter("{http://www.w3.org/2000/svg}rect")
               if r.get("data-kind") == "leaked")


@pytest.mark.cores
@pytest.mark.parametrize("g", GLIBCS)
def test_the_maps_mark_the_chunks_the_leak_scan_finds_leaked(g, tmp_path):
    """'heapwalk map --leaks' and the report's page mark as leaked exactly the chunks the leak reproducer
    dropped (its ledger: count and bytes), the rest of the chunks in use as in use; on a reproducer that
    keeps all it allocates, nothing."""
    for name in ("leak", "thread_arenas"):
        c = capture(g, name)
        svg, js, page = tmp_path / f"{name}.svg", tmp_path / f"{name}.json", tmp_path / f"{name}.html"
        result = run_gdb([str(c.exe), str(c.core)], [f"heapwalk map --leaks --svg {svg}",
                                                     f"heapwalk report --json {js} --html {page}"],
                         iex=glibc(g).gdb_settings(False))
        assert result.returncode == 0, result.stderr
        facts = json.loads(c.ledger.read_text())["facts"]
        doc, root = json.loads(js.read_text()), ET.parse(svg).getroot()
        leaked = (facts["leaked_count"], facts["leaked_bytes"]) if name == "leak" else (0, 0)
        assert (doc["report"]["leaks"]["leaked_count"], doc["report"]["leaks"]["leaked_bytes"]) == leaked
        on_map, on_page = _per_arena(root), chunks_per_arena(heap_groups(page.read_text()))
        assert (sum(a.get("leaked", 0) for a in on_map.values()), _leaked_bytes(root)) == leaked
        assert sum(a.get("leaked", 0) for a in on_page.values()) == leaked[0]
        for arena in doc["arenas"]:
            in_use = arena["accounting"]["chunks"]["in_use"]
            for counted in (on_map[arena["number"]], on_page[arena["number"]]):
                assert counted.get("in_use", 0) + counted.get("leaked", 0) == in_use, (name, arena["number"])
        assert ("x leaked (in use, nothing reaches it)" in result.stdout) == (name == "leak")


@pytest.fixture(scope="module")
def je_mapped(tmp_path_factory):
    """je_mapped(suite, name) -> (the SVG's root, gdb's stdout) of 'heapwalk map --svg' on a jemalloc
    reproducer's core, symbols hidden."""
    tmp = tmp_path_factory.mktemp("je-maps")

    @functools.cache
    def compute(suite: str, name: str):
        cap = capture_jemalloc(suite, name)
        svg = tmp / f"{suite}-{name}.svg"
        result = run_gdb([str(cap.exe), str(cap.core)], [f"heapwalk map --svg {svg} --png {svg.with_suffix('.png')}"],
                         iex=[NO_SYMBOLS])
        assert result.returncode == 0 and svg.exists(), result.stdout + result.stderr
        return ET.parse(svg).getroot(), result.stdout
    return compute


def _kinds_per_arena(root, prefix: str) -> dict[int, dict[str, int]]:
    """Arena number -> bytes per kind of the strips whose label starts with PREFIX."""
    out: dict[int, dict[str, int]] = {}
    for group in root.findall("{http://www.w3.org/2000/svg}g"):
        if not group.get("data-label").startswith(prefix):
            continue
        rects = [r for r in group.findall("{http://www.w3.org/2000/svg}rect") if r.get("data-kind")]
        assert sum(int(r.get("data-bytes")) for r in rects) == int(group.get("data-bytes"))
        arena = out.setdefault(int(group.get("data-arena")), {})
        for r in rects:
            arena[r.get("data-kind")] = arena.get(r.get("data-kind"), 0) + int(r.get("data-bytes"))
    return out


@pytest.mark.cores
@pytest.mark.parametrize("suite", JEMALLOCS)
def test_the_maps_of_jemalloc_hold_what_malloc_stats_print_counts(je_mapped, suite):
    """je_dns's extents, from the radix tree with symbols hidden: per arena, the bytes the map draws in use
    are the small and large allocations malloc_stats_print printed; in use, free regions in slabs and the
    padding pages of large ones are its active pages; dirty, muzzy and retained are its counters, to the
    page (the arena the reproducer printed from is left out: printing changed it)."""
    root, out = je_mapped(suite, "je_dns")
    directory = capture_jemalloc(suite, "je_dns").directory
    stats = json.loads((directory / "stats.json").read_text())["jemalloc"]["stats.arenas"]
    ledger = json.loads((directory / "ledger.json").read_text())
    drawn = _kinds_per_arena(root, "jemalloc arena ")
    compared = 0
    for index, printed in stats.items():
        if not index.isdigit() or int(index) == ledger["stats_arena"]:
            continue
        got = drawn.get(int(index), {})
        # what the program holds and the regions the threads' caches hold (drawn apart) are what it allocated
        held = got.get("in_use", 0) + got.get("tcache_regions", 0)
        assert held == printed["small"]["allocated"] + printed["large"]["allocated"], index
        assert held + got.get("slab_free", 0) + got.get("overhead", 0) == printed["pactive"] * 4096
        assert (got.get("dirty", 0), got.get("muzzy", 0)) == (printed["pdirty"] * 4096, printed["pmuzzy"] * 4096)
        assert got.get("retained", 0) == printed["retained"], index
        assert "unwalked" not in got
        compared += 1
    assert compared >= 7 and "jemalloc arena 1 extents 1" in out


@pytest.mark.cores
@pytest.mark.parametrize("suite", JEMALLOCS)
def test_a_process_with_both_allocators_has_both_maps(je_mapped, suite):
    """je_both: glibc's heaps, then jemalloc's extents, each strip's rectangles adding up to its bytes."""
    root, out = je_mapped(suite, "je_both")
    glibc_part, jemalloc_part = _kinds_per_arena(root, "main arena"), _kinds_per_arena(root, "jemalloc arena ")
    assert glibc_part and jemalloc_part and "main arena  0x" in out and "jemalloc arena 0 extents 1" in out
    assert sum(n for arena in jemalloc_part.values() for k, n in arena.items() if k == "in_use") > 0
