"""'heapwalk report --html': the report as one self-contained page to attach to a ticket, built from the report's
JSON document (`jsondoc.report_document`, so the page says exactly what --json says) and the heap maps' strips:
the header (process, glibc, how each structure was found), the verdict with its remedies, the key figures,
where each arena's bytes are (chart and table), the heap maps, the free-chunk histogram, the trim what-if, the
memory in use and what the leak scan found, the threads and their arenas, and the findings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from heapwalk.analysis.report import human
from heapwalk.output.charts import bar_chart, stacked_chart
from heapwalk.output.heapmaps import BAND_COLOURS, COLOURS, NAMES, chunk_counts, kind_bytes, svg_strip, trim_bytes
from heapwalk.output.htmljemalloc import JE_COLOURS, JE_NAMES, decay_section, jemalloc_facts, jemalloc_threads
from heapwalk.output.htmlpage import cards, e, page, section, swatch, table
from heapwalk.output.leakdoc import share
from heapwalk.view import MAP_KINDS, HeapStrip, Words

__all__ = ["report_html", "glibc_sections", "glibc_facts", "jemalloc_sections", "jemalloc_header", "plain_sections",
           "MAPS_DRAWN"]

#: heaps drawn on a page at most (`heapwalk map --svg` draws them all): those with damage first, then those
#: holding the most free bytes
MAPS_DRAWN = 120
FREE_KINDS = ("tcache", "fast", "unsorted", "small", "large")
_KEPT = {"tcache": "in tcache (never flushed)", "sub_page": "in free pieces under a page",
         "thread_top": "in thread arenas' tops (never trimmed)", "main_top": "of the main arena's top"}


def report_html(doc: dict[str, Any], facts: list[tuple[str, str]], sections: Sequence[str], made_by: str = "",
                beside: Sequence[tuple[str, str, Sequence[str]]] = (), both: str = "") -> str:
    """The page of the report document DOC: its header with FACTS (rows of name and HTML, the allocator's),
    then the allocator's SECTIONS; MADE_BY says how it was made (the command, the time), in the footer.  For a
    process with more than one allocator, BESIDE holds each other's (heading, id prefix, sections), drawn
    after the first's, and BOTH says what each holds."""
    body = [_header(doc, facts), *sections]
    if beside:
        body.insert(2, f'<p class="warn">{e(both)}</p>')
    for heading, prefix, parts in beside:
        body.append(f'<div class="beside"><h1>{e(heading)}</h1>')
        body += [part.replace('<section id="', f'<section id="{prefix}-') for part in parts if part]
        body.append("</div>")
    if made_by:
        body.append(f"<footer>{e(made_by)}</footer>")
    return page(f"heapwalk report: {doc.get('target') or 'heap'}", "\n".join(b for b in body if b))


def glibc_sections(doc: dict[str, Any], strips: Sequence[HeapStrip], words: Words) -> list[str]:
    """The sections of a glibc heap's page: verdict, arenas, maps, histogram, trim, in use, threads, findings."""
    r = doc["report"]
    t = r["totals"]
    figures = [(words.holds, human(t["system"])), ("in use", human(t["in_use"])), ("free in chunks", human(t["free"])),
               ("top chunks", human(t["top"])),
               ("malloc_trim(0) gives back" + (" (RSS)" if r.get("residency") else ""), human(t["trim"]))]
    return [verdict_section(r, figures, words), arenas_section(doc, r, words), _maps(strips),
            histogram_section(r, words), _trim(doc, r), _in_use(r), _threads(doc), findings_section(doc, "glibc")]


def jemalloc_sections(doc: dict[str, Any], strips: Sequence[HeapStrip], words: Words) -> list[str]:
    """The sections of a jemalloc page: verdict, arenas, extents, histogram, decay, threads, findings."""
    r = doc["report"]
    return [verdict_section(r, plain_figures(r, words), words), arenas_section(doc, r, words),
            _maps(strips, "extents") if strips else _no_maps(), histogram_section(r, words), decay_section(doc),
            jemalloc_threads(doc), findings_section(doc, "jemalloc")]


def plain_sections(doc: dict[str, Any], strips: Sequence[HeapStrip], words: Words, name: str) -> list[str]:
    """The sections of an allocator that has none of its own: verdict, arenas, maps, histogram, findings."""
    r = doc["report"]
    maps = _maps(strips, "extents") if strips else section("maps", "Heap maps", "<p>No heap to draw.</p>")
    return [verdict_section(r, plain_figures(r, words), words), arenas_section(doc, r, words), maps,
            histogram_section(r, words), _in_use(r), findings_section(doc, name)]


def plain_figures(r: dict[str, Any], words: Words) -> list[tuple[str, str]]:
    """The key figures: what the arenas hold, in use, free, and what the allocator would give back."""
    t = r["totals"]
    return [(words.holds, human(t["system"])), ("in use", human(t["in_use"])), ("free", human(t["free"])),
            (words.gives_back, human(t["trim"]))]


def jemalloc_header(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return jemalloc_facts(doc)


def glibc_facts(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The header's rows of a glibc heap: its version and how it was found, its layout, main_arena and mp_."""
    found = doc.get("discovery") or {}
    glibc = doc.get("glibc") or {}

    def how(name: str) -> str:
        fact = found.get(name)
        return f' <span class="muted">({e(fact["found_by"])})</span>' if fact and fact.get("found_by") else ""
    return [("glibc", f"{e(glibc.get('version') or '?')}{how('glibc_version')}"),
            ("decoded as", f"glibc {e(glibc.get('decoded_as') or '?')} layout "
             f"<code>{e(glibc.get('layout') or '?')}</code>"),
            ("main_arena", (f"<code>{doc['main_arena']:#x}</code>" if doc.get("main_arena") is not None
                            else "unknown") + how("main_arena")),
            ("mp_", (f"<code>{doc['mp']['address']:#x}</code>" if doc.get("mp") else "unknown") + how("mp_"))]


def _header(doc: dict[str, Any], facts: list[tuple[str, str]]) -> str:
    found = doc.get("discovery") or {}
    rows = list(facts)
    residency = doc["report"].get("residency")
    rows.append(("resident pages", e(f"from {residency}") if residency else
                 "not known (a core from 'heapwalk capture' or a live process records them)"))
    facts_html = "".join(f"<dt>{e(k)}</dt><dd>{v}</dd>" for k, v in rows)
    more = "".join(f"<tr><td class=\"l\">{e(name)}</td><td class=\"l mono\">{e(_value(f.get('value')))}</td>"
                   f"<td class=\"wrap\">{e(f.get('found_by') or '')}</td></tr>" for name, f in found.items())
    details = (f"<details><summary>how each structure was found ({len(found)})</summary><div class=\"scroll\">"
               f"<table><thead><tr><th class=\"l\">what</th><th class=\"l\">value</th><th class=\"l\">found by</th>"
               f"</tr></thead><tbody>{more}</tbody></table></div></details>") if found else ""
    return (f"<header><h1>heapwalk report</h1><div class=\"target\">{e(doc.get('target') or '')}</div>"
            f"<dl class=\"facts\">{facts_html}</dl>{details}</header>")


def _value(value) -> str:
    return f"{value:#x}" if isinstance(value, int) and value > 4096 else str(value)


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


def arenas_section(doc: dict[str, Any], r: dict[str, Any], words: Words) -> str:
    """Where each arena's bytes are: a chart and a table, in the allocator's WORDS."""
    rows = r["arenas"]
    kinds = list(dict.fromkeys(k for a in rows for k in a["free"]))
    colours, names = {**COLOURS, **JE_COLOURS}, {**NAMES, **JE_NAMES}
    names["overhead"] = words.overhead_page or words.overhead
    top = ["top"] if words.top else []      # an allocator without a top: its column would be 0 B throughout
    chart = stacked_chart([(f"arena {a['number']}" + (" (main)" if a["kind"] == "main" else ""),
                            [("in_use", a["in_use"])] + [(k, a["free"].get(k, 0)) for k in kinds]
                            + [(k, a[k]) for k in top] + [("overhead", a["overhead"])]) for a in rows],
                          colours, names, "where each arena's bytes are")
    rss = bool(r.get("residency"))
    head = ["#", "arena", "kind", "threads", words.heaps, words.system] \
        + (["RSS"] if rss else []) + ["in use"] + [names.get(k, k) for k in kinds] + top \
        + [names["overhead"], words.gives_back]

    def cells(a: dict[str, Any]) -> list[str]:
        return ([str(a["number"]), f"<code>{a['address']:#x}</code>", e(a["kind"]), str(a["threads"]), str(a["heaps"]),
                 human(a["system"])] + ([human(a["rss"]) if a.get("rss") is not None else "-"] if rss else [])
                + [human(a["in_use"])] + [human(a["free"].get(k, 0)) for k in kinds]
                + [human(a[k]) for k in top] + [human(a["overhead"]), human(a["trim"])])
    t = r["totals"]
    foot = ["", f"{len(rows)} arenas", "", "", "", human(t["system"])] + ([human(t["rss"] or 0)] if rss else []) + [
        human(t["in_use"])] + [human(sum(a["free"].get(k, 0) for a in rows)) for k in kinds] + [
        human(t[k]) for k in top] + [human(t["overhead"]), human(t["trim"])]
    unbalanced = [a["number"] for a in rows if not a.get("balanced", True)]
    note = (f'<p class="warn">The bytes of arena(s) {", ".join(map(str, unbalanced))} do not add up to their '
            "system memory: see the findings.</p>") if unbalanced else ""
    limit = f"<p>Arenas: {len(rows)} ({r.get('arenas_on_free_list', 0)} with no thread); limit {e(r.get('arena_limit'))}.</p>"
    return section("arenas", "Where the memory is", chart, table(head, map(cells, rows), (1, 2), foot), note, limit)


def _no_maps() -> str:
    return section("maps", "Heap maps", "<p>No map of jemalloc's extents: its radix tree of extents was not found, "
                   "or maps none (see the findings).</p>")


#: the kinds that stand for one extent each on a map of jemalloc's extents
_EXTENT_KINDS = ("in_use", "dirty", "muzzy", "retained", "unwalked")


def _maps(strips: Sequence[HeapStrip], unit: str = "chunks") -> str:
    """The heap maps: a figure per strip, its caption with its figures; UNIT is what a strip is made of
    ("chunks" of a glibc heap, jemalloc's "extents")."""
    if not strips:
        return section("maps", "Heap maps", "<p>No heap to draw.</p>")
    drawn = _drawn(strips)
    figures = []
    seen: dict[str, int] = {}
    for strip in drawn:
        held = kind_bytes(strip)
        for k, n in held.items():
            seen[k] = seen.get(k, 0) + n
        free = sum(held.get(k, 0) for k in FREE_KINDS)
        if unit == "extents":
            bits = [f"{human(strip.end - strip.start)}", f"in use {human(held.get('in_use', 0))}"] + [
                f"{NAMES[k]} {human(held[k])}" for k in ("slab_free", "dirty", "muzzy", "retained") if held.get(k)]
        else:
            bits = [f"{human(strip.end - strip.start)}",
                    f"in use {human(held.get('in_use', 0) + held.get('leaked', 0))}"] + (
                [f"leaked {human(held['leaked'])}"] if held.get("leaked") else []) + [
                f"free {human(free)}", f"top {human(held.get('top', 0))}", f"trim gives back {human(trim_bytes(strip))}"]
        if strip.resident is not None:
            res = strip.resident.astype("int64")
            bits.append(f"resident {human(int((res[:, 1] - res[:, 0]).sum()))}")
        if strip.beyond:
            bits.append(f"and {human(strip.beyond)} reserved, never mapped")
        if held.get("unwalked"):
            bits.append(f"NOT WALKED (damage) {human(held['unwalked'])}")
        if unit == "extents":
            pieces = int(np.isin(strip.kinds, [MAP_KINDS.index(k) for k in _EXTENT_KINDS]).sum())
        else:
            pieces = sum(chunk_counts(strip).values())
        named = unit if pieces != 1 else unit[:-1]
        figures.append(f'<figure class="heap"><figcaption><b>{e(strip.label)}</b> '
                       f'<code>{strip.start:#x}-{strip.end:#x}</code> · {pieces} {named} · {e(" · ".join(bits))}'
                       f"</figcaption>{svg_strip(strip)}</figure>")
    legend = [f"<span>{swatch(COLOURS[k])}{e(NAMES[k])}</span>" for k in MAP_KINDS if k in seen]
    if unit != "extents":
        legend.append(f"<span>{swatch(BAND_COLOURS['trim'])}under a strip: malloc_trim(0) gives back</span>")
    if any(s.resident is not None for s in drawn):
        legend.append(f"<span>{swatch(BAND_COLOURS['resident'])}"
                      f"{'under a strip' if unit == 'extents' else 'under that'}: resident pages</span>")
    intro = ("<p>Each heap of each arena, address left to right: each column is a stack of what holds its bytes. "
             "Free memory with chunks in use scattered through it is memory those chunks pin.</p>") if unit != \
        "extents" else ("<p>Each arena's extents, address left to right, a strip for each stretch without a gap: "
                        "each column is a stack of what holds its bytes. A slab's free regions are drawn after its "
                        "regions in use; dirty pages are what decay gives back.</p>")
    left = len(strips) - len(drawn)
    more = (f"<p class=\"warn\">{left} more heaps are not drawn here: 'heapwalk map --svg FILE' draws them "
            "all.</p>") if left else ""
    return section("maps", "Heap maps", intro, f'<div class="legend">{"".join(legend)}</div>', *figures, more)


def _drawn(strips: Sequence[HeapStrip]) -> list[HeapStrip]:
    """The strips a page draws, in their order: all when few, else those with damage and the most free bytes."""
    if len(strips) <= MAPS_DRAWN:
        return list(strips)

    def weight(i: int) -> tuple[int, int]:
        held = kind_bytes(strips[i])
        return (held.get("unwalked", 0) > 0, sum(held.get(k, 0) for k in FREE_KINDS + ("top",)))
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
    rows = [(e(c["class"]), str(c["count"]), human(c["bytes"])) for c in r.get("by_glibc_class") or []]
    classes = table(["glibc's size class", "chunks", "bytes"], rows) if rows else ""
    pieces = words.pieces_page or f"free {what}"
    said = (f"<p>{r.get('free_chunks', 0)} {pieces}; the largest is {human(r.get('largest_free') or 0)}; "
            f"{100 * (r.get('fragmentation') or 0):.1f}% of the free memory is outside the largest one.</p>")
    return section("histogram", title, said, chart, classes)


def _chunks(n: int) -> str:
    return f"{n} chunk" + ("" if n == 1 else "s")


def _trim(doc: dict[str, Any], r: dict[str, Any]) -> str:
    arenas = [a for a in doc.get("arenas") or [] if a.get("trim")]
    total = sum(a["trim"]["total"] for a in arenas)
    resident = sum(a["trim"]["resident"] for a in arenas)
    words = (f"<p>malloc_trim(0) would give back {human(total)} of address space now, {human(resident)} of it "
             "resident: the whole pages inside free chunks (madvise) and the end of the main arena's top (the "
             "break lowered). What it cannot give back:</p>")
    kept = [(_KEPT.get(k, k), n, human(n)) for k, n in (r.get("trim_kept") or {}).items() if n]
    chart = bar_chart(kept, "free bytes malloc_trim(0) keeps", "#7f7f7f") if kept else ""
    rows = [(str(a["number"]), human(a["trim"]["total"]), human(a["trim"]["resident"]), human(a["trim"]["madvise"]),
             human(a["trim"]["systrim"]), human(a["trim"]["kept_free"])) for a in arenas]
    return section("trim", "What malloc_trim(0) would give back", words, chart,
                   table(["arena", "gives back", "resident", "inside free chunks", "main top", "kept free"], rows))


def _in_use(r: dict[str, Any]) -> str:
    used, leaks = r.get("in_use"), r.get("leaks")
    if not used or not used.get("count"):
        return ""
    scanned = leaks is not None
    if scanned:
        found = (f"{_chunks(leaks['leaked_count'])} ({human(leaks['leaked_bytes'])}) are reached by nothing"
                 if leaks["leaked_count"] else "it reached every one")
        words = (f"<p>The leak scan followed every pointer from the program's roots to the "
                 f"{_chunks(leaks['in_use_count'])} in use ({human(leaks['in_use_bytes'])}): {found}.</p>")
    else:
        words = "<p>No leak scan ran ('heapwalk report --no-leaks').</p>"
    head = ["size", "chunks", "bytes", "share"] + (["leaked chunks", "leaked"] if scanned else [])
    rows = [[f"{human(b['low'])} - {human(b['high'])}", str(b["count"]), human(b["bytes"]), share(b["bytes"], used["bytes"])]
            + ([str(b["leaked_count"]), human(b["leaked_bytes"])] if scanned else []) for b in used["histogram"]]
    parts = [words, table(head, rows)]
    signatures = used.get("by_signature") or []
    if signatures:
        head = ["signature", "chunks", "bytes", "share"] + (["leaked chunks", "leaked"] if scanned else []) + ["example"]
        rows = [[e(g["signature"]), str(g["count"]), human(g["bytes"]), share(g["bytes"], used["bytes"])]
                + ([str(g["leaked_count"]), human(g["leaked_bytes"])] if scanned else [])
                + [f"<code>{g['example']:#x}</code>" + (f" {e(repr(g['text']))}" if g.get("text") else "")]
                for g in signatures[:25]]
        parts.append(f"<p>By signature (the first word: a vtable, a type, or text), the {min(25, len(signatures))} "
                     "biggest:</p>")
        parts.append(table(head, rows, (0, len(head) - 1)))
    return section("in-use", "The memory in use" + (" and leaks" if scanned else ""), *parts)


def _threads(doc: dict[str, Any]) -> str:
    number = {a["address"]: a["number"] for a in doc.get("arenas") or []}
    rows = []
    for t in doc.get("threads") or []:
        tc = t.get("tcache") or {}
        arena = t.get("arena")
        rows.append((str(t["number"]), str(t.get("lwp") or "-"),
                     "-" if arena is None else f"{number.get(arena, '?')} <code>{arena:#x}</code>",
                     str(tc.get("count", "-")), human(tc["bytes"]) if tc else "-",
                     "" if t.get("tls_intact", True) else "its thread block could not be read"))
    if not rows:
        return ""
    return section("threads", "Threads and their arenas",
                   table(["thread", "LWP", "arena", "tcache chunks", "tcache bytes", ""], rows, (0, 2), wrap=(5,)))


def findings_section(doc: dict[str, Any], allocator: str) -> str:
    found, seen = [], set()
    listed = list(doc.get("findings") or [])
    for a in doc.get("arenas") or []:
        listed += [*(a.get("findings") or []), *((a.get("accounting") or {}).get("findings") or [])]
    caches = [t.get("tcache") for t in doc.get("threads") or []] + list(doc.get("scanned_tcaches") or [])
    listed += [f for tc in caches if tc for f in tc.get("findings") or []]
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
