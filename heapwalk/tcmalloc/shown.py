"""tcmalloc's tables: the thread caches as 'heapwalk threads' shows them (each cache with the thread it belongs
to), and the page heap's free spans by length as the report shows them."""

from __future__ import annotations

import numpy as np
from rich.table import Table

from heapwalk.analysis.report import human
from heapwalk.tcmalloc.decode import IN_USE, NORMAL, RETURNED, TcState
from heapwalk.tcmalloc.spans import columns

__all__ = ["threads_table", "threads_document", "free_spans", "free_spans_table", "class_rows", "classes_table"]


def threads_table(state: TcState, owners: dict, box) -> Table:
    """One row per thread cache: its thread (gdb's number, LWP, name; "-" when no thread of the target is
    found to own it), where it is, the bytes and objects it holds, its limit."""
    table = Table(title=f"tcmalloc thread caches ({len(state.threads)})", box=box, title_justify="left")
    for name in ("thread", "lwp", "name", "cache", "holds", "objects", "limit"):
        table.add_column(name, justify="left" if name in ("name", "cache") else "right", no_wrap=True)
    for t in state.threads:
        owner = owners.get(t.address)
        table.add_row(*((str(owner.number), str(owner.lwp), owner.name or "-") if owner else ("-", "-", "-")),
                      f"{t.address:#x}", human(t.size), str(t.objects), human(t.max_size))
    return table


def threads_document(state: TcState, owners: dict) -> list[dict]:
    """The thread caches as JSON: address, tid (the cache's own pthread_t, null from 2.16), the owner's gdb
    number, LWP and name (null when not found), bytes, objects, max_size."""
    out = []
    for t in state.threads:
        owner = owners.get(t.address)
        out.append({"address": t.address, "tid": t.tid, "thread": owner.number if owner else None,
                    "lwp": owner.lwp if owner else None, "name": owner.name if owner else None, "bytes": t.size,
                    "objects": t.objects, "max_size": t.max_size,
                    "classes": [{"class": k, "objects": n} for k, _, n in t.lists]})
    return out


def class_rows(state: TcState) -> list[dict]:
    """Each size class that has spans or cached objects: its size and pages per span, its spans (and their pages)
    and the objects
    they are cut into, the objects the program holds (taken out of the spans, less those the caches hold), the
    free ones in its spans (its central list), its transfer cache and the thread caches, the share of its
    objects in use, its free bytes (free objects and what its spans lose to rounding), and those of its central
    list (the free objects in its spans and the rounding: its share of central_cache_free_bytes)."""
    page = state.page_size
    sizes = {c.index: c.size for c in state.classes if c.index and c.size > 0}
    spans = _class_spans(state)
    out = []
    for c in state.classes:
        if c.index not in sizes:
            continue
        count, pages, objects, taken = spans.get(c.index, (0, 0, 0, 0))
        transfer, thread = c.move * c.transfer_batches, c.thread_objects
        if not (count or transfer or thread):
            continue
        in_use = max(taken - transfer - thread, 0)
        free = max(objects - in_use, 0)
        out.append({"class": c.index, "size": c.size, "pages": c.pages, "spans": count, "span_pages": pages,
                    "objects": objects,
                    "in_use": in_use, "central": max(objects - taken, 0), "transfer": transfer, "thread": thread,
                    "utilization": round(in_use / objects, 4) if objects else 0.0,
                    "free_bytes": free * c.size + pages * page - objects * c.size,
                    "central_bytes": max(objects - taken, 0) * c.size + pages * page - objects * c.size})
    return out


def classes_table(rows: list[dict], box) -> Table:
    """`class_rows` as a table, the classes with the most free bytes first."""
    table = Table(title="tcmalloc size classes", box=box, title_justify="left")
    for name in ("class", "size", "spans", "objects", "in use", "used", "free in spans", "transfer", "thread caches",
                 "free bytes"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in sorted(rows, key=lambda r: -r["free_bytes"]):
        table.add_row(str(r["class"]), human(r["size"]), str(r["spans"]), str(r["objects"]), str(r["in_use"]),
                      f"{100 * r['utilization']:.0f}%", str(r["central"]), str(r["transfer"]), str(r["thread"]),
                      human(r["free_bytes"]))
    return table


def _class_spans(state: TcState) -> dict[int, list[int]]:
    """For each size class with spans in use (not sampled): [spans, pages, objects, taken out]."""
    s, size_of = columns(state.spans), state.class_sizes()
    klass = s.size_class.astype(np.int64)
    use = (s.location == IN_USE) & ~s.sampled & (size_of[klass] > 0)
    klass, pages = klass[use], s.pages[use].astype(np.int64)
    sums = np.zeros((4, 256), dtype=np.int64)
    for row, values in enumerate((np.ones(len(klass), dtype=np.int64), pages,
                                  pages * state.page_size // size_of[klass], s.refcount[use].astype(np.int64))):
        np.add.at(sums[row], klass, values)
    return {int(k): sums[:, k].tolist() for k in np.flatnonzero(sums[0])}


def free_spans(state: TcState) -> list[dict]:
    """The page heap's free spans by length, as its own statistics group them: one row per length up to its
    longest list's (kMaxPages), then the large spans together (pages: null): for each, the normal spans (free,
    resident until released) and the returned ones, how many, their bytes, and the normal ones' bytes in RAM
    (null: unknown)."""
    largest = state.discovery.max_pages
    rows: dict = {}
    for s in state.spans:
        if s.location in (NORMAL, RETURNED):
            key = s.pages if s.pages <= largest else None
            rows.setdefault(key, {NORMAL: [], RETURNED: []})[s.location].append(s)
    page = state.page_size
    out = []
    for key in sorted(rows, key=lambda k: (k is None, k or 0)):
        normal, returned = rows[key][NORMAL], rows[key][RETURNED]
        resident = None
        if state.residency is not None and normal:
            resident = state.residency.resident_sum([s.page * page for s in normal],
                                                    [(s.page + s.pages) * page for s in normal])
        out.append({"pages": key, "normal_spans": len(normal), "normal_bytes": sum(s.pages for s in normal) * page,
                    "normal_resident": resident if normal else 0, "returned_spans": len(returned),
                    "returned_bytes": sum(s.pages for s in returned) * page})
    return out


def free_spans_table(rows: list[dict], largest: int, box) -> Table | None:
    """`free_spans`' rows as a table (None when the page heap has no free span)."""
    if not rows:
        return None
    table = Table(title="tcmalloc page heap: free spans by length", box=box, title_justify="left")
    for name in ("pages", "free spans", "bytes", "in RAM", "returned spans", "returned bytes"):
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(str(r["pages"]) if r["pages"] is not None else f"> {largest} (large)", str(r["normal_spans"]),
                      human(r["normal_bytes"]), "-" if r["normal_resident"] is None else human(r["normal_resident"]),
                      str(r["returned_spans"]), human(r["returned_bytes"]))
    return table
