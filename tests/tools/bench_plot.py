"""The plot of how `heapwalk report`'s cost grows (docs/performance-growth.svg, written by `make bench` beside the
growth table it is drawn from): two log-log panels, the command's seconds and gdb's memory above its own against
the chunks or blocks of each core, a line for each kind of core (its sizes joined in order).  Plain SVG, drawn
here: no plotting library is needed."""

from __future__ import annotations

import math
from html import escape

__all__ = ["points_of", "growth_svg"]

#: each kind of core's colour, in the order they are listed
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_W, _H, _PAD = 380, 260, 52


def points_of(rows: list[str]) -> dict[str, list[tuple[float, float, float]]]:
    """The growth table's ROWS (its markdown lines) as each core's (count, seconds, MiB above gdb's own) points,
    by core, in count order."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8:
            continue
        try:
            count = float(cells[2].replace(",", ""))
            seconds = float(cells[4].split()[0])
            above = float(cells[6].split()[0].replace(",", ""))
        except ValueError:
            continue
        out.setdefault(cells[1], []).append((count, seconds, above))
    return {core: sorted(points) for core, points in out.items()}


def _decades(values: list[float]) -> tuple[int, int]:
    low = math.floor(math.log10(min(values)))
    high = math.ceil(math.log10(max(values)))
    return low, max(high, low + 1)


def _panel(x0: int, title: str, unit: str, series: dict[str, list[tuple[float, float]]]) -> list[str]:
    """One log-log panel at X0: SERIES' points (count, value) by core, its axes and decades."""
    xs = [x for points in series.values() for x, _ in points]
    ys = [y for points in series.values() for _, y in points if y > 0]
    if not xs or not ys:
        return []
    (xl, xh), (yl, yh) = _decades(xs), _decades(ys)

    def at(x: float, y: float) -> tuple[float, float]:
        fx = (math.log10(x) - xl) / (xh - xl)
        fy = (math.log10(max(y, 10 ** yl)) - yl) / (yh - yl)
        return x0 + _PAD + fx * (_W - _PAD - 10), _H - _PAD - fy * (_H - _PAD - 30)

    out = [f'<text x="{x0 + _W / 2:.0f}" y="18" text-anchor="middle" font-weight="bold">{escape(title)}</text>']
    left, bottom = at(10 ** xl, 10 ** yl)
    right, top = at(10 ** xh, 10 ** yh)
    out.append(f'<rect x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" height="{bottom - top:.1f}" '
               'fill="none" stroke="#888"/>')
    for d in range(xl, xh + 1):
        x, _ = at(10 ** d, 10 ** yl)
        out.append(f'<text x="{x:.1f}" y="{bottom + 14:.1f}" text-anchor="middle">1e{d}</text>')
    for d in range(yl, yh + 1):
        _, y = at(10 ** xl, 10 ** d)
        out.append(f'<line x1="{left:.1f}" y1="{y:.1f}" x2="{right:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 4:.1f}" y="{y + 4:.1f}" text-anchor="end">{10.0 ** d:g}</text>')
    out.append(f'<text x="{(left + right) / 2:.1f}" y="{bottom + 30:.1f}" text-anchor="middle">chunks or blocks'
               '</text>')
    out.append(f'<text x="{x0 + 12}" y="{(top + bottom) / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 {x0 + 12} {(top + bottom) / 2:.1f})">{escape(unit)}</text>')
    for colour, (core, points) in zip(COLOURS * 2, series.items()):
        xy = [at(x, y) for x, y in points if y > 0]
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="'
                   + " ".join(f"{x:.1f},{y:.1f}" for x, y in xy) + '"/>')
        out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in xy]
    return out


def growth_svg(rows: list[str]) -> str:
    """The plot of the growth table's ROWS: seconds and memory against chunks or blocks, and a legend."""
    points = points_of(rows)
    parts = _panel(0, "heapwalk report: seconds", "seconds", {c: [(n, s) for n, s, _ in p] for c, p in points.items()})
    parts += _panel(_W + 20, "heapwalk report: gdb's memory above its own", "MiB",
                    {c: [(n, m) for n, _, m in p] for c, p in points.items()})
    for i, (colour, core) in enumerate(zip(COLOURS * 2, points)):
        y = _H + 14 + 16 * (i // 3)
        x = 20 + (i % 3) * 250
        parts.append(f'<rect x="{x}" y="{y - 9}" width="12" height="10" fill="{colour}"/>'
                     f'<text x="{x + 18}" y="{y}">{escape(core)}</text>')
    height = _H + 24 + 16 * ((len(points) + 2) // 3)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * _W + 20}" height="{height}" '
            f'font-family="sans-serif" font-size="11">\n<rect width="100%" height="100%" fill="white"/>\n'
            + "\n".join(parts) + "\n</svg>\n")
