"""Heap maps: the columns' bytes on values, and on every reproducer of every glibc (symbols hidden) an SVG that
parses, whose rectangles add up to each heap's bytes, and whose bytes of each kind are the report's."""

from __future__ import annotations

import functools
import json
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from conftest import GLIBCS, capture, glibc, run_gdb
from harness import REPRODUCERS

from heapwalk.output.heapmaps import PINNED, columns, kind_bytes, svg_maps, text_maps
from heapwalk.view import MAP_KINDS, HeapStrip

K = {name: i for i, name in enumerate(MAP_KINDS)}


def _strip(runs: list[tuple[int, int, str]], beyond: int = 0) -> HeapStrip:
    return HeapStrip(1, "arena 1 heap 1", runs[0][0], runs[-1][1], np.array([r[0] for r in runs], dtype=np.uint64),
                     np.array([r[1] for r in runs], dtype=np.uint64),
                     np.array([K[r[2]] for r in runs], dtype=np.uint8), beyond=beyond)


STRIP = _strip([(0x1000, 0x1010, "overhead"), (0x1010, 0x1100, "in_use"), (0x1100, 0x1800, "large"),
                (0x1800, 0x1830, "in_use"), (0x1830, 0x3000, "small"), (0x3000, 0x4000, "top"),
                (0x4000, 0x6000, "unused")], beyond=0x1000)


@pytest.mark.parametrize("width", [1, 3, 7, 100, 0x5000])
def test_every_column_holds_its_span_and_the_kinds_add_up(width):
    edges, counts = columns(STRIP, width)
    assert len(edges) == len(counts) + 1 and int(edges[0]) == 0x1000 and int(edges[-1]) == 0x6000
    assert (counts.sum(axis=1) == np.diff(edges.astype(np.int64))).all()
    totals = counts.sum(axis=0)
    assert {MAP_KINDS[i]: int(totals[i]) for i in np.flatnonzero(totals)} == kind_bytes(STRIP) == {
        "in_use": 0x120, "large": 0x700, "small": 0x17d0, "top": 0x1000, "overhead": 0x10, "unused": 0x2000}


def test_the_plain_strip_marks_free_columns_that_hold_chunks_in_use():
    text = text_maps([STRIP], 5, False).plain
    lines = text.splitlines()
    assert lines[0] == "arena 1 heap 1  0x1000-0x6000  20 KiB (and 4 KiB reserved, never mapped)"
    # 4 KiB columns: headers+in use+large+in use+small (mostly small: pinned), small, top, unused, unused
    assert lines[1] == f"{PINNED}sT::"
    assert "# in use 288 B" in text and f"{PINNED} mostly free, with chunks in use" in text


def test_damage_takes_its_column_however_small():
    strip = _strip([(0x1000, 0x1ff0, "in_use"), (0x1ff0, 0x2000, "unwalked"), (0x2000, 0x3000, "top")])
    text = text_maps([strip], 2, False).plain
    assert text.splitlines()[1] == "!T" and "! not walked (damage) 16 B" in text
    assert PINNED not in text.splitlines()[1] and "mostly free" not in text


def test_the_svg_parses_and_its_rectangles_add_up():
    svg = ET.fromstring(svg_maps([STRIP, STRIP], 64))
    groups = svg.findall("{http://www.w3.org/2000/svg}g")
    assert len(groups) == 2
    for g in groups:
        rects = g.findall("{http://www.w3.org/2000/svg}rect")
        assert sum(int(r.get("data-bytes")) for r in rects) == int(g.get("data-bytes")) == 0x5000
        by_kind: dict[str, int] = {}
        for r in rects:
            by_kind[r.get("data-kind")] = by_kind.get(r.get("data-kind"), 0) + int(r.get("data-bytes"))
        assert by_kind == kind_bytes(STRIP)
    assert len(groups[0]) < 64 * 3    # columns of one kind side by side are one rectangle


CASES = [pytest.param(g, n, id=f"{g}-{n}") for g in GLIBCS for n in REPRODUCERS]


@pytest.fixture(scope="module")
def mapped(tmp_path_factory):
    """mapped(glibc, name) -> (the SVG's root, the report's JSON, gdb's stdout) of 'heapwalk map' and
    'heapwalk report --no-leaks' on the core, symbols hidden."""
    tmp = tmp_path_factory.mktemp("maps")

    @functools.cache
    def compute(g: str, name: str):
        c = capture(g, name)
        svg, js = tmp / f"{g}-{name}.svg", tmp / f"{g}-{name}.json"
        result = run_gdb([str(c.exe), str(c.core)], [f"heapwalk map --svg {svg}",
                                                     f"heapwalk report --no-leaks --json {js}"],
                         iex=glibc(g).gdb_settings(False))
        assert result.returncode == 0 and svg.exists(), result.stderr
        return ET.parse(svg).getroot(), json.loads(js.read_text()), result.stdout
    return compute


@pytest.mark.cores
@pytest.mark.parametrize("g,name", CASES)
def test_the_maps_hold_every_byte_the_report_counts(mapped, g, name):
    """Each heap's rectangles add up to its bytes; per arena, the map's bytes of each kind are the report's:
    in use (the tcache structs with it), each kind of free chunk, top, headers, and all but the mapped tail
    add up to system_mem."""
    root, doc, out = mapped(g, name)
    kinds: dict[int, dict[str, int]] = {}
    for group in root.findall("{http://www.w3.org/2000/svg}g"):
        rects = group.findall("{http://www.w3.org/2000/svg}rect")
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
