"""Heap maps: each heap (`view.HeapStrip`) drawn as a strip, address left to right, each column coloured by
what holds its bytes.  `columns` counts the bytes of every kind in each column exactly (the runs' cumulative
sums, no per-chunk loop); `text_maps` draws a strip of characters per heap (coloured in a terminal, plain
letters in a log); `svg_maps` writes an SVG where each column is a stack of rectangles, one per kind, whose
heights are the kinds' shares and whose `data-bytes` add up to the heap's bytes."""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

import numpy as np
from rich.text import Text

from heapwalk.analysis.report import human
from heapwalk.view import MAP_KINDS, HeapStrip

__all__ = ["columns", "kind_bytes", "text_maps", "svg_maps", "LEGEND", "COLOURS"]

#: each kind's character in a plain strip, and its colour (terminal and SVG)
LEGEND = {"in_use": "#", "tcache": "t", "fast": "f", "unsorted": "u", "small": "s", "large": "l", "top": "T",
          "tcache_struct": "c", "overhead": "h", "unwalked": "!", "unused": ":", "reserved": "."}
COLOURS = {"in_use": "#d62728", "tcache": "#9edae5", "fast": "#17becf", "unsorted": "#bcbd22", "small": "#2ca02c",
           "large": "#98df8a", "top": "#1f77b4", "tcache_struct": "#8c564b", "overhead": "#7f7f7f",
           "unwalked": "#000000", "unused": "#dbdbdb", "reserved": "#f5f5f5"}
NAMES = {"in_use": "in use", "tcache": "tcache", "fast": "fastbin", "unsorted": "unsorted", "small": "small bin",
         "large": "large bin", "top": "top", "tcache_struct": "tcache struct", "overhead": "headers",
         "unwalked": "not walked (damage)", "unused": "mapped, unused", "reserved": "reserved, never mapped"}


def kind_bytes(strip: HeapStrip) -> dict[str, int]:
    """The bytes of each kind in STRIP (kinds with none left out)."""
    sizes = (strip.run_ends - strip.run_starts).astype(np.int64)
    totals = np.bincount(strip.kinds, weights=sizes, minlength=len(MAP_KINDS))
    return {MAP_KINDS[i]: int(totals[i]) for i in np.flatnonzero(totals).tolist()}


def columns(strip: HeapStrip, width: int) -> tuple[np.ndarray, np.ndarray]:
    """STRIP cut into WIDTH columns of (nearly) equal spans: the column edges (WIDTH + 1 addresses) and the
    bytes of each kind in each column (WIDTH x len(MAP_KINDS), int64; each row sums to its span)."""
    span = strip.end - strip.start
    width = max(1, min(width, span))
    edges = np.array([strip.start + span * i // width for i in range(width + 1)], dtype=np.uint64)
    out = np.zeros((width, len(MAP_KINDS)), dtype=np.int64)
    for k in np.unique(strip.kinds).tolist():
        mask = strip.kinds == k
        starts, ends = strip.run_starts[mask], strip.run_ends[mask]
        lengths = (ends - starts).astype(np.int64)
        before = np.concatenate(([0], np.cumsum(lengths)))

        def upto(x: np.ndarray) -> np.ndarray:
            i = np.searchsorted(starts, x, side="right") - 1
            inside = np.clip(x.astype(np.int64) - starts[np.maximum(i, 0)].astype(np.int64), 0,
                             lengths[np.maximum(i, 0)])
            return np.where(i >= 0, before[np.maximum(i, 0)] + inside, 0)
        covered = upto(edges)
        out[:, k] = covered[1:] - covered[:-1]
    return edges, out


def _characters(counts: np.ndarray, colour: bool) -> tuple[Text, bool]:
    """A character per column: its kind's (the kind holding most of its bytes; bytes the walk could not pass,
    however few, take the column: damage is never hidden), or, for a column mostly free that holds chunks
    in use too (they pin the free memory around them), the free kind's colour with a lighter block in
    colour, '+' in plain text; and whether any column is so marked."""
    in_use, unwalked = MAP_KINDS.index("in_use"), MAP_KINDS.index("unwalked")
    out = Text()
    any_pinned = False
    for row in counts:
        name = MAP_KINDS[unwalked if row[unwalked] else int(row.argmax())]
        pinned = name not in ("in_use", "unwalked") and row[in_use] > 0
        any_pinned |= bool(pinned)
        if colour:
            out.append("\u2593" if pinned else "\u2588", style=COLOURS[name])
        else:
            out.append(PINNED if pinned else LEGEND[name])
    return out, any_pinned


#: a plain strip's character for a column mostly free with chunks in use in it
PINNED = "+"


def text_maps(strips: Sequence[HeapStrip], width: int, colour: bool) -> Text:
    """A line per heap: its label and span, then WIDTH characters (`_characters`), then a legend of the
    kinds drawn with their bytes."""
    text = Text()
    seen: dict[str, int] = {}
    any_pinned = False
    for strip in strips:
        _, counts = columns(strip, width)
        characters, pinned = _characters(counts, colour)
        any_pinned |= pinned
        text.append(f"{strip.label}  {strip.start:#x}-{strip.end:#x}  {human(strip.end - strip.start)}"
                    + (f" (and {human(strip.beyond)} reserved, never mapped)" if strip.beyond else "") + "\n")
        text.append_text(characters)
        text.append("\n")
        for name, n in kind_bytes(strip).items():
            seen[name] = seen.get(name, 0) + n
    text.append("\n")
    for name in MAP_KINDS:
        if name in seen:
            mark = Text("\u2588", style=COLOURS[name]) if colour else Text(LEGEND[name])
            text.append_text(mark)
            text.append(f" {NAMES[name]} {human(seen[name])}   ")
    if any_pinned:
        text.append(("\u2593" if colour else PINNED) + " mostly free, with chunks in use")
    text.append("\n")
    return text


_ROW, _GAP, _LEFT = 28, 34, 8


def _stacks(counts: np.ndarray) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """The columns as (first column, how many, [(kind, bytes)]): neighbouring columns that hold one kind
    only, the same, drawn as one rectangle."""
    out: list[tuple[int, int, list[tuple[int, int]]]] = []
    for col in range(len(counts)):
        stack = [(k, int(counts[col, k])) for k in np.flatnonzero(counts[col]).tolist()]
        if (len(stack) == 1 and out and len(out[-1][2]) == 1 and out[-1][2][0][0] == stack[0][0]
                and out[-1][0] + out[-1][1] == col):
            first, n, ((k, total),) = out[-1]
            out[-1] = (first, n + 1, [(k, total + stack[0][1])])
        else:
            out.append((col, 1, stack))
    return out


def svg_maps(strips: Sequence[HeapStrip], width: int = 1024, title: str = "heap map") -> str:
    """An SVG of STRIPS, one row each, WIDTH columns wide: each column a stack of rectangles (one per kind
    it holds, heights by share) carrying data-kind and data-bytes; each row a group carrying its strip's
    address span and bytes; then a legend."""
    rows = []
    y = 20
    for strip in strips:
        edges, counts = columns(strip, width)
        span = strip.end - strip.start
        parts = [f'<g class="heap" data-arena="{strip.arena}" data-label="{escape(strip.label)}" '
                 f'data-start="{strip.start}" data-end="{strip.end}" data-bytes="{span}">',
                 f'<text x="{_LEFT}" y="{y - 4}" font-size="11">{escape(strip.label)} '
                 f'{strip.start:#x}-{strip.end:#x} ({human(span)}'
                 + (f'; and {human(strip.beyond)} reserved, never mapped' if strip.beyond else '') + ')</text>']
        for col, col_width, stack in _stacks(counts):
            top = float(y)
            total = sum(n for _, n in stack)
            for k, n in stack:
                height = _ROW * n / total
                parts.append(f'<rect x="{_LEFT + col}" y="{top:.3f}" width="{col_width}" height="{height:.3f}" '
                             f'fill="{COLOURS[MAP_KINDS[k]]}" data-kind="{MAP_KINDS[k]}" data-bytes="{n}"/>')
                top += height
        parts.append("</g>")
        rows.append("\n".join(parts))
        y += _ROW + _GAP
    legend = []
    x = _LEFT
    for name in MAP_KINDS:
        legend.append(f'<rect x="{x}" y="{y - 10}" width="10" height="10" fill="{COLOURS[name]}" stroke="#999" '
                      f'stroke-width="0.5"/><text x="{x + 14}" y="{y - 1}" font-size="11">{NAMES[name]}</text>')
        x += 14 + 7 * len(NAMES[name]) + 16
    full = max(width + 2 * _LEFT, x)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{full}" height="{y + 10}" '
            f'viewBox="0 0 {full} {y + 10}" font-family="sans-serif">\n<title>{escape(title)}</title>\n'
            + "\n".join(rows) + "\n" + "\n".join(legend) + "\n</svg>\n")
