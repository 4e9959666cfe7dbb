"""tcmalloc's report page (`heapwalk report --html`): the header's facts (its version, where it is, its pages and
classes) and its sections: the verdict, the page heap's row, the spans' maps, the size classes, the free spans
by length, the thread caches, the free objects by size, the memory in use and leaks, the findings.  Every figure
comes from the report's JSON document, as the text report's do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heapwalk.analysis.report import human
from heapwalk.output.htmlpage import e, section, table
from heapwalk.output.htmlreport import (arenas_section, findings_section, histogram_section, in_use_section,
                                        maps_section, plain_figures, verdict_section)
from heapwalk.common.view import HeapStrip, Words

__all__ = ["tcmalloc_sections", "tcmalloc_facts"]

_MAPS = ("<p>The page heap's spans, address left to right, a strip for each stretch without a gap: each column is "
         "a stack of what holds its bytes. A span cut into objects shows the objects the program holds, then the "
         "free ones in thread caches, transfer caches and its own list, then what rounding loses (exact bytes, not "
         "their order inside the span); free spans are what ReleaseFreeMemory() gives back.</p>")


def tcmalloc_facts(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The header's rows of a tcmalloc document."""
    tc = doc.get("tcmalloc") or {}
    version = f"gperftools {tc['version']}" if tc.get("version") else "gperftools (version not said)"
    layout = next((d["how"] for d in tc.get("discovery") or [] if d.get("what") == "layout"), "?")
    return [("tcmalloc", f"{e(version)} <code>{e(tc.get('library') or '?')}</code>"),
            ("decoded as", f"{e(layout)} layout; pages of {tc.get('page_size', '?')} bytes, "
                           f"{tc.get('classes', '?')} size classes")]


def tcmalloc_sections(doc: dict[str, Any], strips: Sequence[HeapStrip], words: Words) -> list[str]:
    """The sections of a tcmalloc page."""
    r = doc["report"]
    maps = maps_section(strips, "pieces", _MAPS)
    return [verdict_section(r, plain_figures(r, words), words), arenas_section(doc, r, words), maps,
            _classes(doc), _free_spans(doc), _threads(doc), histogram_section(r, words), in_use_section(r, words),
            findings_section(doc, "tcmalloc")]


def _classes(doc: dict[str, Any]) -> str:
    rows = sorted((doc.get("tcmalloc") or {}).get("classes_in_use") or [], key=lambda r: -r["free_bytes"])
    if not rows:
        return ""
    cells = [(str(r["class"]), human(r["size"]), str(r["spans"]), str(r["objects"]), str(r["in_use"]),
              f"{100 * r['utilization']:.0f}%", str(r["central"]), str(r["transfer"]), str(r["thread"]),
              human(r["free_bytes"])) for r in rows]
    return section("classes", "Size classes", "<p>Each size class that holds anything, those with the most free "
                   "bytes first: a class whose spans are mostly free objects is fragmented, and a release cannot "
                   "return a span until every object of it is freed.</p>",
                   table(["class", "size", "spans", "objects", "in use", "used", "free in spans", "transfer",
                          "thread caches", "free bytes"], cells, ()))


def _free_spans(doc: dict[str, Any]) -> str:
    rows = (doc.get("tcmalloc") or {}).get("free_spans") or []
    if not rows:
        return ""
    cells = [("large" if r["pages"] is None else str(r["pages"]), str(r["normal_spans"]), human(r["normal_bytes"]),
              "-" if r["normal_resident"] is None else human(r["normal_resident"]), str(r["returned_spans"]),
              human(r["returned_bytes"])) for r in rows]
    return section("free-spans", "Free spans by length", "<p>The page heap's free spans, as MallocExtension's "
                   "statistics list them: the free ones hold pages until a release returns them; the returned ones "
                   "are address space only.</p>",
                   table(["pages", "free spans", "bytes", "in RAM", "returned spans", "returned bytes"], cells, ()))


def _threads(doc: dict[str, Any]) -> str:
    rows = (doc.get("tcmalloc") or {}).get("threads") or []
    if not rows:
        return ""
    cells = [("-" if t["thread"] is None else str(t["thread"]), "-" if t["lwp"] is None else str(t["lwp"]),
              e(t["name"] or "-"), f"<code>{t['address']:#x}</code>", human(t["bytes"]), str(t["objects"]),
              human(t["max_size"])) for t in rows]
    return section("threads", "Thread caches", table(["thread", "LWP", "name", "cache", "holds", "objects", "limit"],
                                                     cells, (2, 3)))
