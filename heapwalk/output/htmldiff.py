"""'heapwalk diff --html': what grew between two snapshots as one self-contained page, built from the diff's
JSON (`jsondoc.diff_json`), in the allocator's words (the document's "words"): the totals, each arena before and
after (chart and table: each figure's A, B and change in columns of their own), then arena by arena the size
classes of free pieces and of blocks in use that changed, the signatures whose blocks in use changed, and the
process's RSS by owner.  Snapshots of two allocators (`jsondoc.across_json`) get their totals side by side,
each in its own words, and no arena table."""

from __future__ import annotations

from typing import Any

from heapwalk.analysis.report import human
from heapwalk.output.charts import bar_chart, stacked_chart
from heapwalk.output.difftext import figure_name
from heapwalk.output.heapmaps import COLOURS
from heapwalk.output.htmlpage import cards, e, page, section, table

__all__ = ["diff_html"]

_NAMES = {"system": "system memory", "rss": "resident (RSS)", "in_use": "in use", "free": "free chunks",
          "top": "top"}
#: the colours of the parts of an arena's memory: in use as on the heap maps, free in green, top in blue
_PARTS = {"in_use": COLOURS["in_use"], "free": "#2ca02c", "top": "#1f77b4"}


#: a growth of the process's RSS worth a sentence
_SIGNIFICANT = 1 << 20


def _signed(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "\u00b1") + human(abs(n))


def _names(d: dict[str, Any]) -> dict[str, str]:
    """What the page calls each figure, in the words of the diff's allocator."""
    words = d.get("words") or {}
    pieces = words.get("pieces", "chunks")
    return {**_NAMES, "system": "system memory" if words.get("system", "system") == "system"
            else words["system"], "free": f"free {pieces}"}


def diff_html(d: dict[str, Any], a: str, b: str, made_by: str = "") -> str:
    """The page of the diff D (its JSON document) from snapshot A to snapshot B (how each is named)."""
    body = [f"<header><h1>heapwalk diff</h1><dl class=\"facts\"><dt>A</dt><dd class=\"mono\">{e(a)}</dd>"
            f"<dt>B</dt><dd class=\"mono\">{e(b)}</dd></dl></header>"]
    if d.get("across") and not d["arenas"]:
        body += [_across(d["across"])]
    else:
        body += [_summary(d), _arenas(d)]
        body += [_classes(entry, d) for entry in d["arenas"] if entry["status"] != "unmatched"]
        body.append(_signatures(d))
    body.append(_owners(d))
    if made_by:
        body.append(f"<footer>{e(made_by)}</footer>")
    return page(f"heapwalk diff: {a} -> {b}", "\n".join(part for part in body if part))


def _summary(d: dict[str, Any]) -> str:
    growth = d["growth"]
    names = _names(d)
    row = (d.get("words") or {}).get("arenas", "arenas").rstrip("s")
    figures = [(f"{names.get(k, k)}", _signed(n)) for k, n in growth.items() if k != "top" or _has_top(d)]
    rss = d.get("process_rss")
    if rss:
        figures.append(("process RSS", f"{human(rss[0])} \u2192 {human(rss[1])}"))
    grew = d.get("grew") or []
    counts = d.get("arena_counts")
    if counts:
        figures.append((f"{row}s", f"{counts[0]} → {counts[1]}"))
    unmatched = d.get("unmatched") or [0, 0]
    words = (f"<p>Two processes (no {row} at the same address: a restart between the snapshots): {row}s are "
             f"matched by the names of the threads that use them, or by a kind one {row} of each has (the main "
             f"arena).</p>" if d.get("restarted") else "")
    if any(unmatched):
        u = d.get("unmatched_growth") or {}
        words += (f"<p>{unmatched[0]} {row}s of A and {unmatched[1]} of B are not matched (no thread names tie "
                  f"them: threads unnamed, or sharing names); together their {names['system']} changed by "
                  f"{_signed(u.get('system', 0))} and their bytes in use by {_signed(u.get('in_use', 0))}.</p>")
    by_number = {x["number"]: x for x in d["arenas"] if x["status"] != "unmatched"}
    grown = [f"{row} {n} ({', '.join(_grown(by_number[n]))})" for n in grew if n in by_number]
    words += (f"<p>Grew: {'; '.join(grown)}.</p>" if grown else f"<p>No {'matched ' if any(unmatched) else ''}"
              f"{row} grew.</p>")
    if "rss" not in growth:
        words += ("<p class=\"muted\">Resident memory is not compared: a snapshot does not say which pages were in "
                  "RAM (take both with 'heapwalk capture').</p>")
    return section("summary", "What grew", words, cards(figures))


def _has_top(d: dict[str, Any]) -> bool:
    return bool((d.get("words") or {}).get("top", True))


def _grown(x: dict[str, Any]) -> list[str]:
    """What made an arena count as grown: its system memory and bytes in use, as far as each grew."""
    return [f"{what} {_signed(x[k + '_growth'])}" for k, what in (("system", "system"), ("in_use", "in use"))
            if x[k + "_growth"] > 0]


def _arenas(d: dict[str, Any]) -> str:
    names = _names(d)
    row = (d.get("words") or {}).get("arenas", "arenas").rstrip("s")
    parts = {k: v for k, v in _PARTS.items() if k != "top" or _has_top(d)}
    rows = []
    for entry in d["arenas"]:
        for side, i in (("A", 0), ("B", 1)):
            rows.append((f"{row} {entry['number']} {side}", [(k, entry[k][i]) for k in parts]))
    chart = stacked_chart(rows, parts, names, f"each {row} in A and in B")
    if d["arenas"] and "rss" in d["arenas"][0]:
        chart += stacked_chart([(f"{row} {x['number']} {side}", [("rss", x["rss"][i])]) for x in d["arenas"]
                                for side, i in (("A", 0), ("B", 1))], {"rss": "#555555"}, names,
                               f"each {row}'s resident memory in A and in B")
    figures = [k for k in ("system", "rss", "in_use", "free", "top") if d["arenas"] and k in d["arenas"][0]
               and (k != "top" or _has_top(d))]
    head = [row, "address", "status", ""] + [names[k] for k in figures]
    body = []
    for x in d["arenas"]:
        status = x["status"] + (f" ({x['only']})" if x.get("only") else "")
        body.append([str(x["number"]), f"<code>{x['address']:#x}</code>", e(status), "A"]
                    + [human(x[k][0]) for k in figures])
        body.append(["", "", "", "B"] + [human(x[k][1]) for k in figures])
        body.append(["", "", "", "change"] + [f"<b>{_signed(x[k + '_growth'])}</b>" for k in figures])
    return section("arenas", f"Each {row}, A and B", chart, table(head, body, (0, 1, 2, 3), ident="diff-arenas"))


def _classes(entry: dict[str, Any], d: dict[str, Any]) -> str:
    """One arena's size classes whose free pieces or blocks in use changed, the ones that grew charted."""
    parts = []
    words = d.get("words") or {}
    pieces, row = words.get("counted", "blocks"), words.get("arenas", "arenas").rstrip("s")
    for what, key in ((f"free {pieces}", "free_classes"), (f"{pieces} in use", "in_use_classes")):
        classes = entry.get(key) or []
        if not classes:
            continue
        grown = sorted((c for c in classes if c["bytes_growth"] > 0), key=lambda c: -c["bytes_growth"])
        if grown:
            parts.append(bar_chart([(f"{human(c['low'])} - {human(c['high'])}", c["bytes_growth"],
                                     f"{_signed(c['bytes_growth'])} ({c['count'][0]} \u2192 {c['count'][1]})")
                                    for c in grown], f"{row} {entry['number']}: {what} that grew",
                                   _PARTS["in_use" if key == "in_use_classes" else "free"]))
        parts.append(f"<p>{what.capitalize()} by size class:</p>")
        parts.append(table(["size", f"{pieces} A \u2192 B", "bytes A \u2192 B", "growth"],
                           [(f"{human(c['low'])} - {human(c['high'])}", f"{c['count'][0]} \u2192 {c['count'][1]}",
                             f"{human(c['bytes'][0])} \u2192 {human(c['bytes'][1])}", _signed(c["bytes_growth"]))
                            for c in classes]))
    if not parts:
        return ""
    return section(f"arena-{entry['number']}", f"{row.capitalize()} {entry['number']}: size classes that changed",
                   *parts)


def _signatures(d: dict[str, Any]) -> str:
    """The signatures whose blocks in use changed, in the allocator's word for them; the ones that grew charted."""
    changes = d.get("signatures") or []
    if not changes:
        return ""
    counted = (d.get("words") or {}).get("counted", "blocks")
    grown = [c for c in changes if c["bytes_growth"] > 0][:20]
    chart = bar_chart([(c["signature"][:28], c["bytes_growth"], f"{_signed(c['bytes_growth'])} ({c['count'][0]} "
                        f"\u2192 {c['count'][1]})") for c in grown], f"signatures whose {counted} in use grew",
                      _PARTS["in_use"]) if grown else ""
    rows = [(e(c["signature"]), f"{c['count'][0]} \u2192 {c['count'][1]}",
             f"{human(c['bytes'][0])} \u2192 {human(c['bytes'][1])}", _signed(c["bytes_growth"])) for c in changes[:40]]
    return section("signatures", f"{counted.capitalize()} in use by signature", chart,
                   table(["signature", f"{counted} A \u2192 B", "bytes A \u2192 B", "growth"], rows))


def _across(x: dict[str, Any]) -> str:
    """Two allocators' totals side by side, each row in each one's words (`jsondoc.across_json`)."""
    titles, words = x["titles"], x["words"]

    def cell(figure: str, v) -> str:
        return "\u2013" if v is None else str(v) if figure == "arenas" else human(v)

    rows = []
    for r in x["rows"]:
        a, b = r["a"], r["b"]
        change = ("" if a is None or b is None else f"{b - a:+d}" if r["figure"] == "arenas" else _signed(b - a))
        label = figure_name(r["figure"], words, (" (A)", " (B)"), "resident (RSS)")
        rows.append((e(label), cell(r["figure"], a), cell(r["figure"], b), change))
    sentence = (f"<p>Two allocators: A is {e(titles[0])}, B is {e(titles[1])} (a restart on another allocator). "
                f"Each side is shown in its own figures; no arena is matched across allocators, and a row only one "
                f"allocator has is left empty on the other side.</p>")
    if not x.get("rss_known"):
        sentence += ("<p class=\"muted\">Resident memory is not compared: a snapshot does not say which pages were "
                     "in RAM (take both with 'heapwalk capture').</p>")
    total = {r["figure"]: (r["a"], r["b"]) for r in x["rows"]}
    figures = [(f"{titles[0]} \u2192 {titles[1]}", f"{human(total['system'][0])} \u2192 {human(total['system'][1])}")]
    if "rss" in total:
        figures.append(("resident (RSS)", f"{human(total['rss'][0])} \u2192 {human(total['rss'][1])}"))
    return section("summary", "Two allocators, side by side", sentence, cards(figures),
                   table(["figure", f"A: {titles[0]}", f"B: {titles[1]}", "change"], rows))


def _owners(d: dict[str, Any]) -> str:
    """The process's RSS by owner in A and in B, with its change; or why it is not compared."""
    owners = d.get("rss_by_owner")
    if not owners:
        return section("owners", "Resident memory by owner", "<p class=\"muted\">Not compared: a snapshot does not "
                       "say which pages were in RAM (take both with 'heapwalk capture').</p>")
    grown = [(o["kind"], o["after"] - o["before"]) for o in owners if o["kind"] != "total"]
    up = sum(v for _, v in grown if v > 0)
    outside = sum(v for k, v in grown if v > 0 and k != "heap")
    total = next((o["after"] - o["before"] for o in owners if o["kind"] == "total"), 0)
    sentence = (f"<p>Most of the growth, {human(outside)} of {human(up)}, is outside the allocators' heaps.</p>"
                if total >= _SIGNIFICANT and up and outside > up / 2 else "")
    rows = [(e(o["kind"]), human(o["before"]), human(o["after"]), _signed(o["after"] - o["before"]))
            for o in owners]
    return section("owners", "Resident memory by owner", sentence,
                   table(["owner", "A", "B", "change"], rows))
