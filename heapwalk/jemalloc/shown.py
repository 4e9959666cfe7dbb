"""The JSON and the tables of a jemalloc process: field names as malloc_stats_print's JSON ("J") names them
under stats.arenas.<i>, so that readers who know jemalloc's statistics read these without a glossary."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from heapwalk.analysis.report import Report, human
from heapwalk.jemalloc.counted import regions_held
from heapwalk.jemalloc.model import JeArena, JeBin, JeState, JeThread
from heapwalk.output.jsondoc import SCHEMA_VERSION, report_json
from heapwalk.output.tables import check_text
from heapwalk.common.findings import CheckResult

__all__ = ["jemalloc_document", "jemalloc_arenas_table", "jemalloc_threads_table", "jemalloc_report_document", "jemalloc_slabs_table",
           "THREAD_STATES"]

_ARENA_FIELDS = ("nthreads", "pactive", "pdirty", "pmuzzy", "retained", "dirty_decay_ms", "muzzy_decay_ms",
                 "dirty_npurge", "dirty_nmadvise", "dirty_purged", "muzzy_npurge", "muzzy_nmadvise", "muzzy_purged",
                 "mapped", "base", "internal", "resident", "metadata_thp", "tcache_bytes", "metadata_edata",
                 "metadata_rtree", "abandoned_vm", "extent_avail")
_BIN_FIELDS = ("nmalloc", "ndalloc", "curregs", "nrequests", "nfills", "nflushes", "nreslabs", "curslabs",
               "nonfull_slabs")


def _bin(b: JeBin) -> dict[str, Any]:
    return {"size": b.size, "nregs": b.nregs, **{k: getattr(b, k) for k in _BIN_FIELDS},
            "utilization": round(b.utilization, 4)}


def _arena(a: JeArena, held: dict[int, int] | None, clock_ns: int | None = None) -> dict[str, Any]:
    uptime = clock_ns - a.created_ns if clock_ns and a.created_ns and a.created_ns <= clock_ns else None
    return {"index": a.index, "address": a.address, **{k: getattr(a, k) for k in _ARENA_FIELDS},
            "uptime_ns": uptime,
            "held": None if held is None else [{"size": size, "regions": n} for size, n in sorted(held.items())],
            "small": a.small(), "large": a.large_totals(), "bins": [_bin(b) for b in a.bins],
            "lextents": [{"size": c.size, "curlextents": c.curlextents} for c in a.large],
            "extents": [{"ndirty": e.ndirty, "nmuzzy": e.nmuzzy, "nretained": e.nretained,
                         "dirty_bytes": e.dirty_bytes, "muzzy_bytes": e.muzzy_bytes,
                         "retained_bytes": e.retained_bytes} for e in a.extents],
            "decay_clock": {"dirty_epoch_ns": a.dirty_clock[0], "dirty_deadline_ns": a.dirty_clock[1],
                            "muzzy_epoch_ns": a.muzzy_clock[0], "muzzy_deadline_ns": a.muzzy_clock[1]}}


def _thread(t: JeThread) -> dict[str, Any]:
    return {"number": t.number, "lwp": t.lwp, "name": t.name, "tsd": t.tsd, "state": t.state,
            "allocators_own": t.name == BACKGROUND_NAME, "arena": t.arena,
            "allocated": t.allocated, "deallocated": t.deallocated, "decay_ticker": t.ticker,
            "tcache": {"arena": t.tcache_arena, "bytes": t.tcache_bytes,
                       "bins": [{"size": size, "ncached": count} for size, count in t.tcache],
                       "from_arenas": [{"arena": arena, "bytes": size} for arena, size in t.tcache_origin]}}


def jemalloc_document(state: JeState) -> dict[str, Any]:
    """'heapwalk arenas --json' of a jemalloc process."""
    held = regions_held(state) if state.extents is not None else None
    return {"schema_version": SCHEMA_VERSION, "target": state.target, "allocator": "jemalloc",
            "jemalloc": {"version": state.version, "layout": state.layout_name, "page": state.page,
                         "opt": dict(state.opt),
                         "background_thread": state.background_thread, "clock_ns": state.clock_ns,
                         "statistics": state.statistics,
                         "arenas": [_arena(a, None if held is None else held.get(a.index, {}), state.clock_ns)
                                    for a in state.arenas],
                         "threads": [_thread(t) for t in state.threads]},
            "discovery": {f.name: {"value": f.value, "found_by": f.found_by} for f in state.facts},
            "findings": [{"severity": f.severity.value, "kind": f.kind.ident, "address": f.address,
                          "structure": f.structure, "message": f.message} for f in state.all_findings()]}


def jemalloc_arenas_table(state: JeState, box) -> Table:
    """Every arena: threads, active, dirty, muzzy and retained memory, its decay time and purges."""
    table = Table(title=f"jemalloc arenas ({state.version.split('-')[0]})", box=box, title_justify="left")
    for name in ("arena", "threads", "active", "dirty", "muzzy", "retained", "dirty_decay_ms", "dirty_npurge"):
        table.add_column(name, justify="right", no_wrap=True)
    for a in state.arenas:
        table.add_row(str(a.index), str(a.nthreads), human(a.active_bytes), human(a.dirty_bytes),
                      human(a.muzzy_bytes), human(a.retained), str(a.dirty_decay_ms),
                      "not kept" if a.dirty_npurge is None else str(a.dirty_npurge))
    return table


#: a tsd's state byte, named
THREAD_STATES = {0: "nominal", 1: "nominal (slow)", 2: "nominal (recompute)", 3: "minimal", 4: "purgatory",
                 5: "reincarnated", 6: "never initialised"}


#: the name jemalloc gives its background threads (pthread_setname_np), and the tsd state they run in: they take
#: an internal tsd, set to "reincarnated", so that no arena is bound to them
BACKGROUND_NAME = "jemalloc_bg_thd"
_REINCARNATED = 5


def thread_state(name: str | None, state: int | None, background: bool | None = None) -> str:
    """A thread's tsd state in words, saying which threads are jemalloc's own (its background threads, named so
    or, unnamed, in the reincarnated state while BACKGROUND threads run)."""
    if name == BACKGROUND_NAME:
        return "jemalloc's background thread"
    if state == _REINCARNATED and not name:
        return "reincarnated: jemalloc's background thread" + ("" if background else ", or a thread past its exit")
    return "unknown" if state is None else THREAD_STATES.get(state, str(state))


def jemalloc_threads_table(state: JeState, box) -> Table:
    """Every thread: its name (when the target says), its arena, its tsd's state (jemalloc's own threads
    named), the bytes it allocated and freed, what its thread cache holds, and its decay ticker."""
    table = Table(title="jemalloc threads", box=box, title_justify="left")
    named = any(t.name for t in state.threads)
    for name in ("thread", "lwp", *(("name",) if named else ()), "arena", "state", "allocated", "freed", "tcache",
                 "decay ticker"):
        table.add_column(name, justify="left" if name in ("name", "state", "decay ticker") else "right",
                         no_wrap=True)
    for t in state.threads:
        ticker = "unknown" if t.ticker is None else "yes" if t.ticker else "none"
        table.add_row(str(t.number), str(t.lwp), *((t.name or "-",) if named else ()),
                      "-" if t.arena is None else str(t.arena), thread_state(t.name, t.state, state.background_running),
                      human(t.allocated), human(t.deallocated), human(t.tcache_bytes), ticker)
    return table


def jemalloc_report_document(state: JeState, rep: Report) -> dict[str, Any]:
    """'heapwalk report --json' of a jemalloc process: the arenas' document with the report in it (the same
    "report" object as glibc's, which 'heapwalk diff' reads)."""
    return {**jemalloc_document(state), "report": {**report_json(rep), "partial": [],
                                                   "metadata": state.metadata()}}


def jemalloc_slabs_table(state: JeState, box, limit: int = 12) -> Table | None:
    """The size classes whose slabs hold the most free bytes, over all arenas: slabs, how many are not full,
    and the share of their regions in use (None when no slab is in use)."""
    rows = state.slabs_by_size()
    if not rows:
        return None
    worst = sorted(rows.items(), key=lambda item: (-item[1].free, item[0]))
    title = "slabs by size class, most free first" + (f" (the first {limit} of {len(rows)})"
                                                      if len(rows) > limit else "")
    table = Table(title=title, box=box, title_justify="left")
    for name in ("size", "curslabs", "nonfull_slabs", "curregs", "utilization", "free in slabs"):
        table.add_column(name, justify="right", no_wrap=True)
    for size, row in worst[:limit]:
        table.add_row(human(size), str(row.slabs), str(row.nonfull), str(row.used),
                      f"{100 * row.used / row.regions:.0f}%", human(row.free))
    return table


def jemalloc_check_text(findings, checked: dict[str, int], limit: int) -> Text:
    """'heapwalk check' on jemalloc: a summary line, then each finding (as glibc's check lists them)."""
    scope = (f"{checked['arenas']} arenas, {checked['bins']} bins, {checked['tcaches']} thread caches, "
             f"{checked['cached_regions']} cached regions" + (f", {checked['extents']} extents"
                                                              if checked.get("extents") else "")
             + (f" ({checked['sampled']} of them sampled by heap profiling)" if checked.get("sampled") else "")
             + (f", {checked['listed_extents']} free extents on their lists" if checked.get("listed_extents") else ""))
    return check_text(CheckResult(tuple(findings)), limit, "jemalloc", scope)


def jemalloc_check_document(state: JeState, findings, checked: dict[str, int]) -> dict[str, Any]:
    """'heapwalk check --json' on jemalloc."""
    errors = sum(1 for f in findings if f.severity.value == "error")
    return {"schema_version": SCHEMA_VERSION, "target": state.target, "allocator": "jemalloc",
            "clean": not errors, "errors": errors,
            "warnings": sum(1 for f in findings if f.severity.value == "warning"), "checked": checked,
            "findings": [{"severity": f.severity.value, "kind": f.kind.ident, "address": f.address,
                          "structure": f.structure, "message": f.message, "expected": f.expected,
                          "found": f.found} for f in findings]}
