"""tcmalloc's tables: the thread caches as 'heapwalk threads' shows them (each cache with the thread it belongs
to), and the page heap's free spans by length as the report shows them."""

from __future__ import annotations

from rich.table import Table

from heapwalk.analysis.report import human
from heapwalk.tcmalloc.decode import NORMAL, RETURNED, TcState

__all__ = ["threads_table", "threads_document", "free_spans", "free_spans_table"]


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
                    "objects": t.objects, "max_size": t.max_size})
    return out


def free_spans(state: TcState) -> list[dict]:
    """The page heap's free spans by length, as its own statistics group them: one row per length below its
    largest list (kMaxPages), then the large spans together (pages: null): for each, the normal spans (free,
    resident until released) and the returned ones, how many, their bytes, and the normal ones' bytes in RAM
    (null: unknown)."""
    largest = state.discovery.max_pages
    rows: dict = {}
    for s in state.spans:
        if s.location in (NORMAL, RETURNED):
            key = s.pages if s.pages < largest else None
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
        table.add_row(str(r["pages"]) if r["pages"] is not None else f">= {largest} (large)", str(r["normal_spans"]),
                      human(r["normal_bytes"]), "-" if r["normal_resident"] is None else human(r["normal_resident"]),
                      str(r["returned_spans"]), human(r["returned_bytes"]))
    return table
