"""tcmalloc's thread caches as 'heapwalk threads' shows them: each cache with the thread it belongs to."""

from __future__ import annotations

from rich.table import Table

from heapwalk.analysis.report import human
from heapwalk.tcmalloc.decode import TcState

__all__ = ["threads_table", "threads_document"]


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
