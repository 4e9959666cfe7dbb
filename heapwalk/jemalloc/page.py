"""The parts of the report page (`heapwalk.output.htmlreport`) a jemalloc process fills from its own document
(`shown.jemalloc_report_document`): the header with jemalloc's version and the options that decide what it
keeps, what decay would give back arena by arena, and the threads with their arenas and caches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heapwalk.analysis.report import human
from heapwalk.output.charts import stacked_chart
from heapwalk.common.mapkinds import MAP_KINDS
from heapwalk.output.heapmaps import COLOURS, NAMES, kind_bytes, piece_counts
from heapwalk.output.htmlpage import e, section, table
from heapwalk.output.htmlreport import (arenas_section, findings_section, histogram_section, maps_section,
                                        plain_figures, verdict_section)
from heapwalk.common.view import HeapStrip, Words
from heapwalk.jemalloc.shown import thread_state

__all__ = ["option_settings", "jemalloc_facts", "decay_section", "jemalloc_threads", "jemalloc_sections", "JE_COLOURS", "JE_NAMES"]

#: jemalloc's kinds of free memory on the page's charts (the glibc kinds keep theirs)
JE_COLOURS = {"slabs": COLOURS["slab_free"], "dirty": COLOURS["dirty"], "muzzy": COLOURS["muzzy"],
              "retained": COLOURS["retained"]}
JE_NAMES = {"slabs": NAMES["slab_free"], "dirty": NAMES["dirty"], "muzzy": NAMES["muzzy"],
            "retained": NAMES["retained"]}
#: the options the header shows: those that decide what jemalloc keeps and gives back
_OPTIONS = ("narenas", "dirty_decay_ms", "muzzy_decay_ms", "background_thread", "retain", "tcache", "tcache_max",
            "percpu_arena", "thp", "metadata_thp", "oversize_threshold")


def jemalloc_facts(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The header's rows of a jemalloc document: its version and how it was found, its layout, its options."""
    je = doc.get("jemalloc") or {}
    found = (doc.get("discovery") or {}).get("jemalloc_version") or {}
    how = f' <span class="muted">({e(found["found_by"])})</span>' if found.get("found_by") else ""
    opt = je.get("opt") or {}
    options = ", ".join(f"{name}:{_option(opt[name])}" for name in _OPTIONS if name in opt)
    return [("jemalloc", f"{e(je.get('version') or '?')}{how}"),
            ("decoded as", f"layout <code>{e(je.get('layout') or '?')}</code>"),
            ("options", f"<code>{e(options) or 'not read'}</code>")]


def option_settings(doc: dict[str, Any]) -> str:
    """The options that decide what jemalloc keeps (its "opt" in DOC), as 'heapwalk capture' says them beside
    the environment; "" when they were not read."""
    opt = (doc.get("jemalloc") or {}).get("opt") or {}
    shown = ", ".join(f"{name}:{_option(opt[name])}" for name in _OPTIONS if name in opt)
    return f"jemalloc's options: {shown}" if shown else ""


def _option(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def decay_section(doc: dict[str, Any]) -> str:
    """What decay would give back: each arena's dirty and muzzy pages (resident until purged), what it
    retains (mapped, not resident), its decay times and how often it has purged."""
    arenas = (doc.get("jemalloc") or {}).get("arenas") or []
    if not arenas:
        return ""
    page = (doc.get("jemalloc") or {}).get("page") or 4096
    chart = stacked_chart([(f"arena {a['index']}", [("dirty", a["pdirty"] * page), ("muzzy", a["pmuzzy"] * page)])
                           for a in arenas], JE_COLOURS, JE_NAMES, "dirty and muzzy pages by arena")
    clock = (doc.get("jemalloc") or {}).get("clock_ns")
    rows = [(str(a["index"]), str(a["nthreads"]), human(a["pactive"] * page), human(a["pdirty"] * page),
             human(a["pmuzzy"] * page), human(a["retained"]), str(a["dirty_decay_ms"]), str(a["muzzy_decay_ms"]),
             _kept(a["dirty_npurge"], str), _kept(a["dirty_purged"], lambda n: human(n * page)),
             *_clock_cells(a.get("decay_clock") or {}, clock)) for a in arenas]
    dirty = sum(a["pdirty"] for a in arenas) * page
    muzzy = sum(a["pmuzzy"] for a in arenas) * page
    words = (f"<p>Dirty pages ({human(dirty)}) are freed memory not yet purged (in the RSS while in RAM); decay "
             f"purges them over "
             f"dirty_decay_ms, then muzzy pages ({human(muzzy)}) over muzzy_decay_ms. Retained memory is mapped "
             "but not resident.</p>")
    tickers = _tickers(doc)
    words += (f"<p>Decay steps when a thread of the arena calls jemalloc often enough (its decay ticker) or a "
              f"background thread wakes. {tickers} 'Last stepped' and 'next step due' are the dirty pages' decay "
              "clock against the process's clock at the snapshot"
              + (": a due time in the past is overdue.</p>" if clock else
                 ": this core does not record the process's clock ('heapwalk capture' and a live process do).</p>"))
    return section("decay", "What decay would give back", words, chart,
                   table(["arena", "threads", "active", "dirty", "muzzy", "retained", "dirty_decay_ms",
                          "muzzy_decay_ms", "purges", "purged", "last stepped", "next step due"], rows))


def _clock_cells(decay: dict[str, Any], clock: int | None) -> tuple[str, str]:
    """An arena's dirty decay clock against the process's CLOCK (ns): how long ago it last stepped, and when
    its next step is due ("overdue by" when past); "not recorded" without the process's clock."""
    epoch, deadline = decay.get("dirty_epoch_ns"), decay.get("dirty_deadline_ns")
    if not clock or not epoch or not deadline:
        return ("not recorded", "not recorded") if not clock else ("-", "-")
    ago = (clock - epoch) / 1e9
    due = (deadline - clock) / 1e9
    return (f"{ago:.3g} s ago", f"in {due:.3g} s" if due >= 0 else f"overdue by {-due:.3g} s")


def _tickers(doc: dict[str, Any]) -> str:
    """How many threads hold a decay ticker, as a sentence."""
    je = doc.get("jemalloc") or {}
    threads = [t for t in je.get("threads") or [] if not t.get("allocators_own")]
    held = sum(1 for t in threads if t.get("decay_ticker") is True)
    unknown = sum(1 for t in threads if t.get("decay_ticker") is None)
    running = je.get("background_thread")
    text = f"{held} of the {len(threads)} threads hold a ticker" + (f" ({unknown} not known)" if unknown else "")
    return text + ("; jemalloc's background threads run." if running is True else
                   "; no background thread runs." if running is False else
                   "; whether background threads run is not known.")


def _kept(value, shown) -> str:
    """A counter as SHOWN shows it, or "not kept" (a build without statistics)."""
    return "not kept" if value is None else shown(value)


def jemalloc_threads(doc: dict[str, Any]) -> str:
    """Every thread: its arena, its state, what it allocated and freed, and what its cache holds."""
    threads = (doc.get("jemalloc") or {}).get("threads") or []
    if not threads:
        return ""
    background = (doc.get("jemalloc") or {}).get("background_thread")
    rows = [(str(t["number"]), str(t.get("lwp") or "-"), e(t.get("name") or "-"),
             "-" if t.get("arena") is None else str(t["arena"]),
             e(thread_state(t.get("name"), t.get("state"), background)),
             human(t.get("allocated") or 0), human(t.get("deallocated") or 0),
             human((t.get("tcache") or {}).get("bytes") or 0),
             {True: "yes", False: "none"}.get(t.get("decay_ticker"), "unknown")) for t in threads]
    return section("threads", "Threads and their arenas",
                   table(["thread", "LWP", "name", "arena", "state", "allocated", "freed", "thread cache",
                          "decay ticker"], rows, (0, 2, 4)))


def jemalloc_sections(doc: dict[str, Any], strips: Sequence[HeapStrip], words: Words) -> list[str]:
    """The sections of a jemalloc page: verdict, arenas, extents, histogram, decay, threads, findings."""
    r = doc["report"]
    return [verdict_section(r, plain_figures(r, words), words), arenas_section(doc, r, words, JE_COLOURS, JE_NAMES),
            maps_section(strips, "extents", _MAPS, _caption) if strips else _no_maps(), histogram_section(r, words), decay_section(doc),
            jemalloc_threads(doc), findings_section(doc, "jemalloc")]


_MAPS = ("<p>Each arena's extents, address left to right, a strip for each stretch without a gap: each column is a "
         "stack of what holds its bytes. A slab's regions the threads' caches hold and its free regions are drawn "
         "after its regions in use (the caches' as the report's 'free: tcache' counts them); dirty pages are what "
         "decay gives back.</p>")


def _caption(strip: HeapStrip) -> tuple[int, list[str]]:
    """A strip's extents (an unwalked stretch counts as one), and its figures: size, in use (the leaked with
    it, as the report's rows count them), then the regions thread caches hold, its free regions in slabs and its
    dirty, muzzy and retained pages."""
    held = kind_bytes(strip)
    used = held.get("in_use", 0) + held.get("leaked", 0)
    bits = [human(strip.end - strip.start), f"in use {human(used)}"
            + (f" ({human(held['leaked'])} of it leaked)" if held.get("leaked") else "")]
    bits += [f"{NAMES[k]} {human(held[k])}" for k in ("tcache_regions", "slab_free", "dirty", "muzzy", "retained")
             if held.get(k)]
    unwalked = int((strip.kinds == MAP_KINDS.index("unwalked")).sum())
    return sum(n for k, n in piece_counts(strip).items() if k != "leaked") + unwalked, bits


def _no_maps() -> str:
    return section("maps", "Heap maps", "<p>No map of jemalloc's extents: its radix tree of extents was not found, "
                   "or maps none (see the findings).</p>")
