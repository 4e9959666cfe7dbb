"""mimalloc's own 'heapwalk chunk ADDRESS': the segment, page and block holding an address, whether the program
holds the block or it is free (and on which list: the page's free, local-free or thread-free list, or its heap's
delayed-free list), or not cut yet; for a block the program holds, what reaches it.  And 'heapwalk bins': each
block size's pages, blocks in use and free.  They print through the front end they are given, and need no gdb."""

from __future__ import annotations

import bisect
import json
from collections import defaultdict

from rich.table import Table

from heapwalk.face import NotMine, Verb, chunk_arguments, show_chunk
from heapwalk.analysis.report import human
from heapwalk.common.errors import UsageError
from heapwalk.mimalloc.lists import list_of
from heapwalk.output.consoles import box_for

__all__ = ["VERBS", "locate", "bin_rows"]


def locate(heap, address: int) -> dict | None:
    """What holds ADDRESS in HEAP's live segments, as a document (None: no segment holds it)."""
    segments = sorted(heap.state.live(), key=lambda s: s.address)
    i = bisect.bisect_right([s.address for s in segments], address) - 1
    if i < 0 or address >= segments[i].address + segments[i].reserved:
        return _in_arena(heap, address)
    seg = segments[i]
    owner = heap.by_tcb.get(seg.thread_id)
    doc = {"segment": seg.address, "segment_bytes": seg.reserved, "huge": seg.huge, "unit": _unit(heap),
           "owner": "no thread (a huge block any thread frees)" if heap.state.unowned(seg) else
           heap.state.abandoned_owner if not seg.thread_id else
           f"thread {owner.number}" if owner else
           "mimalloc's own data (its theaps and thread data)" if any(h.meta and h.thread_id == seg.thread_id
                                                                     for h in heap.state.heaps) else
           f"the thread at {seg.thread_id:#x}"}
    if address < seg.address + seg.info_slices * 65536:
        return {**doc, "kind": "header", "use": "the segment's header (its slices' table)"}
    for sp in seg.spans:
        if seg.address + sp.index * 65536 <= address < seg.address + (sp.index + sp.slices) * 65536:
            return {**doc, "kind": "free span", "use": f"a free span of {sp.slices} slices"}
    page = next((p for p in seg.pages if seg.address + p.index * 65536 <= address < p.end), None)
    if page is None:
        return {**doc, "kind": "rounding", "use": "past the segment's slices: the system's rounding"}
    doc.update(page=page.address, block_size=page.block_size, page_start=page.start, capacity=page.cut)
    index = (address - page.start) // page.block_size if address >= page.start else -1
    if index < 0 or index >= page.room:
        return {**doc, "kind": "rounding", "use": "in the page, outside its blocks (rounding)"}
    block = page.start + index * page.block_size
    doc.update(block=block, index=index)
    if index >= page.cut:
        return {**doc, "kind": "block", "use": "not cut yet (reserved by its page)"}
    if page.damaged:
        return {**doc, "kind": "block", "use": "not known: its page's lists are damaged (see 'heapwalk check')"}
    where = list_of(heap.mem, page, block)
    return {**doc, "kind": "block", "use": "in use" if where is None else f"free, on its page's {where} list"
            if where != "delayed" else "free, on its heap's delayed-free list"}


def _unit(heap) -> str:
    """What mimalloc's memory comes in: segments, or (mimalloc 3) pages."""
    return heap.state.unit


def _in_arena(heap, address: int) -> dict | None:
    """What ADDRESS is in an arena outside its units (a free slice, or the arena's own), when the family can say."""
    return heap.state.in_arena(address)


def _text(address: int, where: dict) -> str:
    if "arena" in where:
        return f"{address:#x}: {where['use']}"
    extra = ", from the system" if where["unit"] == "page" else ", huge"
    seg = (f"{where['unit']} {where['segment']:#x} ({human(where['segment_bytes'])}"
           f"{extra if where['huge'] else ''}, {where['owner']})")
    if where["kind"] != "block":
        return f"{address:#x}: {where['use']}\n  {seg}"
    if where["unit"] == "page":
        return (f"{address:#x}: block {where['block']:#x} of {where['block_size']} bytes, number {where['index']} of "
                f"its page's {where['capacity']}: {where['use']}\n  {seg}, blocks from {where['page_start']:#x}")
    return (f"{address:#x}: block {where['block']:#x} of {where['block_size']} bytes, number {where['index']} of its "
            f"page's {where['capacity']}: {where['use']}\n  page {where['page']:#x} (blocks from "
            f"{where['page_start']:#x}) in {seg}")


def _chunk(heap, args, front) -> None:
    address = front.evaluate(args.address)
    where = locate(heap, address)
    if where is None:
        raise NotMine(f"heapwalk chunk: {address:#x} is in no {_unit(heap)} of mimalloc's")
    held = where.get("block") if where.get("use") == "in use" else None
    show_chunk(front, heap, args, address, where, _text(address, where), held, "mimalloc")


def bin_rows(state) -> list[dict]:
    """Each block size: its pages, blocks cut, in use and free (on lists), bytes in use and free, most free first."""
    rows: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for page in state.pages():
        row = rows[page.block_size]
        row[0] += 1
        row[1] += page.cut
        row[2] += page.in_use
        row[3] += page.free_cut
    out = [{"size": size, "pages": p, "blocks": c, "in_use": u, "free": f, "in_use_bytes": u * size,
            "free_bytes": f * size} for size, (p, c, u, f) in rows.items()]
    return sorted(out, key=lambda r: (-r["free_bytes"], r["size"]))


def _bins_arguments(p) -> None:
    p.add_argument("kind", nargs="?", help="(glibc's kinds of free lists; mimalloc's are by block size)")
    p.add_argument("--arena", metavar="N", help="(glibc's and jemalloc's)")
    p.add_argument("--chunks", action="store_true", help="(glibc's)")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON (schema: docs/json.md)")


def _bins(heap, args, front) -> None:
    if args.kind or args.chunks or args.arena:
        raise UsageError("heapwalk bins: KIND, --arena and --chunks are glibc's; mimalloc's pages are by block size "
                         "(heapwalk bins)")
    rows = bin_rows(heap.state)
    table = Table(title=f"mimalloc pages by block size ({len(rows)})", box=box_for(front.interactive),
                  title_justify="left")
    for name in ("block size", "pages", "blocks", "in use", "free", "bytes in use", "free bytes"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(str(r["size"]), str(r["pages"]), str(r["blocks"]), str(r["in_use"]), str(r["free"]),
                      human(r["in_use_bytes"]), human(r["free_bytes"]))
    front.console_with_header(heap).print(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"allocator": "mimalloc", "sizes": rows}, fh, indent=1)


VERBS = (
    Verb("bins", "each block size: pages, blocks in use and free",
         "Show each block size of mimalloc's pages, those with the most free bytes first: its pages, the blocks "
         "they have cut, those the program holds and those free on the pages' lists, and their bytes.",
         _bins_arguments, _bins, accepts=lambda args: not (args.kind or args.chunks or args.arena)),
    Verb("chunk", "the block holding an address: its segment, page, and whether it is in use or free",
         "Describe what holds ADDRESS in mimalloc's segments: its segment (its size and owner, or abandoned), and "
         "in a page the block (its size and number) and whether the program holds it, it is free (on its page's "
         "free, local-free or thread-free list, or its heap's delayed-free list) or not cut yet; else the segment's "
         "header, a free span, or rounding. For a block the program holds, whether anything still points to it "
         "(one path from a root, or leaked: see 'heapwalk leaks').", chunk_arguments, _chunk),
)
