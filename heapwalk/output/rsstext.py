"""The process's RSS by owner (`heapwalk.analysis.rss`) as the report shows it: a table, a sentence that
says how much of it the allocators explain and what holds the rest, and the JSON object."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from heapwalk.analysis.report import human
from heapwalk.analysis.rss import KINDS, RssBreakdown
from heapwalk.output.consoles import box_for

__all__ = ["rss_table", "rss_sentence", "rss_verdict", "rss_document", "rss_change_lines", "FILES_SHOWN"]

#: the files and anonymous mappings shown by name, the biggest first; the others are summed in one row
FILES_SHOWN = 6
#: below this share of RSS, the allocators are said to explain little of it
_LITTLE = 0.25


def rss_table(rss: RssBreakdown, interactive: bool) -> Table:
    """The owners, heaps first: what each holds of the RSS and its share; the files and anonymous mappings
    beyond the biggest few summed in a row."""
    table = Table(title=f"{_where(rss.measure)} ({rss.measure}: {rss.source})", box=box_for(interactive),
                  title_justify="left", show_footer=True)
    table.add_column("owner", footer=_whole(rss.measure))
    table.add_column("what", footer="")
    table.add_column(rss.measure, justify="right", footer=human(rss.total))
    table.add_column("share", justify="right", footer="100%")
    table.add_column("mapped", justify="right", footer="")
    for kind, name, size, mapped, count in _rows(rss):
        what = name if count == 1 else f"{name} ({count})"
        table.add_row(kind, Text(what), human(size), f"{100 * rss.share(size):.0f}%", human(mapped))
    return table


def _where(measure: str) -> str:
    """The table's title: the RSS, or what a core holds when it does not say what was resident."""
    return "where the RSS is" if measure == "resident" else "what the core holds, by owner"


def _whole(measure: str) -> str:
    return "RSS" if measure == "resident" else "all"


#: the kinds whose owners beyond the biggest few are summed in one row, and what that row calls them
_SUMMED = {"file code": "files", "file data": "files", "anonymous": "anonymous mappings"}


def _rows(rss: RssBreakdown) -> list[tuple[str, str, int, int, int]]:
    out, many = [], {}
    for r in rss.rows:
        if r.kind in _SUMMED:
            many.setdefault(r.kind, []).append(r)
            continue
        out.append((r.kind, r.name, r.bytes, r.mapped, r.count))
    for kind, noun in _SUMMED.items():
        rows = sorted(many.get(kind, []), key=lambda r: (-r.bytes, -r.mapped))
        out += [(kind, r.name, r.bytes, r.mapped, r.count) for r in rows[:FILES_SHOWN]]
        rest = rows[FILES_SHOWN:]
        if rest:
            out.append((kind, f"{len(rest)} other {noun}", sum(r.bytes for r in rest), sum(r.mapped for r in rest),
                        sum(r.count for r in rest)))
    out.sort(key=lambda r: KINDS.index(r[0]) if r[0] in KINDS else len(KINDS))
    return out


def rss_sentence(rss: RssBreakdown) -> str:
    """How much of the RSS the allocators' heaps hold and, when that is little, what holds the most of the
    rest, with the figures of the table."""
    heaps = rss.of_kind("heap")
    share = f"{100 * rss.share(heaps):.0f}%"
    text = (f"The allocators' heaps hold {human(heaps)} of the process's {human(rss.total)} {rss.measure} ({share})."
            if rss.measure == "resident" else f"The allocators' heaps hold {human(heaps)} ({share}) of the "
            f"{human(rss.total)} the core holds (a plain core does not say what was resident).")
    if rss.measure == "resident" and rss.total and rss.share(heaps) < _LITTLE:
        others = sorted(((rss.of_kind(k), k) for k in KINDS if k != "heap"), reverse=True)
        named = [f"{k}, {human(b)} ({100 * rss.share(b):.0f}%)" for b, k in others[:2] if b]
        text += (" Most of it is elsewhere, so the allocators' remedies cannot give much back: "
                 + " and ".join(named) + ".")
    return text


def rss_verdict(rss: RssBreakdown | None) -> list[str]:
    """The verdict's first sentence when the allocators' heaps hold little of the RSS (none otherwise, or when
    the RSS is not known): the verdicts after it are about a small part of the process."""
    if rss is None or rss.measure != "resident" or not rss.total or rss.share(rss.of_kind("heap")) >= _LITTLE:
        return []
    return [rss_sentence(rss)]


def rss_document(rss: RssBreakdown) -> dict[str, Any]:
    """The JSON object of the breakdown: what was measured, from where, the total and every row."""
    return {"measure": rss.measure, "source": rss.source, "total": rss.total,
            "rows": [{"kind": r.kind, "name": r.name, "bytes": r.bytes, "mapped": r.mapped, "count": r.count}
                     for r in rss.rows]}


def rss_change_lines(change: list[tuple[str, int, int]] | None) -> list[str]:
    """The lines 'heapwalk diff' prints of two snapshots' RSS by owner (`analysis.rss.rss_change`): each kind,
    before and after, and what grew outside the allocators' heaps said first when that is most of the growth."""
    if change is None:
        return ["RSS by owner: not compared (a snapshot does not say which pages were in RAM: take both with "
                "'heapwalk capture')"]
    lines = ["RSS by owner:"] + [f"  {kind:<10} {human(x):>10} -> {human(y):>10} ({'+' if y >= x else '-'}"
                                 f"{human(abs(y - x))})" for kind, x, y in change]
    grown = {kind: y - x for kind, x, y in change if kind != "total"}
    total = sum(v for v in grown.values() if v > 0)
    outside = sum(v for k, v in grown.items() if v > 0 and k != "heap")
    grew = next((y - x for kind, x, y in change if kind == "total"), total)
    if grew >= 1 << 20 and total and outside > total / 2:       # the process grew by a MiB or more
        lines.append(f"  most of the growth, {human(outside)} of {human(total)}, is outside the allocators' heaps")
    return lines
