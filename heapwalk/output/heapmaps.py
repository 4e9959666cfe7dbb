"""Heap maps: each heap (`view.HeapStrip`) drawn as a strip, address left to right, each column coloured by
what holds its bytes.  `columns` counts the bytes of every kind in each column exactly (the runs' cumulative
sums, no per-chunk loop); `text_maps` draws a strip of characters per heap (coloured in a terminal, plain
letters in a log); `svg_maps` writes an SVG where each column is a stack of rectangles, one per kind, whose
heights are the kinds' shares and whose `data-bytes` add up to the heap's bytes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from html import escape as _escape

import numpy as np
from rich.text import Text

from heapwalk.analysis.report import human
from heapwalk.output.charts import escape
from heapwalk.common.mapkinds import (DAMAGE, KINDS, MAP_KINDS, USED, drawing_order, in_drawing_order, of_use,
                               piece_kinds)
from heapwalk.common.view import HeapStrip

__all__ = ["resident_trim_bytes", "columns", "coverage", "marks", "kind_bytes", "piece_counts", "trim_bytes",
           "text_maps", "svg_maps", "svg_map_parts", "svg_strip", "kinds_drawn", "bands", "LEGEND", "COLOURS", "NAMES",
           "STRIP_HEIGHT", "BAND_COLOURS"]



class _Field(Mapping):
    """One field of every kind of run (`mapkinds.KINDS`), by the kind's name."""

    def __init__(self, field: str):
        self.field = field

    def __getitem__(self, name: str) -> str:
        return getattr(KINDS[name], self.field)

    def __iter__(self) -> Iterator[str]:
        return iter(list(KINDS))

    def __len__(self) -> int:
        return len(KINDS)


#: each kind's character in a plain strip, its colour (terminal and SVG) and its words in legends
LEGEND, COLOURS, NAMES = _Field("char"), _Field("colour"), _Field("label")
def kind_bytes(strip: HeapStrip) -> dict[str, int]:
    """The bytes of each kind in STRIP (kinds with none left out)."""
    sizes = (strip.run_ends - strip.run_starts).astype(np.int64)
    totals = np.bincount(strip.kinds, weights=sizes, minlength=len(MAP_KINDS))
    return {MAP_KINDS[i]: int(totals[i]) for i in np.flatnonzero(totals).tolist()}


def coverage(starts: np.ndarray, ends: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bytes of the sorted, disjoint runs [STARTS[i], ENDS[i]) inside each column between neighbouring EDGES
    (int64, one fewer than EDGES)."""
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    at = np.asarray(edges, dtype=np.uint64).astype(np.int64)
    if not len(starts):
        return np.zeros(len(at) - 1, dtype=np.int64)
    lengths = ends - starts
    before = np.concatenate(([0], np.cumsum(lengths)))
    i = np.searchsorted(starts, at, side="right") - 1
    j = np.maximum(i, 0)
    upto = np.where(i >= 0, before[j] + np.clip(at - starts[j], 0, lengths[j]), 0)
    return upto[1:] - upto[:-1]


def columns(strip: HeapStrip, width: int) -> tuple[np.ndarray, np.ndarray]:
    """STRIP cut into WIDTH columns of (nearly) equal spans: the column edges (WIDTH + 1 addresses) and the
    bytes of each kind in each column (WIDTH x len(MAP_KINDS), int64; each row sums to its span).  Each run
    counts whole in the column it starts in (its column from where the edges fall among the sorted runs,
    not a search per run); then a run across an edge moves what lies past the edge to the next column, which
    adds up to whole spans for the columns a long run crosses."""
    span = strip.end - strip.start
    width = max(1, min(width, span))
    small = span < 1 << 52 and strip.end < 1 << 62       # (damage may put a strip anywhere in 64 bits)
    at = (strip.start + span * np.arange(width + 1, dtype=np.int64) // width if small else
          np.array([strip.start + span * i // width for i in range(width + 1)], dtype=np.uint64).view(np.int64))
    n_kinds = len(MAP_KINDS)
    starts, ends = _signed(strip.run_starts), _signed(strip.run_ends)
    lo, hi = np.searchsorted(ends, at[0], side="right"), np.searchsorted(starts, at[-1], side="left")
    starts, ends, kinds = starts[lo:hi], ends[lo:hi], strip.kinds[lo:hi]
    lengths = ends - starts
    if len(lengths):
        lengths[0] -= max(0, at[0] - starts[0])
        lengths[-1] -= max(0, ends[-1] - at[-1])
    column = np.cumsum(np.bincount(np.searchsorted(starts, at[1:-1], side="left"), minlength=len(starts) + 1))
    out = np.bincount(column[:len(starts)] * n_kinds + kinds, weights=lengths,
                      minlength=width * n_kinds).astype(np.int64).reshape(width, n_kinds)
    inner = at[1:-1]
    holder = np.searchsorted(starts, inner, side="left") - 1
    held = holder >= 0
    past = np.where(held, np.minimum(ends[np.maximum(holder, 0)], at[-1]) - inner, 0)
    cross = np.flatnonzero(held & (past > 0))
    kind = kinds[holder[cross]]
    np.add.at(out, (cross, kind), -past[cross])
    np.add.at(out, (cross + 1, kind), past[cross])
    return at.astype(np.uint64), out


def _signed(addresses: np.ndarray) -> np.ndarray:
    """ADDRESSES (user-space, below 2**63) as int64, without a copy where they are uint64 already."""
    addresses = np.asarray(addresses)
    return addresses.view(np.int64) if addresses.dtype == np.uint64 else addresses.astype(np.int64)


def marks(strip: HeapStrip, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Per column between EDGES: the bytes the allocator gives back (glibc: malloc_trim(0)), and the resident
    bytes (None when the target cannot say)."""
    trim = _pairs(strip.trimmable)
    resident = None if strip.resident is None else _pairs(strip.resident)
    return (coverage(trim[:, 0], trim[:, 1], edges),
            None if resident is None else coverage(resident[:, 0], resident[:, 1], edges))


def _pairs(ranges) -> np.ndarray:
    return np.zeros((0, 2), dtype=np.uint64) if ranges is None else np.asarray(ranges, dtype=np.uint64).reshape(-1, 2)


def trim_bytes(strip: HeapStrip) -> int:
    """Bytes of STRIP that its allocator would give back (glibc: malloc_trim(0))."""
    pairs = _pairs(strip.trimmable).astype(np.int64)
    return int((pairs[:, 1] - pairs[:, 0]).sum())


def resident_trim_bytes(strip: HeapStrip) -> int | None:
    """Bytes of STRIP its allocator would give back that are in RAM (None when the target cannot say)."""
    if strip.resident is None:
        return None
    give, ram = _pairs(strip.trimmable).astype(np.int64), _pairs(strip.resident).astype(np.int64)
    if not len(give) or not len(ram):
        return 0
    before = np.concatenate(([0], np.cumsum(ram[:, 1] - ram[:, 0])))     # resident bytes below each run

    def below(x: np.ndarray) -> np.ndarray:
        i = np.searchsorted(ram[:, 0], x, side="right") - 1
        inside = np.clip(x - ram[np.maximum(i, 0), 0], 0, (ram[:, 1] - ram[:, 0])[np.maximum(i, 0)])
        return np.where(i >= 0, before[np.maximum(i, 0)] + inside, 0)
    return int((below(give[:, 1]) - below(give[:, 0])).sum())


def bands(strips: Sequence[HeapStrip]) -> str:
    """What the bands under STRIPS that have one show, in their allocators' words ("" when none has)."""
    return " / ".join(dict.fromkeys(s.band for s in strips if s.trimmable is not None))


def kinds_drawn(strips: Sequence[HeapStrip]) -> list[str]:
    """The kinds any of STRIPS holds, in drawing order."""
    present = sum((np.bincount(s.kinds, minlength=len(MAP_KINDS)) for s in strips), np.zeros(len(MAP_KINDS), int))
    return in_drawing_order(name for name, n in zip(MAP_KINDS, present.tolist()) if n)


def piece_counts(strip: HeapStrip) -> dict[str, int]:
    """How many pieces (chunks, extents) of each kind STRIP holds, a run each (kinds with none left out)."""
    present = np.bincount(strip.kinds, minlength=len(MAP_KINDS))
    return {name: int(present[MAP_KINDS.index(name)]) for name in piece_kinds() if present[MAP_KINDS.index(name)]}


def _characters(counts: np.ndarray, colour: bool) -> tuple[Text, bool]:
    """A character per column: its kind's (the kind holding most of its bytes; bytes the walk could not pass,
    however few, take the column: damage is never hidden), or, for a column mostly free that holds chunks
    in use too (they pin the free memory around them), the free kind's colour with a lighter block in
    colour, '+' in plain text; and whether any column is so marked."""
    used, damage, order = of_use(USED), of_use(DAMAGE), drawing_order()
    out = Text()
    any_pinned = False
    for row in counts:
        damaged = [k for k in damage if row[k]]
        name = MAP_KINDS[damaged[0] if damaged else int(order[int(row[order].argmax())])]
        pinned = KINDS[name].use not in (USED, DAMAGE) and row[used].sum() > 0
        any_pinned |= bool(pinned)
        if colour:
            out.append("\u2593" if pinned else "\u2588", style=COLOURS[name])
        else:
            out.append(PINNED if pinned else LEGEND[name])
    return out, any_pinned


#: a plain strip's character for a column mostly free with chunks in use in it
PINNED = "+"


#: a plain row under a strip: trim gives back part of the column / most of it
TRIM_MARKS = ("~", "=")
#: a plain row under a strip: some of the column resident / most / all
RESIDENT_MARKS = (".", ":", "|")


def _trim_row(trim: np.ndarray, spans: np.ndarray, colour: bool) -> Text:
    """A character per column: blank where trim gives nothing back, else part or most of the column."""
    out = Text()
    for n, span in zip(trim.tolist(), spans.tolist()):
        mark = " " if not n else TRIM_MARKS[2 * n >= span]
        out.append(mark, style=_TRIM_COLOUR if colour and n else "")
    return out


def _resident_row(resident: np.ndarray, spans: np.ndarray, colour: bool) -> Text:
    """A character per column: blank where none of it is resident, else some, most or all of it."""
    out = Text()
    for n, span in zip(resident.tolist(), spans.tolist()):
        mark = " " if not n else RESIDENT_MARKS[2 if n == span else 1 if 2 * n >= span else 0]
        out.append(mark, style=_RESIDENT_COLOUR if colour and n else "")
    return out


def text_maps(strips: Sequence[HeapStrip], width: int, colour: bool) -> Text:
    """A line per heap: its label and span, then WIDTH characters (`_characters`), then under it a row for
    what trim would give back (when it gives back any) and one for its resident pages (when known); then a
    legend of the kinds drawn with their bytes."""
    text = Text()
    seen: dict[str, int] = {}
    any_pinned = False
    any_trim = any(trim_bytes(s) for s in strips)      # every strip gets the rows any strip needs
    any_resident = any(s.resident is not None for s in strips)
    trimmed = resident_total = 0
    for strip in strips:
        edges, counts = columns(strip, width)
        characters, pinned = _characters(counts, colour)
        any_pinned |= pinned
        text.append(f"{strip.label}  {strip.start:#x}-{strip.end:#x}  {human(strip.end - strip.start)}"
                    + (f" (and {human(strip.beyond)} reserved, never mapped)" if strip.beyond else "") + "\n")
        text.append_text(characters)
        text.append("\n")
        trim, resident = marks(strip, edges)
        spans = np.diff(edges.astype(np.int64))
        if any_trim:
            trimmed += int(trim.sum())
            text.append_text(_trim_row(trim, spans, colour))
            text.append("\n")
        if any_resident:
            resident = np.zeros(len(spans), dtype=np.int64) if resident is None else resident
            resident_total += int(resident.sum())
            text.append_text(_resident_row(resident, spans, colour))
            text.append("\n")
        for name, n in kind_bytes(strip).items():
            seen[name] = seen.get(name, 0) + n
    text.append("\n")
    for name in in_drawing_order(seen):
        text.append_text(Text("\u2588", style=COLOURS[name]) if colour else Text(LEGEND[name]))
        text.append(f" {NAMES[name]} {human(seen[name])}   ")
    if any_pinned:
        text.append(("\u2593" if colour else PINNED) + " mostly free, with chunks in use")
    text.append("\n")
    rows = []
    if any_trim:
        rows.append(f"{' '.join(TRIM_MARKS)} {bands([s for s in strips if trim_bytes(s)])} part, most of the "
                    f"column ({human(trimmed)} of address space in all)")
    if any_resident:
        rows.append(f"{' '.join(RESIDENT_MARKS)} some, most, all of the column resident "
                    f"({human(resident_total)} in all)")
    if rows:
        text.append("under each strip: " + "; then ".join(rows) + "\n")
    return text


_TRIM_COLOUR, _RESIDENT_COLOUR = "#ff7f0e", "#555555"
#: the bands under a strip: what the allocator gives back, resident pages
BAND_COLOURS = {"trim": _TRIM_COLOUR, "resident": _RESIDENT_COLOUR}
_ROW, _GAP, _LEFT = 28, 34, 8


def _stacks(counts: np.ndarray, y: int) -> tuple[list, ...]:
    """The columns' rectangles as lists (first column, columns, kind, bytes, top, height), from row Y down,
    COUNTS' kinds in drawing order (KIND is a place in that order):
    a column holding several kinds, a rectangle per kind, stacked in that order with heights by share;
    neighbouring columns that hold one kind only, the same, one rectangle of the whole height."""
    present = counts > 0
    alone = present.sum(axis=1) == 1
    kind = present.argmax(axis=1)
    joined = np.zeros(len(counts), dtype=bool)
    joined[1:] = alone[1:] & alone[:-1] & (kind[1:] == kind[:-1])
    first = np.flatnonzero(~joined)
    cols = np.diff(np.append(first, len(counts)))
    single = alone[first]
    one = first[single]
    mixed = first[~single]
    totals = counts.sum(axis=1)
    heights = np.where(present[mixed], _ROW * counts[mixed] / np.maximum(totals[mixed], 1)[:, None], 0.0)
    tops = np.cumsum(np.concatenate((np.full((len(mixed), 1), float(y)), heights[:, :-1]), axis=1), axis=1)
    at, k = np.nonzero(present[mixed])
    x = np.concatenate((one, mixed[at]))
    order = np.lexsort((np.concatenate((kind[one], k)), x))
    parts = (x, np.concatenate((cols[single], np.ones(len(at), dtype=np.int64))), np.concatenate((kind[one], k)),
             np.concatenate((np.add.reduceat(totals, first)[single] if len(first) else first, counts[mixed][at, k])),
             np.concatenate((np.full(len(one), float(y)), tops[at, k])),
             np.concatenate((np.full(len(one), float(_ROW)), heights[at, k])))
    return tuple(part[order].tolist() for part in parts)


def _band(values: np.ndarray, spans: np.ndarray) -> list[tuple[int, int, int, float]]:
    """The columns with bytes in VALUES as (first column, how many, bytes, share of their span): neighbouring
    columns that are full, one rectangle."""
    out: list[tuple[int, int, int, float]] = []
    for col in np.flatnonzero(values).tolist():
        n, share = int(values[col]), float(values[col] / spans[col])
        if out and share == 1.0 and out[-1][3] == 1.0 and out[-1][0] + out[-1][1] == col:
            first, cols, total, _ = out[-1]
            out[-1] = (first, cols + 1, total + n, 1.0)
        else:
            out.append((col, 1, n, share))
    return out


def _band_rects(values: np.ndarray | None, spans: np.ndarray, y: int, kind: str, fill: str, left: int) -> list[str]:
    """A thin band of rectangles under a strip, one per `_band` entry, darker where more of a column counts."""
    if values is None:
        return []
    return [f'<rect class="{kind}" x="{left + col}" y="{y}" width="{cols}" height="{_BAND}" fill="{fill}" '
            f'fill-opacity="{0.3 + 0.7 * share:.2f}" data-bytes="{n}"/>' for col, cols, n, share in _band(values, spans)]


def _svg_strip(strip: HeapStrip, width: int, y: int, left: int = _LEFT, label: bool = True) -> str:
    """One strip's group: its label (when LABEL), a stack of rectangles per column from x = LEFT, and the trim
    and resident bands."""
    edges, counts = columns(strip, width)
    span = strip.end - strip.start
    chunks = " ".join(f"{k}={n}" for k, n in piece_counts(strip).items())
    parts = [f'<g class="heap" data-arena="{strip.arena}" data-label="{_escape(strip.label)}" '
             f'data-start="{strip.start}" data-end="{strip.end}" data-bytes="{span}" data-chunks="{chunks}" '
             f'data-trim="{trim_bytes(strip)}">']
    if label:
        parts.append(f'<text x="{left}" y="{y - 4}" font-size="11">{escape(strip.label)} '
                     f'{strip.start:#x}-{strip.end:#x} ({human(span)}'
                     + (f'; and {human(strip.beyond)} reserved, never mapped' if strip.beyond else '') + ')</text>')
    order = drawing_order().tolist()
    tails = _rect_tails(tuple(order))
    parts += [f'<rect x="{left + col}" y="{top:.3f}" width="{cols}" height="{height:.3f}{tails[k]}{n}"/>'
              for col, cols, k, n, top, height in zip(*_stacks(counts[:, order], y))]
    parts += _damage_marks(counts[:, of_use(DAMAGE)].sum(axis=1), y, left)
    trim, resident = marks(strip, edges)
    spans = np.diff(edges.astype(np.int64))
    parts += _band_rects(trim, spans, y + _ROW + 2, "trim", _TRIM_COLOUR, left)
    parts += _band_rects(resident, spans, y + _ROW + 3 + _BAND, "resident", _RESIDENT_COLOUR, left)
    parts.append("</g>")
    return "\n".join(parts)


@lru_cache(maxsize=4)
def _rect_tails(order: tuple[int, ...]) -> tuple[str, ...]:
    """What a column's rectangle of each kind (a place in ORDER) says between its height and its bytes: its
    colour and kind, made once, not once a rectangle."""
    return tuple(f'" fill="{COLOURS[MAP_KINDS[kind]]}" data-kind="{MAP_KINDS[kind]}" data-bytes="' for kind in order)


def _damage_marks(unwalked: np.ndarray, y: int, left: int) -> list[str]:
    """A mark over each column holding bytes the walk could not pass, however few: the whole column's height
    and at least three columns wide, so that damage shows at any scale."""
    return [f'<rect class="damage" x="{left + col - 1}" y="{y}" width="3" height="{_ROW}" '
            f'fill="{COLOURS["unwalked"]}" data-bytes="{int(unwalked[col])}"/>' for col in np.flatnonzero(unwalked).tolist()]


_BAND = 5
#: a strip's height in an SVG of its own: the strip and its two bands
STRIP_HEIGHT = _ROW + 3 + 2 * _BAND + 1


def svg_strip(strip: HeapStrip, width: int = 1024) -> str:
    """STRIP as an SVG of its own with no label (a page writes it beside), its group as in `svg_maps`;
    stretched to any width, its height kept."""
    return (f'<svg class="strip" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {STRIP_HEIGHT}" '
            f'width="{width}" height="{STRIP_HEIGHT}" preserveAspectRatio="none" role="img">'
            f'<title>{escape(strip.label)}</title>' + _svg_strip(strip, width, 0, 0, False) + "</svg>")


def svg_maps(strips: Sequence[HeapStrip], width: int = 1024, title: str = "heap map") -> str:
    """An SVG of STRIPS, one row each, WIDTH columns wide: each column a stack of rectangles (one per kind
    it holds, heights by share) carrying data-kind and data-bytes; under it a band for what its allocator
    gives back (glibc: malloc_trim(0)) and one for the resident pages (when known), class "trim" and
    "resident", with data-bytes;
    each row a group carrying its strip's address span, bytes, chunks per kind and trimmable bytes; then a
    legend of what is drawn."""
    return "".join(svg_map_parts(strips, width, title))


def svg_map_parts(strips: Sequence[HeapStrip], width: int = 1024, title: str = "heap map") -> Iterator[str]:
    """`svg_maps`' text a strip's group at a time, for a file written as it is made (a heap of many strips
    draws tens of megabytes)."""
    y = 20 + len(strips) * (_ROW + _GAP)
    entries = [(name, COLOURS[name], NAMES[name]) for name in kinds_drawn(strips)]
    if bands(strips):
        entries.append(("trim", _TRIM_COLOUR, bands(strips)))
    if any(s.resident is not None for s in strips):
        entries.append(("resident", _RESIDENT_COLOUR, "resident"))
    legend = []
    x, line = _LEFT, y
    for name, fill, words in entries:
        size = 14 + 7 * len(words) + 16
        if x + size > width + _LEFT and x > _LEFT:
            x, line = _LEFT, line + 16
        legend.append(f'<rect x="{x}" y="{line - 10}" width="10" height="10" fill="{fill}" stroke="#999" '
                      f'stroke-width="0.5"/><text x="{x + 14}" y="{line - 1}" font-size="11">{escape(words)}</text>')
        x += size
    full = width + 2 * _LEFT
    yield (f'<svg xmlns="http://www.w3.org/2000/svg" width="{full}" height="{line + 10}" '
           f'viewBox="0 0 {full} {line + 10}" font-family="sans-serif">\n<title>{escape(title)}</title>\n')
    for i, strip in enumerate(strips):
        yield ("\n" if i else "") + _svg_strip(strip, width, 20 + i * (_ROW + _GAP))
    yield "\n" + "\n".join(legend) + "\n</svg>\n"
