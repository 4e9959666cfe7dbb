"""tcmalloc's objects as the leak scan takes them (`view.Blocks`): every object of every span in use that is
on no free list (its span's own, a thread cache's, a transfer cache's batch), and every span in use for one
allocation (large, or sampled).

Every span is tcmalloc's heap (scanned only inside the objects), free spans included; its metadata (Spans,
thread caches, page map) is its private memory, never a root.  A class whose caches'
lists are damaged, or a span whose own list is, cannot say which of its objects are free: those spans are
scanned as unknown memory (a root, never judged), never as leaks."""

from __future__ import annotations

import numpy as np

from heapwalk.common.findings import Finding
from heapwalk.inferior.memory import Memory, merged
from heapwalk.tcmalloc.decode import TcState
from heapwalk.tcmalloc.objects import Cached, SpanTable, cached_objects, span_free_objects
from heapwalk.common.view import Blocks

__all__ = ["tcmalloc_blocks", "free_in_spans"]


def free_in_spans(mem: Memory, table: SpanTable, rows, findings: list[Finding]) -> tuple[np.ndarray, list[int]]:
    """The objects on the free lists of the spans ROWS (walked), and the rows whose list is damaged."""
    parts, damaged = [], []
    for row in rows:
        if table.count[row] == table.refcount[row]:
            continue                      # every object out of the span: its list is empty
        got = span_free_objects(mem, table, int(row), findings)
        if got is None:
            damaged.append(int(row))
        else:
            parts.append(got)
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)), damaged


def _objects(table: SpanTable, rows: np.ndarray) -> np.ndarray:
    """Every object's address in the spans ROWS."""
    counts = table.count[rows]
    total = int(counts.sum())
    first = np.repeat(np.cumsum(counts) - counts, counts)
    index = (np.arange(total, dtype=np.int64) - first).astype(np.uint64)
    return np.repeat(table.start[rows], counts) + index * np.repeat(table.size[rows], counts).astype(np.uint64)


def tcmalloc_blocks(mem: Memory, state: TcState, table: SpanTable | None = None,
                    cached: tuple[Cached, list[Finding]] | None = None, private: list[tuple[int, int]] = ()
                    ) -> tuple[Blocks, list[Finding]]:
    """The objects the program holds in STATE's spans, and what the walks of the free lists found; PRIVATE:
    tcmalloc's metadata, never a root."""
    table = table if table is not None else SpanTable.of(state)
    cached, findings = cached if cached is not None else cached_objects(mem, state, table)
    findings = list(findings)
    broken = cached.broken
    small = table.small()
    doubtful = np.isin(table.size_class[small], sorted(broken)) if broken else np.zeros(len(small), dtype=bool)
    walked = small[~doubtful]
    in_spans, damaged = free_in_spans(mem, table, walked.tolist(), findings)
    unknown = np.concatenate([small[doubtful], np.array(damaged, dtype=np.int64)]).astype(np.int64)
    rows = np.setdiff1d(walked, unknown)
    slots = _objects(table, rows)
    sizes = np.repeat(table.size[rows], table.count[rows]).astype(np.uint64)
    free = np.concatenate([in_spans, cached.address])
    keep = ~np.isin(slots, free)
    large = table.large()
    starts = np.concatenate([slots[keep], table.start[large]])
    ends = np.concatenate([slots[keep] + sizes[keep], table.end[large]])
    order = np.argsort(starts, kind="stable")
    heaps = merged(zip(table.start.tolist(), table.end.tolist()))
    holes = merged((int(table.start[r]), int(table.end[r])) for r in unknown.tolist())
    return Blocks(starts[order], ends[order], np.zeros(len(order), dtype=np.int32), 0, 0, heaps=tuple(heaps),
                  private=tuple(merged(private)), unknown=tuple(holes)), findings

