"""'heapwalk diff --html': what grew between two snapshots as one self-contained page, built from the diff's
JSON (`jsondoc.diff_json`): the totals, each arena before and after (chart and table), then arena by arena the
size classes of free chunks and of chunks in use that changed, and the signatures whose chunks in use changed."""

from __future__ import annotations

from typing import Any

from heapwalk.analysis.report import human
from heapwalk.output.charts import bar_chart, stacked_chart
from heapwalk.output.heapmaps import COLOURS
from heapwalk.output.htmlpage import cards, e, page, section, table

__all__ = ["diff_html"]

_NAMES = {"system": "system memory", "rss": "resident (RSS)", "in_use": "in use", "free": "free chunks",
          "top": "top"}
#: the colours of the parts of an arena's memory: in use as on the heap maps, free in green, top in blue
_PARTS = {"in_use": COLOURS["in_use"], "free": "#2ca02c", "top": "#1f77b4"}


def _signed(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "\u00b1") + human(abs(n))


def diff_html(d: dict[str, Any], a: str, b: str, made_by: str = "") -> str:
    """The page of the diff D (its JSON document) from snapshot A to snapshot B (how each is named)."""
    body = [f"<header><h1>heapwalk diff</h1><dl class=\"facts\"><dt>A</dt><dd class=\"mono\">{e(a)}</dd>"
            f"<dt>B</dt><dd class=\"mono\">{e(b)}</dd></dl></header>", _summary(d), _arenas(d)]
    body += [_classes(entry) for entry in d["arenas"]]
    body.append(_signatures(d))
    if made_by:
        body.append(f"<footer>{e(made_by)}</footer>")
    return page(f"heapwalk diff: {a} -> {b}", "\n".join(part for part in body if part))


def _summary(d: dict[str, Any]) -> str:
    growth = d["growth"]
    figures = [(f"{_NAMES.get(k, k)}", _signed(n)) for k, n in growth.items()]
    rss = d.get("process_rss")
    if rss:
        figures.append(("process RSS", f"{human(rss[0])} \u2192 {human(rss[1])}"))
    grew = d.get("grew") or []
    counts = d.get("arena_counts")
    if counts:
        figures.append(("arenas", f"{counts[0]} → {counts[1]}"))
    words = ("<p>Two processes (no arena at the same address: a restart between the snapshots): arenas are "
             "matched by their number, the main arena to the main arena.</p>" if d.get("restarted") else "")
    words += (f"<p>Grew (system memory or bytes in use): arena {', '.join(map(str, grew))}.</p>" if grew
              else "<p>No arena grew.</p>")
    if "rss" not in growth:
        words += ("<p class=\"muted\">Resident memory is not compared: a snapshot does not say which pages were in "
                  "RAM (take both with 'heapwalk capture').</p>")
    return section("summary", "What grew", words, cards(figures))


def _arenas(d: dict[str, Any]) -> str:
    rows = []
    for entry in d["arenas"]:
        for side, i in (("A", 0), ("B", 1)):
            rows.append((f"arena {entry['number']} {side}", [(k, entry[k][i]) for k in _PARTS]))
    chart = stacked_chart(rows, _PARTS, _NAMES, "each arena in A and in B")
    if d["arenas"] and "rss" in d["arenas"][0]:
        chart += stacked_chart([(f"arena {x['number']} {side}", [("rss", x["rss"][i])]) for x in d["arenas"]
                                for side, i in (("A", 0), ("B", 1))], {"rss": "#555555"}, _NAMES,
                               "each arena's resident memory in A and in B")
    figures = [k for k in ("system", "rss", "in_use", "free", "top") if d["arenas"] and k in d["arenas"][0]]
    head = ["arena", "address", "status"] + [f"{_NAMES[k]} A \u2192 B" for k in figures]
    body = [[str(x["number"]), f"<code>{x['address']:#x}</code>", e(x["status"])]
            + [f"{human(x[k][0])} \u2192 {human(x[k][1])} ({_signed(x[k + '_growth'])})" for k in figures]
            for x in d["arenas"]]
    return section("arenas", "Each arena, A and B", chart, table(head, body, (0, 1, 2)))


def _classes(entry: dict[str, Any]) -> str:
    """One arena's size classes whose free chunks or chunks in use changed, the ones that grew charted."""
    parts = []
    for what, key in (("free chunks", "free_classes"), ("chunks in use", "in_use_classes")):
        classes = entry.get(key) or []
        if not classes:
            continue
        grown = sorted((c for c in classes if c["bytes_growth"] > 0), key=lambda c: -c["bytes_growth"])
        if grown:
            parts.append(bar_chart([(f"{human(c['low'])} - {human(c['high'])}", c["bytes_growth"],
                                     f"{_signed(c['bytes_growth'])} ({c['count'][0]} \u2192 {c['count'][1]})")
                                    for c in grown], f"arena {entry['number']}: {what} that grew",
                                   _PARTS["in_use" if key == "in_use_classes" else "free"]))
        parts.append(f"<p>{what.capitalize()} by size class:</p>")
        parts.append(table(["size", "chunks A \u2192 B", "bytes A \u2192 B", "growth"],
                           [(f"{human(c['low'])} - {human(c['high'])}", f"{c['count'][0]} \u2192 {c['count'][1]}",
                             f"{human(c['bytes'][0])} \u2192 {human(c['bytes'][1])}", _signed(c["bytes_growth"]))
                            for c in classes]))
    if not parts:
        return ""
    return section(f"arena-{entry['number']}", f"Arena {entry['number']}: size classes that changed", *parts)


def _signatures(d: dict[str, Any]) -> str:
    changes = d.get("signatures") or []
    if not changes:
        return ""
    grown = [c for c in changes if c["bytes_growth"] > 0][:20]
    chart = bar_chart([(c["signature"][:28], c["bytes_growth"], f"{_signed(c['bytes_growth'])} ({c['count'][0]} "
                        f"\u2192 {c['count'][1]})") for c in grown], "signatures whose chunks in use grew",
                      _PARTS["in_use"]) if grown else ""
    rows = [(e(c["signature"]), f"{c['count'][0]} \u2192 {c['count'][1]}",
             f"{human(c['bytes'][0])} \u2192 {human(c['bytes'][1])}", _signed(c["bytes_growth"])) for c in changes[:40]]
    return section("signatures", "Chunks in use by signature", chart,
                   table(["signature", "chunks A \u2192 B", "bytes A \u2192 B", "growth"], rows))
