"""tcmalloc's own 'heapwalk bins' (each size class: its spans, the objects the program holds, the free ones in
its spans, its transfer cache and the thread caches, and the share in use) and 'heapwalk chunk ADDRESS': the
span holding an address (where, how many pages, its state, the
Span that describes it), and in a span cut into objects the object (its class, size and index) and whether the
program holds it or it is free, and where (a thread's cache, a transfer cache, its span's own list); for an
object the program holds, what reaches it.  It prints through the front end it is given, and needs no gdb."""

from __future__ import annotations

import json

import numpy as np

from heapwalk.face import NotMine, Verb, chunk_arguments, show_chunk
from heapwalk.analysis.report import human
from heapwalk.common.errors import UsageError
from heapwalk.output.consoles import box_for
from heapwalk.tcmalloc.decode import IN_USE, NORMAL
from heapwalk.tcmalloc.objects import THREAD, TRANSFER, span_free_objects
from heapwalk.tcmalloc.shown import class_rows, classes_table

__all__ = ["VERBS", "locate"]


def locate(heap, address: int) -> dict | None:
    """What holds ADDRESS in HEAP's spans, as a document (None: no span holds it)."""
    table, cached = heap.span_table, heap.cached[0]
    row = int(table.rows(np.array([address], dtype=np.uint64))[0])
    if row < 0:
        return None
    start, end = int(table.start[row]), int(table.end[row])
    location = int(table.location[row])
    span = {"start": start, "end": end, "pages": (end - start) // heap.state.page_size,
            "state": "in use" if location == IN_USE else "free" if location == NORMAL else "returned",
            "header": int(table.header[row]), "size_class": int(table.size_class[row])}
    if location != IN_USE:
        return {"kind": "free span", "span": span, "use": span["state"]}
    size = int(table.size[row])
    if not size:
        return {"kind": "large", "span": span, "allocation": start, "size": end - start, "use": "in use",
                "sampled": heap.state.spans[row].sampled}
    index = (address - start) // size
    if index >= int(table.count[row]):
        return {"kind": "rounding", "span": span, "use": "lost to rounding (no object)"}
    obj = start + index * size
    hit = np.flatnonzero(cached.address == np.uint64(obj))
    doc = {"kind": "object", "span": span, "object": obj, "size": size, "index": int(index),
           "objects": int(table.count[row])}
    if len(hit):
        i = int(hit[0])
        if int(cached.place[i]) == THREAD:
            t = heap.state.threads[int(cached.owner[i])]
            owner = heap.owners.get(t.address)
            who = f"thread {owner.number}" if owner is not None else f"the cache at {t.address:#x}"
            return {**doc, "use": f"free, in {who}'s cache", "cache": t.address}
        if int(cached.place[i]) == TRANSFER:
            return {**doc, "use": "free, in the transfer cache"}
    free = span_free_objects(heap.mem, table, row, [])
    if free is None:
        return {**doc, "use": "not known: its span's free list is damaged (see 'heapwalk check')"}
    if int(table.size_class[row]) in cached.broken:
        return {**doc, "use": "not known: its class's cache lists are damaged (see 'heapwalk check')"}
    if obj in set(free.tolist()):
        return {**doc, "use": "free, on its span's list (central cache)"}
    return {**doc, "use": "in use"}


def _text(address: int, where: dict) -> str:
    span = where["span"]
    pages = f"{span['pages']} page{'s' if span['pages'] != 1 else ''}"
    line = (f"span {span['start']:#x}-{span['end']:#x} ({pages}, {human(span['end'] - span['start'])}, "
            f"{span['state']}{', class ' + str(span['size_class']) if span['size_class'] else ''}; "
            f"its Span at {span['header']:#x})")
    if where["kind"] == "object":
        head = (f"{address:#x}: object {where['object']:#x} of {where['size']} bytes (class {span['size_class']}), "
                f"number {where['index']} of the span's {where['objects']}: {where['use']}")
    elif where["kind"] == "large":
        head = (f"{address:#x}: {'a sampled' if where['sampled'] else 'a large'} allocation {where['allocation']:#x} "
                f"of {human(where['size'])}: in use")
    elif where["kind"] == "rounding":
        head = f"{address:#x}: past the span's last object: its pages' rest, lost to rounding"
    else:
        head = f"{address:#x}: in a {where['use']} span of the page heap"
    return f"{head}\n  {line}"


def _bins_arguments(p) -> None:
    p.add_argument("kind", nargs="?", help="(glibc's kinds of free lists; tcmalloc's are by size class)")
    p.add_argument("--arena", metavar="N", help="(glibc's and jemalloc's: tcmalloc has one page heap)")
    p.add_argument("--chunks", action="store_true", help="(glibc's)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON (schema: docs/json.md)")


def _bins(heap, args, front) -> None:
    if args.kind or args.chunks or args.arena:
        raise UsageError("heapwalk bins: KIND, --arena and --chunks are glibc's; tcmalloc's free lists are by size "
                         "class (heapwalk bins)")
    rows = class_rows(heap.state)
    console = front.console_with_header(heap)
    console.print(classes_table(rows, box_for(front.interactive)))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"allocator": "tcmalloc", "classes": rows}, fh, indent=1)


def _chunk(heap, args, front) -> None:
    address = front.evaluate(args.address)
    where = locate(heap, address)
    if where is None:
        raise NotMine(f"heapwalk chunk: {address:#x} is in no span of tcmalloc's")
    held = where.get("allocation") if where["kind"] == "large" else \
        where.get("object") if where.get("use") == "in use" else None
    show_chunk(front, heap, args, address, where, _text(address, where), held, "tcmalloc")


VERBS = (
    Verb("bins", "each size class: spans, objects in use and free where",
         "Show each size class of tcmalloc that holds anything, those with the most free bytes first: its object "
         "size, its spans and the objects they are cut into, the objects the program holds, the free ones in its "
         "spans (its central list), its transfer cache and the thread caches, the share of its objects in use, "
         "and its free bytes (free objects and what its spans lose to rounding).", _bins_arguments, _bins,
         accepts=lambda args: not (args.kind or args.chunks or args.arena)),
    Verb("chunk", "the object holding an address: its span, class, and whether it is in use, free, or cached",
         "Describe what holds ADDRESS in tcmalloc's page heap: its span (where, how many pages, in use, free or "
         "returned, and its Span), and in a span cut into objects the object (its class, size and number) and "
         "whether the program holds it or it is free in a thread's cache, a transfer cache or its span's own list; "
         "in a large span, the allocation. For an object the program holds, whether anything still points to it "
         "(one path from a root, or leaked: see 'heapwalk leaks').", chunk_arguments, _chunk),
)
