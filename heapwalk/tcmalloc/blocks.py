"""tcmalloc's objects as the leak scan takes them (`view.Blocks`): every object of every span in use that is
on no free list (its span's own, a thread cache's, a transfer cache's batch), and every span in use for one
allocation (large, or sampled).

Every span is tcmalloc's heap (scanned only inside the objects), free spans included; its metadata (Spans,
thread caches, page map) is its private memory, never a root.  A class whose caches'
lists are damaged, or a span whose own list is, cannot say which of its objects are free: those spans are
scanned as unknown memory (a root, never judged), never as leaks.

The objects are found with a byte a slot of every span cut into objects (`Slots`): the spans' own lists and the
caches' objects mark theirs, and the slots left unmarked are the program's, made into addresses a million at a
time; no array of every slot's address is made."""

from __future__ import annotations

import numpy as np

from heapwalk.common.findings import Finding
from heapwalk.inferior.slots import ENDED, SlotMarks, slot_lists
from heapwalk.common.view import Blocks
from heapwalk.inferior.memory import Memory, ReadError, read_once
from heapwalk.inferior.ownmemory import give_back
from heapwalk.inferior.ranges import merged, merged_arrays
from heapwalk.inferior.window import near_windows
from heapwalk.tcmalloc.decode import TcState
from heapwalk.tcmalloc.objects import Cached, SpanTable, cached_objects, span_list

__all__ = ["tcmalloc_blocks", "on_span_lists", "Slots"]


class Slots(SlotMarks):
    """A byte for each object slot of the spans ROWS of TABLE (ascending), as `slots.SlotMarks`."""

    def __init__(self, table: SpanTable, rows: np.ndarray):
        super().__init__(table.start[rows], table.size[rows], table.count[rows])
        self.table, self.rows = table, rows


def walk_spans(mem: Memory, slots: Slots, findings: list[Finding]) -> list[int]:
    """Walks the own list of each span of SLOTS, marking its free slots, a window of spans at a time in one
    call (`slots.slot_lists`); the rows whose list is damaged (every slot of theirs marked).  A span whose list
    does not end as its counts say is walked again alone (`objects.span_list`), which says what is wrong."""
    table, rows, damaged = slots.table, slots.rows, []
    count, refcount = table.count[rows], table.refcount[rows]
    heads = np.where(count != refcount, table.objects[rows], np.uint64(0))   # every object out: the list is empty
    expected = count - refcount
    starts, lengths = table.start[rows].tolist(), (table.count[rows] * table.size[rows]).tolist()
    for k, j, base, data in near_windows(mem, starts, lengths):
        found, stops, _ = slot_lists(data, base, table.start[rows[k:j]], table.size[rows[k:j]], count[k:j],
                                     heads[k:j], slots.offsets[k:j], slots.marks)
        odd = np.flatnonzero((stops != ENDED) | (found != expected[k:j]) | ((heads[k:j] == 0) & (expected[k:j] > 0)))
        for i in (odd + k).tolist():
            row = int(rows[i])
            span = slots.of(i)
            span[:] = 0
            if span_list(table, row, _bytes_of(mem, table, row), span, findings) is None:
                damaged.append(row)
                span[:] = 1
    return damaged


def _bytes_of(mem: Memory, table: SpanTable, row: int) -> bytes | None:
    """The bytes of span ROW's objects, None when they cannot be read."""
    try:
        return read_once(mem, int(table.start[row]), int(table.count[row] * table.size[row]))
    except ReadError:
        return None


def on_span_lists(mem: Memory, table: SpanTable, rows: np.ndarray, addresses: np.ndarray,
                  findings: list[Finding]) -> np.ndarray:
    """Walks the own list of each span ROWS (`walk_spans`, findings where damaged) and says which of ADDRESSES is
    an object on one of those lists (a mask; a damaged span's list holds none)."""
    slots = Slots(table, np.asarray(rows, dtype=np.int64))
    for row in walk_spans(mem, slots, findings):
        slots.of(int(np.searchsorted(slots.rows, row)))[:] = 0
    return slots.marked(addresses)


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
    slots = Slots(table, small[~doubtful])
    damaged = walk_spans(mem, slots, findings)
    slots.mark(cached.address)
    unknown = np.sort(np.concatenate([small[doubtful], np.array(damaged, dtype=np.int64)]).astype(np.int64))
    large = table.large()
    give_back()                       # the walks' holes, before the blocks' arrays are written
    made = slots.blocks(np.zeros(len(slots.rows), dtype=np.uint8),
                        (table.start[large], table.end[large] - table.start[large], np.zeros(len(large), dtype=np.uint8)))
    del slots
    heaps = merged_arrays(table.start, table.end)
    holes = merged((int(table.start[r]), int(table.end[r])) for r in unknown.tolist())
    arena = (np.zeros(1 if len(made.starts) else 0, dtype=np.int32), made.tags)     # one arena
    return Blocks(made.starts, made.ends, arena, 0, 0, heaps=tuple(heaps), private=tuple(merged(private)),
                  unknown=tuple(holes), lengths=made.lengths), findings
