"""The frame of heapwalk's HTML pages: one self-contained file (its style inline, no script, nothing fetched),
readable in a narrow window (wide tables scroll inside their box, pictures shrink) and printable; and the small
pieces the pages are made of (tables, figures, key figures)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from html import escape

__all__ = ["page", "section", "table", "cards", "swatch", "e", "made_by"]

STYLE = """
:root { color-scheme: light; }
body { font: 14px/1.45 "DejaVu Sans", system-ui, sans-serif; color: #1d1d1d; background: #fff; margin: 0; }
main { max-width: 1800px; margin: 0 auto; padding: 12px 16px 40px; }
header h1 { font-size: 1.45em; margin: 0.3em 0 0.1em; }
header .target { font-family: "DejaVu Sans Mono", monospace; word-break: break-all; }
h2 { font-size: 1.15em; margin: 1.6em 0 0.5em; padding-bottom: 0.2em; border-bottom: 1px solid #ccc; }
p { margin: 0.4em 0; max-width: 80ch; }
.muted { color: #666; }
code, .mono { font-family: "DejaVu Sans Mono", monospace; font-size: 0.92em; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: 0.4em 0; }
th, td { padding: 3px 7px; border-bottom: 1px solid #e6e6e6; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; font-weight: 600; white-space: normal; vertical-align: bottom; }
th.l, td.l { text-align: left; }
th.wrap, td.wrap { white-space: normal; min-width: 20ch; text-align: left; overflow-wrap: anywhere; }
tfoot td { font-weight: 600; border-top: 1px solid #bbb; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0.5em 0; }
dl.facts dt { color: #555; }
dl.facts dd { margin: 0; word-break: break-word; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: 8px; margin: 0.6em 0; }
.card { border: 1px solid #d8d8d8; border-radius: 6px; padding: 6px 10px; }
.card b { display: block; font-size: 1.25em; }
.verdict { border-left: 4px solid #1f77b4; background: #f2f6fb; padding: 6px 12px; }
.verdict p:first-child { font-weight: 600; }
.warn { border-left: 4px solid #e6a700; background: #fdf8ea; padding: 4px 12px; }
svg.chart { max-width: 100%; height: auto; display: block; }
figure.heap { margin: 0.7em 0; }
figure.heap figcaption { font-size: 0.92em; }
svg.strip { width: 100%; height: 42px; display: block; border: 1px solid #ccc; box-sizing: border-box; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; font-size: 0.92em; margin: 0.5em 0; }
.swatch { display: inline-block; width: 0.95em; height: 0.95em; vertical-align: -0.12em; margin-right: 0.35em;
          border: 1px solid #888; }
.sev-error { color: #b00000; font-weight: 600; }
.sev-warning { color: #9a5b00; font-weight: 600; }
.sev-info { color: #555; }
footer { margin-top: 2.5em; color: #666; font-size: 0.9em; overflow-wrap: anywhere; }
@media (max-width: 600px) {
  body { font-size: 13px; }
  main { padding: 8px; }
  dl.facts { grid-template-columns: 1fr; }
  dl.facts dd { margin-bottom: 4px; }
}
@media print {
  body { font-size: 10.5px; }
  main { max-width: none; padding: 0; }
  h2 { break-after: avoid; }
  section, figure.heap, table { break-inside: avoid; }
  .scroll { overflow: visible; }
  th, td { white-space: normal; padding: 2px 5px; }
  .verdict, .warn, th { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  svg { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
}
"""


def e(value) -> str:
    """VALUE as HTML text."""
    return escape(str(value), quote=True)


def page(title: str, body: str) -> str:
    """A whole HTML document: TITLE, the inline style, BODY in a main element."""
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{e(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<main>\n{body}\n</main>\n"
            "</body>\n</html>\n")


def section(ident: str, title: str, *parts: str) -> str:
    """A titled section of a page (empty parts left out)."""
    return f'<section id="{e(ident)}">\n<h2>{e(title)}</h2>\n' + "\n".join(p for p in parts if p) + "\n</section>\n"


def table(head: Sequence[str], rows: Iterable[Sequence], left: Iterable[int] = (0,), foot: Sequence | None = None,
          wrap: Iterable[int] = (), ident: str = "") -> str:
    """A table in a box that scrolls sideways when the window is narrow: HEAD's columns, ROWS of cells
    (already text or markup: a cell is written as it is), the columns in LEFT aligned left, those in WRAP
    allowed to wrap, a FOOT row of totals."""
    left, wrap = set(left), set(wrap)

    def cls(i: int) -> str:
        return ' class="wrap"' if i in wrap else ' class="l"' if i in left else ""
    out = [f'<div class="scroll"><table{f" id={chr(34)}{e(ident)}{chr(34)}" if ident else ""}><thead><tr>']
    out += [f"<th{cls(i)}>{e(h)}</th>" for i, h in enumerate(head)]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>" + "".join(f"<td{cls(i)}>{cell}</td>" for i, cell in enumerate(row)) + "</tr>")
    out.append("</tbody>")
    if foot is not None:
        out.append("<tfoot><tr>" + "".join(f"<td{cls(i)}>{cell}</td>" for i, cell in enumerate(foot)) + "</tr></tfoot>")
    out.append("</table></div>")
    return "".join(out)


def cards(figures: Iterable[tuple[str, str]]) -> str:
    """Key figures, each a small box: (what, value)."""
    return '<div class="cards">' + "".join(f'<div class="card"><span class="muted">{e(what)}</span><b>{e(value)}</b></div>'
                                           for what, value in figures) + "</div>"


def swatch(colour: str) -> str:
    """A small square of COLOUR, as a legend's key."""
    return f'<span class="swatch" style="background:{e(colour)}"></span>'


def made_by(command: str, source: str = "") -> str:
    """A page's footer line: heapwalk's version, the COMMAND that made it, when, and from what (SOURCE)."""
    from importlib import metadata   # slow to import: only a page needs it
    try:
        version = metadata.version("heapwalk")
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return f"Made by heapwalk {version} ('{command}') on {when}" + (f", from {source}." if source else ".")
