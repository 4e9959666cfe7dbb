"""tcmalloc's sentences on its report: where its free memory is, and what would give it back, with the cost,
weighed against the process's RSS."""

from __future__ import annotations

from heapwalk.analysis.report import Report, human, leaking, not_worth, scan_sentence, unknown_ram, worth
from heapwalk.tcmalloc.decode import NORMAL, TcState
from heapwalk.tcmalloc.shown import class_rows

__all__ = ["advice"]


def advice(state: TcState, rep: Report) -> list[str]:
    """The verdict's sentences on STATE's report REP, each with its figures."""
    p = state.properties()
    heap, used = p["generic.heap_size"], p["generic.current_allocated_bytes"]
    free = heap - used
    held = "" if rep.leaks is None else ", and a leak" if leaking(rep.leaks) else ", not a leak"
    out = [f"tcmalloc holds {human(heap)}{held}: {human(used)} in use by the program and {human(free)} free "
           f"({human(p['tcmalloc.pageheap_free_bytes'])} in its page heap, "
           f"{human(p['tcmalloc.central_cache_free_bytes'])} in its central free lists, "
           f"{human(p['tcmalloc.transfer_cache_free_bytes'])} in its transfer caches, "
           f"{human(p['tcmalloc.thread_cache_free_bytes'])} in {len(state.threads)} thread caches); "
           f"{human(p['tcmalloc.pageheap_unmapped_bytes'])} has been given back to the system already."]
    if rep.leaks is not None:
        out.append(scan_sentence(rep.leaks, "object"))
    page_heap = p["tcmalloc.pageheap_free_bytes"]
    in_ram = state.resident(NORMAL)
    gives = page_heap if in_ram is None else in_ram
    if page_heap and not worth(rep, gives):
        out.append(not_worth(rep, gives, "MallocExtension::ReleaseFreeMemory()"))
    elif page_heap >= max(free // 4, 1 << 20):
        if in_ram is None:
            out.append(unknown_ram("tcmalloc"))
        later = ("TCMALLOC_RELEASE_RATE (higher: sooner; from the next start) makes" if p[
            "tcmalloc.aggressive_memory_decommit"] else "TCMALLOC_RELEASE_RATE (higher: sooner) or "
            "TCMALLOC_AGGRESSIVE_DECOMMIT=t (from the next start) make")
        ram = "" if in_ram is None else f" ({human(in_ram)} of it in RAM: what the RSS falls by)"
        out.append(f"The page heap's {human(page_heap)} of free spans is what a release gives back{ram}: "
                   "MallocExtension::ReleaseFreeMemory() (MallocExtension_ReleaseFreeMemory() from C) returns it "
                   f"now, without a restart; {later} tcmalloc return it as it goes, at the cost of page faults "
                   "when the memory is used again.")
    central = p["tcmalloc.central_cache_free_bytes"] + p["tcmalloc.transfer_cache_free_bytes"]
    if central >= max(free // 4, 1 << 20):
        worst = sorted(class_rows(state), key=lambda r: -r["central_bytes"])[:3]
        named = ", ".join(f"{human(r['size'])} objects {human(r['central_bytes'])} ({100 * r['utilization']:.0f}% "
                          "of their objects in use)" for r in worst if r["central_bytes"])
        out.append(f"{human(central)} of free objects sit in the central free lists and transfer caches, in "
                   "spans that still hold objects in use: a release cannot return them until every object of a "
                   f"span is freed (fragmentation by size class: {named}; 'heapwalk bins' lists every class).")
    thread = p["tcmalloc.thread_cache_free_bytes"]
    if thread >= max(free // 4, 1 << 20):
        limit = p.get("tcmalloc.max_total_thread_cache_bytes")
        said = f", whose limit TCMALLOC_MAX_TOTAL_THREAD_CACHE_BYTES is {human(limit)}" if limit else ""
        out.append(f"{human(thread)} of free objects sit in {len(state.threads)} thread caches{said}: a lower "
                   "limit (from the next start, or MallocExtension's tcmalloc.max_total_thread_cache_bytes now) or "
                   "MallocExtension::MarkThreadIdle() in threads that go idle moves them to the central lists, at "
                   "the cost of more trips there; the system gets them back only once whole spans are free.")
    return out
