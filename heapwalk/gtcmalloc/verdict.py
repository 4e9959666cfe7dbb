"""Google's tcmalloc's sentences on its report: where its memory is, what a release would give back and how, and
whether its per-CPU caches are on, each with its figures."""

from __future__ import annotations

from heapwalk.analysis.report import Report, human, leaking, not_worth, scan_sentence, worth
from heapwalk.gtcmalloc.decode import GtcState

__all__ = ["advice"]


def advice(state: GtcState, rep: Report) -> list[str]:
    """The verdict's sentences on STATE's report REP."""
    p = state.properties()
    used, heap = p["generic.current_allocated_bytes"], p["generic.heap_size"]
    free = heap - used
    held = "" if rep.leaks is None else ", and a leak" if leaking(rep.leaks) else ", not a leak"
    local = (f"{human(p['tcmalloc.cpu_free'])} in the per-CPU caches of {len(state.cpus)} CPUs" if state.per_cpu
             else f"{human(p['tcmalloc.thread_cache_free'])} in {len(state.threads)} thread caches")
    out = [f"Google's tcmalloc holds {human(heap)}{held}: {human(used)} in use by the program and {human(free)} free "
           f"({human(p['tcmalloc.page_heap_free'])} in its page heap, {human(p['tcmalloc.central_cache_free'])} in "
           f"its central free lists, {human(p['tcmalloc.transfer_cache_free'])} in its transfer caches, {local}); "
           f"{human(p['tcmalloc.page_heap_unmapped'])} has been given back to the system already."]
    if rep.leaks is not None:
        out.append(scan_sentence(rep.leaks, "object"))
    page_heap = p["tcmalloc.page_heap_free"]
    if page_heap and not worth(rep, page_heap):
        out.append(not_worth(rep, page_heap, "MallocExtension::ReleaseMemoryToSystem()"))
    elif page_heap >= max(free // 4, 1 << 20):
        out.append(f"The page heap's {human(page_heap)} of free pages (free pages of partly used hugepages, "
                   "hugepages it keeps cached) is what a release gives back: "
                   f"MallocExtension::ReleaseMemoryToSystem({page_heap}) returns it now, without a restart, "
                   "breaking hugepages where it must; MallocExtension::SetBackgroundReleaseRate sets how many bytes "
                   "a second tcmalloc returns as it goes, where the program runs "
                   "MallocExtension::ProcessBackgroundActions() in a thread of its own; either costs page faults "
                   "when the memory is used again. How much of it is in RAM heapwalk does not say for Google's "
                   "tcmalloc yet (free pages never touched hold none): the release saves at most this.")
    kept = p["tcmalloc.central_cache_free"] + p["tcmalloc.transfer_cache_free"]
    if kept >= max(free // 4, 1 << 20):
        worst = sorted(state.classes, key=lambda c: -(c.central_objects + c.transfer_objects) * c.size)[:3]
        named = ", ".join(f"{human(c.size)} objects {human((c.central_objects + c.transfer_objects) * c.size)}"
                          for c in worst if c.central_objects + c.transfer_objects)
        out.append(f"{human(kept)} of free objects sit in the central free lists and transfer caches ({named}): "
                   "their spans still hold objects in use, and a release returns a span only once every object "
                   "in it is free.")
    cpu = p["tcmalloc.cpu_free"]
    if state.per_cpu and cpu >= max(free // 4, 1 << 20):
        out.append(f"{human(cpu)} of free objects sit in the per-CPU caches of {len(state.cpus)} CPUs, each CPU's slab "
                   f"allowed {human(state.cpu_limit)}: MallocExtension::SetMaxPerCpuCacheSize lowers that limit, and "
                   "MallocExtension::ReleaseCpuMemory(cpu) empties a CPU's slab now, at the cost of more trips to the "
                   "transfer caches; what a slab gives up goes to the central lists, and back to the system only "
                   "once whole spans are free.")
    if not state.per_cpu:
        out.append(f"Its per-CPU caches are off: each thread allocates through a thread cache ({len(state.threads)} "
                   f"hold {human(p['tcmalloc.thread_cache_free'])}). tcmalloc turns them on only where it can "
                   "register its own rseq area: under glibc 2.35 or later, which registers one for every thread, "
                   "that takes GLIBC_TUNABLES=glibc.pthread.rseq=0 in the process's environment (from the next "
                   "start), and, where it is linked from a static library that leaves out the constructor that "
                   "turns them on (the tcmalloc-better crate's does), a call of "
                   "TCMalloc_Internal_ForceCpuCacheActivation() at start; each CPU then keeps a slab of free "
                   "objects of its own.")
    return out
