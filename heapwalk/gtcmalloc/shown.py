"""Google's tcmalloc's own tables and JSON: its size classes (where each one's free objects wait), its CPUs' slabs,
its thread caches, its page heaps."""

from __future__ import annotations

from rich.table import Table

from heapwalk.analysis.report import human
from heapwalk.gtcmalloc.decode import GtcState

__all__ = ["classes_table", "heaps_table", "cpus_table", "threads_table", "state_document"]


def classes_table(state: GtcState, box) -> Table:
    """The size classes holding free objects: where they wait, and the spans of the class."""
    table = Table(title="free objects by size class", box=box, title_justify="left")
    for name in ("class", "size", "spans", "central", "transfer", "per-CPU", "free bytes"):
        table.add_column(name, justify="right", no_wrap=True)
    for c in state.classes:
        objects = c.central_objects + c.transfer_objects + c.cpu_objects
        if objects:
            table.add_row(str(c.index), human(c.size), str(c.spans), str(c.central_objects), str(c.transfer_objects),
                          str(c.cpu_objects), human(objects * c.size))
    return table


def heaps_table(state: GtcState, box) -> Table:
    """The page allocator's huge-page-aware allocators: what each took from the system and where it is."""
    table = Table(title="page heaps (huge-page-aware allocators)", box=box, title_justify="left")
    for name in ("heap", "from the system", "free", "unmapped", "filler hugepages", "pages used", "cached hugepages",
                 "regions"):
        table.add_column(name, justify="right" if name != "heap" else "left", no_wrap=True)
    for h in state.heaps:
        table.add_row(h.name, human(h.system), human(h.free), human(h.unmapped), str(h.filler_hugepages),
                      str(h.filler_used_pages), str(h.cached_hugepages), str(h.regions))
    return table


def cpus_table(state: GtcState, box) -> Table:
    """Each populated CPU's slab."""
    table = Table(title=f"per-CPU caches ({state.cpu_count} CPUs, slabs of {human(1 << state.shift)})", box=box,
                  title_justify="left")
    for name in ("CPU", "slab", "objects", "bytes"):
        table.add_column(name, justify="right", no_wrap=True)
    for s in state.cpus:
        table.add_row(str(s.cpu), f"{s.address:#x}", str(s.objects), human(s.bytes))
    return table


def threads_table(state: GtcState, box) -> Table:
    """Each thread cache and the thread whose TLS points at it."""
    table = Table(title="thread caches", box=box, title_justify="left")
    for name in ("cache", "thread (pthread_t)", "LWP", "bytes"):
        table.add_column(name, justify="right", no_wrap=True)
    for t in state.threads:
        table.add_row(f"{t.address:#x}", f"{t.thread:#x}", str(t.lwp) if t.lwp else "-", human(t.bytes))
    return table


def state_document(state: GtcState) -> dict:
    """The JSON of everything decoded, under its own names."""
    loc = state.located
    return {"layout": loc.layout.name, "library": state.library,
            "found": {"transfer_caches": loc.transfer, "page_allocator": loc.page_allocator,
                      "cpu_cache": loc.cpu_cache, "sharded_transfer_caches": loc.sharded},
            "properties": state.properties(), "per_cpu_caches_active": state.per_cpu,
            "cpus": {"count": state.cpu_count, "slab_bytes": (1 << state.shift) if state.per_cpu else 0,
                     "slabs": [{"cpu": s.cpu, "address": s.address, "objects": s.objects, "bytes": s.bytes}
                               for s in state.cpus]},
            "threads": [{"address": t.address, "thread": t.thread, "lwp": t.lwp, "bytes": t.bytes}
                        for t in state.threads],
            "page_heaps": [{"name": h.name, "address": h.address, "system": h.system, "free": h.free,
                            "unmapped": h.unmapped, "filler_hugepages": h.filler_hugepages,
                            "filler_used_pages": h.filler_used_pages, "cached_hugepages": h.cached_hugepages,
                            "regions": h.regions} for h in state.heaps],
            "size_classes": [{"class": c.index, "size": c.size, "pages": c.pages,
                              "objects_per_span": c.objects_per_span, "spans": c.spans,
                              "central_objects": c.central_objects, "transfer_objects": c.transfer_objects,
                              "transfer_capacity": c.transfer_capacity, "cpu_objects": c.cpu_objects,
                              "overhead": c.overhead} for c in state.classes]}
