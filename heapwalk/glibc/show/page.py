"""The report page's parts a glibc heap fills from its report document (`documents.report_document`): the
header's rows (glibc, the layout, main_arena, mp_), the key figures, what malloc_trim(0) would give back, and
the threads with their arenas and tcaches; the rest is every allocator's (`heapwalk.output.htmlreport`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heapwalk.analysis.report import human
from heapwalk.common.mapkinds import FREE, KINDS
from heapwalk.output.charts import bar_chart
from heapwalk.output.heapmaps import kind_bytes, piece_counts, resident_trim_bytes, trim_bytes
from heapwalk.output.htmlpage import e, section, table
from heapwalk.output.htmlreport import (arenas_section, findings_section, histogram_section, in_use_section,
                                        maps_section, verdict_section)
from heapwalk.common.view import HeapStrip, Words

__all__ = ["glibc_sections", "glibc_facts"]

_KEPT = {"tcache": "in tcache (never flushed)", "sub_page": "in free pieces under a page",
         "thread_top": "in thread arenas' tops (never trimmed)", "main_top": "of the main arena's top"}


def glibc_sections(doc: dict[str, Any], strips: Sequence[HeapStrip], words: Words) -> list[str]:
    """The sections of a glibc heap's page: verdict, arenas, maps, histogram, trim, in use, threads, findings."""
    r = doc["report"]
    t = r["totals"]
    figures = [(words.holds, human(t["system"])), ("in use", human(t["in_use"])), ("free in chunks", human(t["free"])),
               ("top chunks", human(t["top"])),
               ("malloc_trim(0) gives back" + (" (RSS)" if r.get("residency") else ""), human(t["trim"]))]
    return [verdict_section(r, figures, words), arenas_section(doc, r, words),
            maps_section(strips, "chunks", _MAPS, _caption), histogram_section(r, words), _trim(doc, r),
            in_use_section(r, words), _threads(doc), findings_section(doc, "glibc", _findings(doc))]


_MAPS = ("<p>Each heap of each arena, address left to right: each column is a stack of what holds its bytes. "
         "Free memory with chunks in use scattered through it is memory those chunks pin.</p>")


def _caption(strip: HeapStrip) -> tuple[int, list[str]]:
    """A glibc heap's chunks, and its figures as its arena's row counts them: size, in use (the tcache struct,
    a chunk malloc counts in use, with it; leaked apart), free in chunks, top, the address space trim releases
    (and how much of it is in RAM, what the arena table says trim gives back, when known)."""
    held = kind_bytes(strip)
    free = sum(n for k, n in held.items() if k != "top" and KINDS[k].use == FREE)
    used = held.get("in_use", 0) + held.get("leaked", 0) + held.get("tcache_struct", 0)
    bits = [human(strip.end - strip.start), f"in use {human(used)}"]
    bits += [f"leaked {human(held['leaked'])}"] if held.get("leaked") else []
    given = trim_bytes(strip)
    in_ram = resident_trim_bytes(strip)
    bits += [f"free {human(free)}", f"top {human(held.get('top', 0))}",
             f"trim releases {human(given)} of address space" + (f" ({human(in_ram)} of it in RAM)"
                                                                  if in_ram is not None else "")]
    return sum(piece_counts(strip).values()), bits


def _findings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Where a glibc document keeps its findings: its own, each arena's and its walk's, each tcache's."""
    listed = list(doc.get("findings") or [])
    for a in doc.get("arenas") or []:
        listed += [*(a.get("findings") or []), *((a.get("accounting") or {}).get("findings") or [])]
    caches = [t.get("tcache") for t in doc.get("threads") or []] + list(doc.get("scanned_tcaches") or [])
    return listed + [f for tc in caches if tc for f in tc.get("findings") or []]


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


def _threads(doc: dict[str, Any]) -> str:
    number = {a["address"]: a["number"] for a in doc.get("arenas") or []}
    rows = []
    for t in doc.get("threads") or []:
        tc = t.get("tcache") or {}
        arena = t.get("arena")
        rows.append((str(t["number"]), str(t.get("lwp") or "-"), e(t.get("name") or "-"),
                     "-" if arena is None else f"{number.get(arena, '?')} <code>{arena:#x}</code>",
                     str(tc.get("count", "-")), human(tc["bytes"]) if tc else "-",
                     "" if t.get("tls_intact", True) else "its thread block could not be read"))
    if not rows:
        return ""
    return section("threads", "Threads and their arenas",
                   table(["thread", "LWP", "name", "arena", "tcache chunks", "tcache bytes", ""], rows, (0, 2, 3),
                         wrap=(6,)))
