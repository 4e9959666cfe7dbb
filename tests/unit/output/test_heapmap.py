"""Heap maps on values: the columns' bytes, the SVG and the PNG of a strip made by hand (the maps of real cores:
test_heapmap_cores.py)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np
import pytest

from browser import png_pixels
from conftest import rotating
from harness import REPRODUCERS

from heapwalk import registry
from heapwalk.common.mapkinds import MAP_KINDS, MapKind, add_map_kind
from heapwalk.output.heapmaps import BAND_COLOURS, COLOURS, PINNED, columns, kind_bytes, svg_maps, text_maps
from heapwalk.output.pngmaps import png_bytes, png_maps
from heapwalk.common.view import HeapStrip

registry.allocators()        # each allocator adds its kinds of run
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


def test_a_strip_that_damage_put_above_the_canonical_addresses_is_still_cut_into_columns():
    high = HeapStrip(0, "damaged", 0x8200000000001000, 0x8200000000003000,
                     np.array([0x8200000000001000, 0x8200000000002000], dtype=np.uint64),
                     np.array([0x8200000000002000, 0x8200000000003000], dtype=np.uint64),
                     np.array([MAP_KINDS.index("in_use"), MAP_KINDS.index("top")], dtype=np.uint8))
    edges, counts = columns(high, 4)
    assert int(edges[0]) == high.start and int(edges[-1]) == high.end
    assert counts.sum(axis=0)[MAP_KINDS.index("in_use")] == counts.sum(axis=0)[MAP_KINDS.index("top")] == 0x1000


def _columns_by_byte(strip: HeapStrip, width: int) -> np.ndarray:
    """`columns`' counts the slow way: each byte of the strip looked up in its run and its column."""
    span = strip.end - strip.start
    width = max(1, min(width, span))
    out = np.zeros((width, len(MAP_KINDS)), dtype=np.int64)
    for start, end, kind in zip(strip.run_starts.tolist(), strip.run_ends.tolist(), strip.kinds.tolist()):
        for address in range(max(start, strip.start), min(end, strip.end)):
            column = next(c for c in range(width) if address < strip.start + span * (c + 1) // width)
            out[column, kind] += 1
    return out


@pytest.mark.parametrize("seed", range(12))
def test_the_columns_count_every_byte_where_it_lies(seed):
    """Runs of every length, across one edge or many, and runs that begin before the strip or end after it:
    each byte counts once, in its own column, under its own kind."""
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 3, 16, 40, 200, 700], size=int(rng.integers(1, 40)))
    starts = 0x5000 + np.concatenate(([0], np.cumsum(sizes)[:-1]))
    ends = starts + sizes
    kinds = rng.integers(0, len(MAP_KINDS), size=len(sizes)).astype(np.uint8)
    start = int(starts[0] + rng.integers(0, sizes[0]))
    end = max(start + 1, int(ends[-1] - rng.integers(0, sizes[-1])))
    strip = HeapStrip(1, "runs", start, end, starts.astype(np.uint64), ends.astype(np.uint64), kinds)
    for width in (1, 2, 7, 64, 5000):
        assert (columns(strip, width)[1] == _columns_by_byte(strip, width)).all()


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


def _colours(png: bytes) -> tuple[int, int, set[str]]:
    width, height, rows = png_pixels(png)
    return width, height, {"#" + bytes(row[i:i + 3]).hex() for row in rows for i in range(0, len(row), 3)}


def test_the_png_paints_each_kind_in_its_colour():
    trimmed = HeapStrip(**{**STRIP.__dict__, "trimmable": np.array([[0x2000, 0x3000]], dtype=np.uint64)})
    width, height, colours = _colours(png_maps([STRIP, trimmed], 256))
    assert width == 256 + 16 and height > 2 * 60
    assert {COLOURS[k] for k in kind_bytes(STRIP)} <= colours and BAND_COLOURS["trim"] in colours
    assert COLOURS["unwalked"] not in colours and COLOURS["reserved"] not in colours     # no damage, no reservation
    for narrow in (1, 16, 100):        # labels and legend wrapped or cut at the picture's edges
        assert _colours(png_maps([STRIP, trimmed], narrow))[0] == narrow + 16
    assert _colours(png_maps([], 64))[:2] == (80, 16)       # nothing to draw: a blank picture, not an error


def test_the_png_marks_damage_three_pixels_wide():
    """Sixteen bytes the walk could not pass, in one column of 256: a black mark over the whole strip's height
    on that column and on each neighbour, so that it shows at any scale; nowhere else."""
    strip = _strip([(0x1000, 0x1ff0, "in_use"), (0x1ff0, 0x2000, "unwalked"), (0x2000, 0x3000, "top")])
    _, _, rows = png_pixels(png_maps([strip], 256))
    black = [{i // 3 for i in range(0, len(row), 3) if bytes(row[i:i + 3]) == bytes(3)} for row in rows]
    column = 8 + (0x1ff0 - 0x1000) * 256 // 0x2000
    marked = [row for row in black if row == {column - 1, column, column + 1}]
    assert len(marked) == 28, black


def test_a_png_holds_its_image_exactly():
    """Rows written as their difference from the row above (filter 'Up', a byte's wrap-around included) decode
    to the image painted, pixel for pixel, whatever it holds."""
    rng = np.random.default_rng(7)
    for height, width in ((1, 1), (3, 5), (40, 33)):
        img = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        img[height // 2:] = img[height // 2]            # repeated rows, as a strip's
        w, h, rows = png_pixels(png_bytes(img))
        assert (w, h) == (width, height)
        assert np.array_equal(np.frombuffer(b"".join(bytes(r) for r in rows), dtype=np.uint8).reshape(img.shape), img)



def test_a_png_painted_a_strip_at_a_time_is_the_picture_painted_whole():
    """png_maps paints and compresses each strip apart (its rows filtered against the last row of the one
    before): the pixels are those of the whole picture painted at once, labels, bands, damage and legend."""
    from heapwalk.output import pngmaps
    trimmed = HeapStrip(**{**STRIP.__dict__, "trimmable": np.array([[0x2000, 0x3000]], dtype=np.uint64)})
    damaged = _strip([(0x1000, 0x1ff0, "in_use"), (0x1ff0, 0x2000, "unwalked"), (0x2000, 0x3000, "top")])
    strips = [STRIP, trimmed, damaged, STRIP]
    for width in (1, 64, 300):
        w, h, rows = png_pixels(png_maps(strips, width))
        entries = [(pngmaps.NAMES[k], COLOURS[k]) for k in pngmaps.kinds_drawn(strips)]
        entries.append((pngmaps.bands(strips), BAND_COLOURS["trim"]))
        places = pngmaps._legend_places(entries, width)
        whole = np.full((h, w, 3), 255, dtype=np.uint8)
        for i, strip in enumerate(strips):
            pngmaps._paint_strip(whole, strip, width, 8 + i * pngmaps._STRIP)
        pngmaps._legend(whole, 8 + len(strips) * pngmaps._STRIP, entries, places)
        assert h == 8 + len(strips) * pngmaps._STRIP + (1 + places[-1][1]) * (pngmaps._TEXT + 8) + 8
        assert np.array_equal(np.frombuffer(b"".join(bytes(r) for r in rows), dtype=np.uint8).reshape(h, w, 3), whole)

#: each reproducer under the system glibc and one other in turn (conftest's fixed subset)
CASES = [pytest.param(g, n, id=f"{g}-{n}") for i, n in enumerate(REPRODUCERS) for g in rotating(i)]


def test_a_kind_an_allocator_adds_is_drawn_in_its_colour_everywhere():
    """mapkinds.add_map_kind: a new allocator's kind of run goes after the others (no index moves) and every
    drawing shows it in its colour, under its name, with its character in a plain strip."""
    before = list(MAP_KINDS)
    index = add_map_kind(MapKind("test_pool", "pooled (test)", "#123456", "p"))
    assert MAP_KINDS[:len(before)] == before and MAP_KINDS[index] == "test_pool"
    strip = HeapStrip(1, "pool", 0x1000, 0x3000, np.array([0x1000, 0x2000], np.uint64),
                      np.array([0x2000, 0x3000], np.uint64), np.array([K["in_use"], index], np.uint8))
    svg = svg_maps([strip], 64)
    assert 'data-kind="test_pool"' in svg and 'fill="#123456"' in svg and "pooled (test)" in svg
    assert "p" * 10 in text_maps([strip], 40, False).plain
    _, _, rows = png_pixels(png_maps([strip], 64))
    assert any(bytes.fromhex("123456") in row for row in rows)
