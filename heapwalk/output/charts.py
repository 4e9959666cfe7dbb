"""Charts as inline SVG for heapwalk's HTML pages: horizontal bars (a histogram, what trim keeps) and stacked
horizontal bars (where each arena's bytes are).  Every bar is a rectangle carrying its value in data-bytes, so
a page's numbers can be read back from its pictures; the SVGs scale to the width they are given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape as _escape

from heapwalk.analysis.report import human

__all__ = ["bar_chart", "stacked_chart", "escape"]


def escape(text: str) -> str:
    """TEXT with &, < and > escaped, for an SVG's text (xml.sax's escape pulls in urllib: slow to import)."""
    return _escape(text, quote=False)

_WIDTH, _NOTE, _ROW = 720, 150, 20


def _label_width(labels) -> int:
    """Room for the longest of LABELS at 12 px (about 7 px a character), within a third of the chart."""
    return min(_WIDTH // 3, 12 + 7 * max((len(label) for label in labels), default=0))


def _note_width(notes) -> int:
    """Room after the longest bar for the longest of NOTES (about 7 px a character), at least `_NOTE`, at
    most half the chart: a note past the chart's edge would be cut."""
    return min(_WIDTH // 2, max(_NOTE, 10 + 7 * max((len(note) for note in notes), default=0)))


def _svg(height: int, title: str, body: list[str]) -> str:
    return (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_WIDTH} {height}" '
            f'width="{_WIDTH}" height="{height}" role="img" font-family="sans-serif" font-size="12">'
            f'<title>{escape(title)}</title>' + "".join(body) + "</svg>")


def bar_chart(rows: Sequence[tuple[str, int, str]], title: str, colour: str = "#4c78a8") -> str:
    """One bar per row (LABEL, BYTES, NOTE), lengths by bytes against the largest, the note after each bar."""
    most = max((value for _, value, _ in rows), default=0) or 1
    label_width = _label_width(label for label, _, _ in rows)
    area = _WIDTH - label_width - _note_width(note for _, _, note in rows)
    body = []
    for i, (label, value, note) in enumerate(rows):
        y = 4 + i * _ROW
        length = area * value / most
        body.append(f'<text x="{label_width - 6}" y="{y + 13}" text-anchor="end">{escape(label)}</text>'
                    f'<rect class="bar" x="{label_width}" y="{y + 2}" width="{length:.2f}" height="{_ROW - 5}" '
                    f'fill="{colour}" data-bytes="{value}"><title>{escape(label)}: {escape(note)}</title></rect>'
                    f'<text x="{label_width + length + 5:.2f}" y="{y + 13}" fill="#333">{escape(note)}</text>')
    return _svg(8 + len(rows) * _ROW, title, body)


#: colours of the kinds an allocator names that have none of their own
_SPARE = ("#17becf", "#bcbd22", "#e377c2", "#8c564b", "#9467bd")


def stacked_chart(rows: Sequence[tuple[str, Sequence[tuple[str, int]]]], colours: Mapping[str, str],
                  names: Mapping[str, str], title: str) -> str:
    """One bar per row (LABEL, [(kind, bytes)]), its parts side by side in COLOURS, lengths against the
    biggest row's total, the total after each bar; then a legend of the kinds drawn (NAMES)."""
    most = max((sum(n for _, n in parts) for _, parts in rows), default=0) or 1
    label_width = _label_width(label for label, _ in rows)
    area = _WIDTH - label_width - _NOTE
    body, drawn = [], []
    unnamed = sorted({kind for _, parts in rows for kind, _ in parts} - set(colours))
    colours = {**colours, **{kind: _SPARE[i % len(_SPARE)] for i, kind in enumerate(unnamed)}}
    names = {**{kind: kind.replace("_", " ") for kind in unnamed}, **names}
    for i, (label, parts) in enumerate(rows):
        y = 4 + i * _ROW
        x = float(label_width)
        body.append(f'<text x="{label_width - 6}" y="{y + 13}" text-anchor="end">{escape(label)}</text>')
        for kind, n in parts:
            if n <= 0:
                continue
            length = area * n / most
            body.append(f'<rect x="{x:.2f}" y="{y + 2}" width="{length:.2f}" height="{_ROW - 5}" '
                        f'fill="{colours[kind]}" data-kind="{kind}" data-bytes="{n}">'
                        f'<title>{escape(label)}: {escape(names[kind])} {human(n)}</title></rect>')
            x += length
            if kind not in drawn:
                drawn.append(kind)
        body.append(f'<text x="{x + 5:.2f}" y="{y + 13}" fill="#333">{human(sum(n for _, n in parts))}</text>')
    y = 10 + len(rows) * _ROW
    x = 8
    for kind in drawn:
        size = 20 + 7 * len(names[kind]) + 12
        if x + size > _WIDTH:
            x, y = 8, y + 18
        body.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{colours[kind]}"/>'
                    f'<text x="{x + 16}" y="{y + 10}">{escape(names[kind])}</text>')
        x += size
    return _svg(y + 20, title, body)
