"""Google's tcmalloc's own 'heapwalk bins' (each size class: its spans, the objects in use, the free ones by where
they wait) and 'heapwalk chunk ADDRESS': the live span holding an address (where, its pages, its size class, its
Span) and, in a span cut into objects, the object (its class, size and number) and its place: held by the
program, free on its span's own list, in a transfer cache, a CPU's slab or a thread cache, or a sampled
allocation's proxy; for what the program holds, what reaches it.  It prints through the front end it is given,
and needs no gdb."""

from __future__ import annotations

import json

import numpy as np
from rich.table import Table

from heapwalk.analysis.report import human
from heapwalk.common.errors import UsageError
from heapwalk.face import NotMine, Verb, chunk_arguments, show_chunk
from heapwalk.gtcmalloc.layout import PAGE
from heapwalk.gtcmalloc.objects import IN_USE, PLACES, PROXY
from heapwalk.output.consoles import box_for

__all__ = ["VERBS", "locate"]


def locate(heap, address: int) -> dict | None:
    """What holds ADDRESS among HEAP's live spans, as a document (None: no live span holds it)."""
    spans = heap.state.spans
    if spans is None:
        return None
    starts = (spans.first_page * np.uint64(PAGE)).astype(np.uint64)
    ends = starts + spans.pages * np.uint64(PAGE)
    hit = np.nonzero((starts <= np.uint64(address)) & (np.uint64(address) < ends))[0]
    if not len(hit):
        return None
    row = int(hit[0])
    start, end = int(starts[row]), int(ends[row])
    span = {"start": start, "end": end, "pages": int(spans.pages[row]), "size_class": int(spans.size_class[row]),
            "header": int(spans.address[row])}
    if not spans.size_class[row] or spans.sampled[row]:
        return {"kind": "large", "span": span, "allocation": start, "size": end - start, "use": "in use",
                "sampled": bool(spans.sampled[row])}
    o = heap.objects
    k = int(o.span_of(np.array([address], dtype=np.uint64))[0])
    if k < 0:
        return {"kind": "rounding", "span": span, "use": "lost to rounding (no object)"}
    size, index = int(o.size[k]), (address - start) // int(o.size[k])
    doc = {"kind": "object", "span": span, "object": start + index * size, "size": size, "index": int(index),
           "objects": int(o.count[k])}
    if int(o.size_class[k]) in o.broken:
        return {**doc, "use": "not known: its class's free objects could not all be placed (see 'heapwalk check')"}
    place = int(o.place[int(o.first[k]) + index])
    return {**doc, "use": "in use" if place == IN_USE else f"free, {PLACES[place]}" if place != PROXY else
            "tcmalloc's own: a sampled allocation's proxy (counted in use)"}


def _text(address: int, where: dict) -> str:
    span = where["span"]
    pages = f"{span['pages']} page{'s' if span['pages'] != 1 else ''}"
    line = (f"span {span['start']:#x}-{span['end']:#x} ({pages}, {human(span['end'] - span['start'])}"
            f"{', class ' + str(span['size_class']) if span['size_class'] else ''}; its Span at {span['header']:#x})")
    if where["kind"] == "object":
        head = (f"{address:#x}: object {where['object']:#x} of {where['size']} bytes (class {span['size_class']}), "
                f"number {where['index']} of the span's {where['objects']}: {where['use']}")
    elif where["kind"] == "large":
        head = (f"{address:#x}: {'a sampled' if where['sampled'] else 'a large'} allocation {where['allocation']:#x} "
                f"of {human(where['size'])}: in use")
    else:
        head = f"{address:#x}: past the span's last object: its pages' rest, lost to rounding"
    return f"{head}\n  {line}"


def _chunk(heap, args, front) -> None:
    address = front.evaluate(args.address)
    where = locate(heap, address)
    if where is None:
        raise NotMine(f"heapwalk chunk: {address:#x} is in no live span of Google's tcmalloc")
    held = where.get("allocation") if where["kind"] == "large" else \
        where.get("object") if where.get("use") == "in use" else None
    show_chunk(front, heap, args, address, where, _text(address, where), held, "gtcmalloc")


def class_rows(heap) -> list[dict]:
    """Each size class with spans: its objects in use and free by place, its spans' rounding."""
    o, out = heap.objects, []
    for c in heap.state.classes:
        mine = np.nonzero(o.size_class == c.index)[0]
        if not len(mine):
            continue
        places = np.concatenate([o.place[o.first[k]:o.first[k] + o.count[k]] for k in mine.tolist()])
        counts = np.bincount(places, minlength=len(PLACES))
        pages = int(heap.state.spans.pages[o.rows[mine]].sum())
        out.append({"class": c.index, "size": c.size, "spans": len(mine), "objects": int(len(places)),
                    "in_use": int(counts[IN_USE]), "free": {PLACES[p]: int(counts[p]) for p in range(1, 5)},
                    "proxies": int(counts[PROXY]), "rounding": pages * PAGE - int(len(places)) * c.size})
    return sorted(out, key=lambda r: -(sum(r["free"].values()) * r["size"] + r["rounding"]))


def _bins_arguments(p) -> None:
    p.add_argument("kind", nargs="?", help="(glibc's kinds of free lists; tcmalloc's are by size class)")
    p.add_argument("--arena", metavar="N", help="(glibc's and jemalloc's: tcmalloc has one page allocator)")
    p.add_argument("--chunks", action="store_true", help="(glibc's)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON (schema: docs/json.md)")


def _bins(heap, args, front) -> None:
    if args.kind or args.chunks or args.arena:
        raise UsageError("heapwalk bins: KIND, --arena and --chunks are glibc's; Google's tcmalloc's free objects are "
                         "by size class (heapwalk bins)")
    rows = class_rows(heap)
    table = Table(title="size classes, most free bytes first", box=box_for(front.interactive), title_justify="left")
    for name in ("class", "size", "spans", "objects", "in use", "central", "transfer", "per-CPU", "thread",
                 "free bytes"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        f = list(r["free"].values())
        table.add_row(str(r["class"]), human(r["size"]), str(r["spans"]), str(r["objects"]), str(r["in_use"]),
                      *map(str, f), human(sum(f) * r["size"] + r["rounding"]))
    front.console_with_header(heap).print(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"allocator": "gtcmalloc", "classes": rows}, fh, indent=1)


VERBS = (
    Verb("bins", "each size class: spans, objects in use and free where",
         "Show each size class of Google's tcmalloc that has spans, those with the most free bytes first: its object "
         "size, its spans and the objects they are cut into, the objects the program holds, the free ones on their "
         "spans' own lists (the central free list), in its transfer cache, in the CPUs' slabs and in thread caches, "
         "and its free bytes (free objects and what its spans lose to rounding).", _bins_arguments, _bins,
         accepts=lambda args: not (args.kind or args.chunks or args.arena)),
    Verb("chunk", "the object holding an address: its span, class, and whether it is in use, free, or cached",
         "Describe what holds ADDRESS in Google's tcmalloc's page heaps: its live span (where, how many pages, its "
         "size class and its Span), and in a span cut into objects the object (its class, size and number) and "
         "whether the program holds it or it is free on its span's own list, in a transfer cache, a CPU's slab or "
         "a thread cache, or stands in for a sampled allocation; in a span of one allocation, the allocation. For "
         "what the program holds, whether anything still points to it (one path from a root, or leaked: see "
         "'heapwalk leaks').", chunk_arguments, _chunk),
)
