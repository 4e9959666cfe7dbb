"""jemalloc's own 'heapwalk bins' and 'heapwalk tcache': each arena's bins by size class (the regions and
slabs in use, the free room, the counts of operations), and each thread's cache (its bins, the bytes, the
arenas the cached regions came from).  They take the same arguments as glibc's commands of the same name
where those apply; glibc's own arguments (a KIND of free list, --chunks, --entries) go to glibc's commands
when its malloc is used beside.  They print through the front end they are given, and need no gdb."""

from __future__ import annotations

import json

from rich.table import Table

from heapwalk.face import NotMine, Verb, chunk_arguments, show_chunk
from heapwalk.analysis.report import human
from heapwalk.common.errors import UsageError
from heapwalk.jemalloc.region import locate_region, region_text
from heapwalk.output.consoles import box_for

__all__ = ["VERBS"]


def _bins_arguments(p) -> None:
    p.add_argument("kind", nargs="?", help="(glibc's kinds of free lists; jemalloc's bins are by size class)")
    p.add_argument("--arena", metavar="N", help="only arena N (its index)")
    p.add_argument("--chunks", action="store_true", help="(glibc's)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON (schema: docs/json.md)")


def _arenas(heap, front, text: str | None, command: str) -> list:
    if text is None:
        return list(heap.state.arenas)
    index = front.evaluate(text)
    chosen = [a for a in heap.state.arenas if a.index == index or a.address == index]
    if not chosen:
        raise UsageError(f"heapwalk {command}: no arena {text} (see 'heapwalk arenas')")
    return chosen


def _bins(heap, args, front) -> None:
    if args.kind or args.chunks:
        raise UsageError("heapwalk bins: KIND and --chunks are glibc's free lists; jemalloc's bins are by size "
                         "class (heapwalk bins [--arena N])")
    arenas = _arenas(heap, front, args.arena, "bins")
    console = front.console_with_header(heap)
    for a in arenas:
        console.print(_bins_table(a, front.interactive))
    if args.json:
        doc = {"allocator": "jemalloc", "arenas": [{"index": a.index, "address": a.address,
                                                    "bins": [_bin(b) for b in a.bins if b.nmalloc or b.curslabs]}
                                                   for a in arenas]}
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)


def _bin(b) -> dict:
    return {"size": b.size, "nregs": b.nregs, "slab_pages": b.slab_pages, "curregs": b.curregs,
            "curslabs": b.curslabs, "nonfull_slabs": b.nonfull_slabs, "utilization": round(b.utilization, 4),
            "free_bytes": max(0, b.curslabs * b.nregs - b.curregs) * b.size, "nmalloc": b.nmalloc,
            "ndalloc": b.ndalloc, "nrequests": b.nrequests, "nfills": b.nfills, "nflushes": b.nflushes,
            "nslabs": b.nslabs, "nreslabs": b.nreslabs}


def _bins_table(a, interactive: bool) -> Table:
    """Arena A's bins that were ever used: regions and slabs in use, the free room in its slabs, operations."""
    table = Table(title=f"jemalloc arena {a.index} bins", box=box_for(interactive), title_justify="left")
    counters = any(b.nmalloc is not None for b in a.bins)     # a build without statistics keeps none
    for name in ("size", "regions/slab", "curregs", "curslabs", "nonfull", "utilization", "free in slabs",
                 *(("nmalloc", "ndalloc", "nrequests") if counters else ())):
        table.add_column(name, justify="right", no_wrap=True)
    if not counters:
        table.caption = "counted from the slabs: this build keeps no statistics, so no counts of operations"
    for b in a.bins:
        if b.nmalloc or b.curslabs:
            free = max(0, b.curslabs * b.nregs - b.curregs) * b.size
            table.add_row(human(b.size), str(b.nregs), str(b.curregs), str(b.curslabs), str(b.nonfull_slabs),
                          f"{100 * b.utilization:.0f}%", human(free),
                          *((str(b.nmalloc), str(b.ndalloc), str(b.nrequests)) if counters else ()))
    return table


def _tcache_arguments(p) -> None:
    p.add_argument("--thread", metavar="N", type=int, help="only gdb thread number N")
    p.add_argument("--entries", action="store_true", help="(glibc's: jemalloc's caches are shown as counts)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON (schema: docs/json.md)")


def _tcache(heap, args, front) -> None:
    threads = list(heap.state.threads)
    if args.thread is not None:
        threads = [t for t in threads if t.number == args.thread]
        if not threads:
            raise UsageError(f"heapwalk tcache: no thread {args.thread} (see 'info threads')")
    console = front.console_with_header(heap)
    shown = [t for t in threads if t.tcache_arena is not None]
    for t in shown:
        console.print(_tcache_table(t, front.interactive))
    if not shown:
        console.print("no thread has a thread cache" + (f" (thread {args.thread})" if args.thread else ""))
    if args.json:
        doc = {"allocator": "jemalloc", "threads": [
            {"number": t.number, "lwp": t.lwp, "arena": t.tcache_arena, "bytes": t.tcache_bytes,
             "bins": [{"size": size, "ncached": count} for size, count in t.tcache],
             "from_arenas": [{"arena": arena, "bytes": n} for arena, n in t.tcache_origin]} for t in shown]}
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)


def _tcache_table(t, interactive: bool) -> Table:
    """Thread T's cache: each non-empty bin, and where the regions came from."""
    origins = ", ".join(f"arena {arena}: {human(n)}" for arena, n in t.tcache_origin) or "-"
    table = Table(title=f"thread {t.number} (LWP {t.lwp}) tcache of arena {t.tcache_arena}: "
                        f"{human(t.tcache_bytes)} (from {origins})", box=box_for(interactive), title_justify="left")
    for name in ("size", "cached", "bytes"):
        table.add_column(name, justify="right", no_wrap=True)
    for size, count in t.tcache:
        table.add_row(human(size), str(count), human(size * count))
    return table


def _chunk(heap, args, front) -> None:
    address = front.evaluate(args.address)
    table = heap.state.extents
    if table is None:
        raise UsageError("heapwalk chunk: jemalloc's radix tree of extents is not known, so its extents are not "
                         "(see 'heapwalk arenas --json', discovery)")
    where = locate_region(heap.mem, heap.state, address)
    if where is None:
        raise NotMine(f"heapwalk chunk: {address:#x} is in no extent of jemalloc's")
    held = where.get("allocation") if where["kind"] == "large" else \
        where.get("region") if where.get("use") == "in use" else None
    show_chunk(front, heap, args, address, where, region_text(where), held, "jemalloc")


VERBS = (
    Verb("bins", "each arena's bins by size class",
         "Show each arena's bins by size class: regions per slab, regions and slabs in use, slabs not full, "
         "the share of regions used, the free room in the slabs, and the counts of allocations, frees and "
         "requests. --arena N (its index or address) limits it to arena N.", _bins_arguments, _bins,
         accepts=lambda args: not (args.kind or args.chunks)),
    Verb("tcache", "every thread's cache",
         "Show every thread's cache (or thread N's): the arena it is registered with, each non-empty bin with "
         "its size and count, the bytes, and the arenas the cached regions came from.", _tcache_arguments,
         _tcache, accepts=lambda args: not args.entries),
    Verb("chunk", "the region holding an address: its extent, slab, arena and state, and what reaches it",
         "Describe what holds ADDRESS: its arena, its extent (where, how big, active, dirty, muzzy or "
         "retained), and in a slab its region (size class, index, start) and whether it is in use, free, or "
         "held by a thread's cache; in a large extent, the allocation. For an allocation the program holds, "
         "whether anything still points to it (one path from a root, or leaked: see 'heapwalk leaks').",
         chunk_arguments, _chunk),
)
