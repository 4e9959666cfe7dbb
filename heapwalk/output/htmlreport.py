"""'heapwalk report --html': the report as one self-contained page to attach to a ticket, built from the report's
JSON document (`jsondoc.report_document`, so the page says exactly what --json says) and the heap maps' strips:
the header (process, glibc, how each structure was found), the verdict with its remedies, the key figures,
where each arena's bytes are (chart and table), the heap maps, the free-chunk histogram, the trim what-if, the
memory in use and what the leak scan found, the threads and their arenas, and the findings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


from heapwalk.analysis.report import counted, human
from heapwalk.output.charts import bar_chart, stacked_chart
from heapwalk.common.mapkinds import DAMAGE, FREE, KINDS, USED, in_drawing_order
from heapwalk.output.heapmaps import (BAND_COLOURS, COLOURS, NAMES, bands, kind_bytes, piece_counts, svg_strip,
                                      trim_bytes)
from heapwalk.output.htmlpage import cards, e, page, section, swatch, table
from heapwalk.output.leakdoc import share
from heapwalk.common.view import HeapStrip, Words

__all__ = ["report_html", "plain_sections", "plain_figures", "verdict_section", "arenas_section", "maps_section",
           "plain_caption", "histogram_section", "in_use_section", "findings_section", "chunk_count", "MAPS_DRAWN"]

#: heaps drawn on a page at most (`heapwalk map --svg` draws them all): those with damage first, then those
#: holding the most free bytes
MAPS_DRAWN = 120


def report_html(doc: dict[str, Any], facts: list[tuple[str, str]], sections: Sequence[str], made_by: str = "",
                beside: Sequence[tuple[str, str, Sequence[str]]] = (), both: str = "") -> str:
    """The page of the report document DOC: its header with FACTS (rows of name and HTML, the allocator's),
    then the allocator's SECTIONS; MADE_BY says how it was made (the command, the time), in the footer.  For a
    process with more than one allocator, BESIDE holds each other's (heading, id prefix, sections), drawn
    after the first's, and BOTH says what each holds."""
    body = [_header(doc, facts), rss_section((doc.get("report") or {}).get("rss_by_owner")), *sections]
    if beside:
        body.insert(2, f'<p class="warn">{e(both)}</p>')
    for heading, prefix, parts in beside:
        body.append(f'<div class="beside"><h1>{e(heading)}</h1>')
        body += [part.replace('<section id="', f'<section id="{prefix}-') for part in parts if part]
        body.append("</div>")
    if made_by:
        body.append(f"<footer>{e(made_by)}</footer>")
    return page(f"heapwalk report: {doc.get('target') or 'heap'}", "\n".join(b for b in body if b))


#: the colour of each kind of owner in the RSS bar
RSS_COLOURS = {"heap": "#4c78a8", "stack": "#f58518", "anonymous": "#e45756", "shared": "#72b7b2",
               "file code": "#54a24b", "file data": "#b279a2", "other": "#9d9da0"}
#: the rows of the RSS table shown, the biggest first (the JSON has them all)
RSS_ROWS = 12


def rss_section(rss: dict[str, Any] | None) -> str:
    """The process's RSS by owner (the report's ``rss_by_owner``): one bar of its kinds, and its biggest owners
    in a table; nothing when the report has none."""
    if not isinstance(rss, dict) or not rss.get("total"):
        return ""
    rows = rss.get("rows") or []
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + r["bytes"]
    resident = rss.get("measure", "resident") == "resident"
    chart = stacked_chart([("RSS" if resident else "core", [(k, n) for k, n in kinds.items()])], RSS_COLOURS,
                          {k: k for k in kinds}, f"the process's {'RSS' if resident else 'memory in the core'} by "
                          f"owner: {human(rss['total'])}")
    total = rss["total"]
    shown, rest = rss_rows_shown(rows)
    cells = [(e(r["kind"]), e(r["name"] if r.get("count", 1) == 1 else f"{r['name']} ({r['count']})"),
              human(r["bytes"]), f"{100 * r['bytes'] / total:.0f}%", human(r["mapped"])) for r in shown]
    if rest:
        left = sum(r["bytes"] for r in rest)
        cells.append(("", f"the rest ({counted(len(rest), 'owners')})", human(left), f"{100 * left / total:.0f}%",
                      human(sum(r["mapped"] for r in rest))))
    listed = table(("owner", "what", rss.get("measure") or "resident", "share", "mapped"), cells,
                   left=(0, 1), wrap=(1,), foot=("RSS" if resident else "all", "", human(total), "100%", ""))
    which = (f"every heap and the biggest other owners, the {len(rest)} others in one row" if rest else
             f"all {counted(len(rows), 'owners')}")
    every = "Every resident byte of the process" if resident else "Every byte of the process in the core"
    intro = f"<p>{every}, by owner ({e(rss.get('source') or '')}): {which}.</p>"
    return section("rss", "Where the RSS is" if resident else "What the core holds, by owner", intro, chart, listed)


def rss_rows_shown(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The RSS table's rows, the biggest first: every allocator's heap (however small: the page is about them),
    then the biggest other owners up to RSS_ROWS in all; and the rows left out, which the table sums in one."""
    ordered = sorted(rows, key=lambda r: -r["bytes"])
    heaps = [r for r in ordered if r["kind"] == "heap"]
    others = [r for r in ordered if r["kind"] != "heap"]
    room = max(RSS_ROWS - len(heaps), 0)
    shown = sorted(heaps + others[:room], key=lambda r: -r["bytes"])
    return shown, others[room:]


def plain_sections(doc: dict[str, Any], strips: Sequence[HeapStrip], words: Words, name: str,
                   colours: dict[str, str] | None = None, names: dict[str, str] | None = None) -> list[str]:
    """The sections of an allocator that has none of its own: verdict, arenas (COLOURS and NAMES of its kinds of
    free bytes that the shared ones lack, or name otherwise), maps, histogram, findings."""
    r = doc["report"]
    maps = maps_section(strips, "pieces", "<p>Each heap of each arena, address left to right: each column is a "
                        "stack of what holds its bytes.</p>")
    return [verdict_section(r, plain_figures(r, words), words), arenas_section(doc, r, words, colours, names), maps,
            histogram_section(r, words), in_use_section(r, words), findings_section(doc, name)]


def plain_figures(r: dict[str, Any], words: Words) -> list[tuple[str, str]]:
    """The key figures: what the arenas hold, in use, free, and what the allocator would give back."""
    t = r["totals"]
    return [(words.holds, human(t["system"])), ("in use", human(t["in_use"])), ("free", human(t["free"])),
            (words.gives_back, human(t["trim"]))]


def _header(doc: dict[str, Any], facts: list[tuple[str, str]]) -> str:
    found = doc.get("discovery") or {}
    rows = list(facts)
    residency = doc["report"].get("residency")
    rows.append(("resident pages", e(f"from {residency}") if residency else
                 "not known (a core from 'heapwalk capture' or a live process records them)"))
    facts_html = "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in rows)
    more = "".join(f"<tr><td class=\"l\">{e(name)}</td><td class=\"wrap mono\">{e(_value(f.get('value')))}</td>"
                   f"<td class=\"wrap\">{e(f.get('found_by') or '')}</td></tr>" for name, f in found.items())
    details = (f"<details><summary>how each structure was found ({len(found)})</summary><div class=\"scroll\">"
               f"<table><thead><tr><th class=\"l\">what</th><th class=\"l\">value</th><th class=\"l\">found by</th>"
               f"</tr></thead><tbody>{more}</tbody></table></div></details>") if found else ""
    return (f"<header><h1>heapwalk report</h1><div class=\"target\">{e(doc.get('target') or '')}</div>"
            f"<dl class=\"facts\">{facts_html}</dl>{details}</header>")


def _value(value) -> str:
    """A discovered fact's value as the page shows it: addresses in hex, "not found" for none, an object's
    fields as name=value."""
    if value is None:
        return "not found"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_value(v) if v is not None else 'none'}" for k, v in value.items())
    return f"{value:#x}" if isinstance(value, int) and not isinstance(value, bool) and value > 4096 else str(value)


def verdict_section(r: dict[str, Any], figures: list[tuple[str, str]], words: Words) -> str:
    """The verdict, what is partial, and the key FIGURES, with what is resident, leaked and mapped apart."""
    sentences = r.get("verdict") or []
    verdict = ('<div class="verdict">' + "".join(f"<p>{e(s)}</p>" for s in sentences)
               + "</div>") if sentences else ""
    partial = ("<div class=\"warn\"><p><b>Partial:</b></p>" + "".join(f"<p>{e(s)}</p>" for s in r["partial"])
               + "</div>") if r.get("partial") else ""
    t = r["totals"]
    figures = list(figures)
    if t.get("rss") is not None and r.get("residency"):
        figures.insert(1, ("resident (RSS)", human(t["rss"])))
    leaks = r.get("leaks")
    if leaks:
        figures.append(("leaked (nothing points to it)", human(leaks["leaked_bytes"])))
    mm = r.get("mmapped") or {}
    if mm.get("count"):
        figures.append((f"{words.large} ({mm['count']})", human(mm["bytes"])))
    return section("verdict", "Verdict", verdict, partial, cards(figures))


def arenas_section(doc: dict[str, Any], r: dict[str, Any], words: Words, colours: dict[str, str] | None = None,
                   names: dict[str, str] | None = None) -> str:
    """Where each arena's bytes are: a chart and a table, in the allocator's WORDS; COLOURS and NAMES of its
    kinds of free bytes that the heap maps do not have."""
    rows = r["arenas"]
    kinds = list(dict.fromkeys(k for a in rows for k in a["free"]))
    colours, names = {**COLOURS, **(colours or {})}, {**NAMES, **(names or {})}
    names["overhead"] = words.overhead_page or words.overhead
    top = ["top"] if words.top else []      # an allocator without a top: its column would be 0 B throughout
    chart = stacked_chart([(_row_label(a, words),
                            [("in_use", a["in_use"])] + [(k, a["free"].get(k, 0)) for k in kinds]
                            + [(k, a[k]) for k in top] + [("overhead", a["overhead"])]) for a in rows],
                          colours, names, "where each arena's bytes are")
    rss = bool(r.get("residency"))
    head = ["#", words.arena, "kind", "threads", words.heaps, words.system] \
        + (["RSS"] if rss else []) + ["in use"] + [names.get(k, k) for k in kinds] + top \
        + [names["overhead"], words.gives_back]

    def cells(a: dict[str, Any]) -> list[str]:
        return ([str(a["number"]), f"<code>{a['address']:#x}</code>" if a["address"] else "-", e(a["kind"]),
                 str(a["threads"]), str(a["heaps"]),
                 human(a["system"])] + ([human(a["rss"]) if a.get("rss") is not None else "-"] if rss else [])
                + [human(a["in_use"])] + [human(a["free"].get(k, 0)) for k in kinds]
                + [human(a[k]) for k in top] + [human(a["overhead"]), human(a["trim"])])
    t = r["totals"]
    foot = ["", counted(len(rows), words.arenas), "", "", "", human(t["system"])] + (
        [human(t["rss"] or 0)] if rss else []) + [
        human(t["in_use"])] + [human(sum(a["free"].get(k, 0) for a in rows)) for k in kinds] + [
        human(t[k]) for k in top] + [human(t["overhead"]), human(t["trim"])]
    unbalanced = [a["number"] for a in rows if not a.get("balanced", True)]
    note = (f'<p class="warn">The bytes of arena(s) {", ".join(map(str, unbalanced))} do not add up to their '
            "system memory: see the findings.</p>") if unbalanced else ""
    idle = f" ({r.get('arenas_on_free_list', 0)} with no thread)" if words.arenas == "arenas" else ""
    limit = f"<p>{words.arenas.capitalize()}: {len(rows)}{idle}; limit {e(r.get('arena_limit'))}.</p>"
    return section("arenas", "Where the memory is", chart, table(head, map(cells, rows), (1, 2), foot), note, limit)


def _row_label(a: dict[str, Any], words: Words) -> str:
    """A row's label in the chart: "arena N" (and "(main)"), or, where the rows are not arenas, its kind."""
    if words.arenas != "arenas":
        return f"{a['number']}: {a['kind']}"
    return f"arena {a['number']}" + (" (main)" if a["kind"] == "main" else "")


def plain_caption(strip: HeapStrip) -> tuple[int, list[str]]:
    """How many pieces STRIP holds, and its figures: its size, in use, then each other kind it holds and what
    its allocator gives back (a map's caption for an allocator with no words of its own)."""
    held = kind_bytes(strip)
    bits = [human(strip.end - strip.start), f"in use {human(sum(n for k, n in held.items() if KINDS[k].use == USED))}"]
    bits += [f"{NAMES[k]} {human(held[k])}" for k in in_drawing_order(held) if KINDS[k].use not in (USED, DAMAGE)]
    if strip.trimmable is not None:
        bits.append(f"{strip.band} {human(trim_bytes(strip))}")
    return sum(piece_counts(strip).values()), bits


def maps_section(strips: Sequence[HeapStrip], unit: str, intro: str, caption=plain_caption) -> str:
    """The heap maps: INTRO (a paragraph), a legend, then a figure per strip with its caption: CAPTION(strip)
    gives how many UNIT (what a strip is made of: "chunks", "extents") it holds and the allocator's figures
    of it, which its resident bytes, its reservation and its damage follow."""
    if not strips:
        return section("maps", "Heap maps", "<p>No heap to draw.</p>")
    drawn = _drawn(strips)
    figures = []
    seen: dict[str, int] = {}
    for strip in drawn:
        held = kind_bytes(strip)
        for k, n in held.items():
            seen[k] = seen.get(k, 0) + n
        pieces, bits = caption(strip)
        if strip.resident is not None:
            res = strip.resident.astype("int64")
            bits.append(f"resident {human(int((res[:, 1] - res[:, 0]).sum()))}")
        if strip.beyond:
            bits.append(f"and {human(strip.beyond)} reserved, never mapped")
        damaged = sum(n for k, n in held.items() if KINDS[k].use == DAMAGE)
        if damaged:
            bits.append(f"NOT WALKED (damage) {human(damaged)}")
        named = unit if pieces != 1 else unit[:-1]
        figures.append(f'<figure class="heap"><figcaption><b>{e(strip.label)}</b> '
                       f'<code>{strip.start:#x}-{strip.end:#x}</code> · {pieces} {named} · {e(" · ".join(bits))}'
                       f"</figcaption>{svg_strip(strip)}</figure>")
    legend = [f"<span>{swatch(COLOURS[k])}{e(NAMES[k])}</span>" for k in in_drawing_order(seen)]
    if bands(drawn):
        legend.append(f"<span>{swatch(BAND_COLOURS['trim'])}under a strip: {e(bands(drawn))}</span>")
    if any(s.resident is not None for s in drawn):
        legend.append(f"<span>{swatch(BAND_COLOURS['resident'])}"
                      f"{'under that' if bands(drawn) else 'under a strip'}: resident pages</span>")
    left = len(strips) - len(drawn)
    more = (f"<p class=\"warn\">{left} more heaps are not drawn here: 'heapwalk map --svg FILE' draws them "
            "all.</p>") if left else ""
    return section("maps", "Heap maps", intro, f'<div class="legend">{"".join(legend)}</div>', *figures, more)


def _drawn(strips: Sequence[HeapStrip]) -> list[HeapStrip]:
    """The strips a page draws, in their order: all when few, else those with damage and the most free bytes."""
    if len(strips) <= MAPS_DRAWN:
        return list(strips)

    def weight(i: int) -> tuple[bool, int]:
        held = kind_bytes(strips[i])
        return (any(n for k, n in held.items() if KINDS[k].use == DAMAGE),
                sum(n for k, n in held.items() if KINDS[k].use == FREE))
    keep = sorted(sorted(range(len(strips)), key=weight, reverse=True)[:MAPS_DRAWN])
    return [strips[i] for i in keep]


def histogram_section(r: dict[str, Any], words: Words) -> str:
    """The free pieces by size: a chart, the allocator's size classes, the largest."""
    what = words.pieces
    title = f"Free {what} by size"
    buckets = [b for b in r.get("histogram") or [] if b["count"]]
    if not buckets:
        return section("histogram", title, f"<p>No free {what[:-1]}.</p>")
    chart = bar_chart([(f"{human(b['low'])} - {human(b['high'])}", b["bytes"],
                        f"{b['count']} {what if b['count'] != 1 else what[:-1]}, {human(b['bytes'])}")
                       for b in buckets], f"free {what} by size: bytes", "#2ca02c")
    rows = [(e(c["class"]), str(c["count"]), human(c["bytes"])) for c in r.get("by_size_class") or []]
    classes = table([words.size_class, what, "bytes"], rows) if rows else ""
    pieces = words.pieces_page or f"free {what}"
    said = (f"<p>{r.get('free_chunks', 0)} {pieces}; the largest is {human(r.get('largest_free') or 0)}; "
            f"{100 * (r.get('fragmentation') or 0):.1f}% of the free memory is outside the largest one.</p>")
    return section("histogram", title, said, chart, classes)


def chunk_count(n: int, blocks: str = "chunks") -> str:
    """N of BLOCKS (plural), in the singular for one."""
    return f"{n} {blocks if n != 1 else blocks[:-1]}"


def in_use_section(r: dict[str, Any], words: Words) -> str:
    """The blocks in use by size and by signature, and what the leak scan found among them."""
    used, leaks, blocks = r.get("in_use"), r.get("leaks"), words.blocks
    if not used or not used.get("count"):
        return ""
    scanned = leaks is not None
    if scanned:
        found = (f"{chunk_count(leaks['leaked_count'], blocks)} ({human(leaks['leaked_bytes'])}) are reached by "
                 "nothing"
                 if leaks["leaked_count"] else "it reached every one")
        words = (f"<p>The leak scan followed every pointer from the program's roots to the "
                 f"{chunk_count(leaks['in_use_count'], blocks)} in use ({human(leaks['in_use_bytes'])}): {found}.</p>")
    else:
        words = "<p>No leak scan ran ('heapwalk report --no-leaks').</p>"
    head = ["size", blocks, "bytes", "share"] + ([f"leaked {blocks}", "leaked"] if scanned else [])
    rows = [[f"{human(b['low'])} - {human(b['high'])}", str(b["count"]), human(b["bytes"]), share(b["bytes"], used["bytes"])]
            + ([str(b["leaked_count"]), human(b["leaked_bytes"])] if scanned else []) for b in used["histogram"]]
    parts = [words, table(head, rows)]
    signatures = used.get("by_signature") or []
    if signatures:
        head = ["signature", blocks, "bytes", "share"] + ([f"leaked {blocks}", "leaked"] if scanned else []) + ["example"]
        rows = [[e(g["signature"]), str(g["count"]), human(g["bytes"]), share(g["bytes"], used["bytes"])]
                + ([str(g["leaked_count"]), human(g["leaked_bytes"])] if scanned else [])
                + [f"<code>{g['example']:#x}</code>" + (f" {e(repr(g['text']))}" if g.get("text") else "")]
                for g in signatures[:25]]
        parts.append(f"<p>By signature (the first word: a vtable, a type, or text), the {min(25, len(signatures))} "
                     "biggest:</p>")
        parts.append(table(head, rows, (0, len(head) - 1)))
    return section("in-use", "The memory in use" + (" and leaks" if scanned else ""), *parts)


def findings_section(doc: dict[str, Any], allocator: str, listed: Sequence[dict[str, Any]] | None = None) -> str:
    """Every finding, each once: LISTED (where the allocator keeps them in its document), by default DOC's own
    and its arenas'; or that ALLOCATOR's structures were all as it leaves them."""
    found, seen = [], set()
    if listed is None:
        listed = list(doc.get("findings") or []) + [f for a in doc.get("arenas") or [] for f in a.get("findings") or []]
    for f in listed:
        key = (f["kind"], f["address"], f["message"])
        if key not in seen:
            seen.add(key)
            found.append(f)
    if not found:
        return section("findings", "Findings", f"<p>None: every structure read was as {e(allocator)} leaves it.</p>")
    rows = [(f'<span class="sev-{e(f["severity"])}">{e(f["severity"])}</span>', e(f["kind"]),
             "-" if f["address"] is None else f"<code>{f['address']:#x}</code>", e(f.get("structure") or ""),
             e(f["message"])) for f in found]
    return section("findings", f"Findings ({len(found)})",
                   table(["severity", "kind", "address", "in", "what"], rows, (0, 1, 2, 3), wrap=(4,)))
