"""tcmalloc's spans as the strips of a heap map (`view.HeapStrip`): the page heap's spans in address order, a
strip for each stretch of them that follows on without a gap.  A span in use cut into objects is drawn as the
bytes of its objects the program holds (then those of them the leak scan found leaked), the free objects the
thread caches, the transfer caches and its own free list hold, and what its pages lose to rounding: the bytes
are exact, their order inside the span is not.  A span in use for one allocation is in use (or leaked); a free
span is what ReleaseFreeMemory() gives back; a returned span is address space without pages."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from heapwalk.inferior.residency import Residency
from heapwalk.common.mapkinds import FREE, MAP_KINDS, MapKind, add_map_kind
from heapwalk.tcmalloc.decode import IN_USE, NORMAL, RETURNED
from heapwalk.tcmalloc.objects import THREAD, TRANSFER, Cached, SpanTable
from heapwalk.common.view import HeapStrip

__all__ = ["span_strips", "span_use"]

for _kind in (MapKind("tc_thread", "free in thread caches", "#aec7e8", "w", 131, FREE),
              MapKind("tc_transfer", "free in transfer caches", "#ffbb78", "v", 132, FREE),
              MapKind("tc_central", "free in central lists' spans", "#c49c94", "n", 133, FREE),
              MapKind("tc_rounding", "lost to rounding", "#c7c7c7", "z", 134),
              MapKind("tc_free", "free spans (resident until released)", "#f7b6d2", "p", 141, FREE, True),
              MapKind("tc_returned", "returned spans (not resident)", "#ececec", "o", 161, "", True)):
    add_map_kind(_kind)
KIND = {name: i for i, name in enumerate(MAP_KINDS)}

#: what a heap map calls the runs ReleaseFreeMemory() gives back
BAND = "ReleaseFreeMemory() gives back"


def span_use(table: SpanTable, cached: Cached) -> dict[str, np.ndarray]:
    """Each span's bytes by use: held by the program, free in thread caches, in transfer caches, on its own list,
    lost to rounding (a span not cut into objects: held when in use, else none of these)."""
    n = len(table)
    size = table.size

    def counted(place: int) -> np.ndarray:
        rows = table.rows(cached.address[cached.place == place])
        return np.bincount(rows[rows >= 0], minlength=n).astype(np.int64)[:n]

    thread, transfer = counted(THREAD), counted(TRANSFER)
    out_of_span = np.clip(table.refcount, 0, table.count)
    spans = (table.end - table.start).astype(np.int64)
    cut = size > 0
    return {"held": np.where(cut, np.clip(out_of_span - thread - transfer, 0, None) * size,
                             np.where(table.location == IN_USE, spans, 0)),
            "thread": np.where(cut, np.minimum(thread, out_of_span) * size, 0),
            "transfer": np.where(cut, np.minimum(transfer, np.clip(out_of_span - thread, 0, None)) * size, 0),
            "central": np.where(cut, (table.count - out_of_span) * size, 0),
            "rounding": np.where(cut, spans - table.count * size, 0)}


def _leaked(table: SpanTable, leaked: np.ndarray | None) -> np.ndarray:
    """Each span's bytes of the blocks at LEAKED (an object's size, or a large span's bytes)."""
    out = np.zeros(len(table), dtype=np.int64)
    if leaked is None or not len(leaked):
        return out
    rows = table.rows(np.asarray(leaked, dtype=np.uint64))
    rows = rows[rows >= 0]
    sizes = np.where(table.size[rows] > 0, table.size[rows], (table.end[rows] - table.start[rows]).astype(np.int64))
    np.add.at(out, rows, sizes)
    return out


def span_strips(table: SpanTable, cached: Cached, residency: Residency | None = None,
                leaked: np.ndarray | None = None) -> list[HeapStrip]:
    """The page heap's spans as strips, each stretch without a gap one strip; the blocks at LEAKED (the leak
    scan's, when it ran) drawn as leaked."""
    if not len(table):
        return []
    use = span_use(table, cached)
    lost = np.minimum(_leaked(table, leaked), use["held"])
    breaks = np.flatnonzero(table.start[1:] != table.end[:-1]) + 1
    bounds = zip(np.concatenate(([0], breaks)).tolist(), np.concatenate((breaks, [len(table)])).tolist())
    out = [_strip(table, np.arange(lo, hi), use, lost, f"tcmalloc spans {n + 1}") for n, (lo, hi) in enumerate(bounds)]
    if residency is None:
        return out
    known = residency.covering([(s.start, s.end) for s in out])
    return [replace(s, resident=known.within(s.start, s.end).astype(np.uint64)) for s in out]


def _strip(table: SpanTable, rows: np.ndarray, use: dict[str, np.ndarray], lost: np.ndarray, label: str
           ) -> HeapStrip:
    """The strip of the spans ROWS (following one another), each span in runs by use, in a fixed order."""
    starts, ends = table.start[rows], table.end[rows]
    whole = np.select([table.location[rows] == NORMAL, table.location[rows] == RETURNED],
                      [KIND["tc_free"], KIND["tc_returned"]], KIND["in_use"]).astype(np.uint8)
    order = (("held", None), ("lost", KIND["leaked"]), ("thread", KIND["tc_thread"]),
             ("transfer", KIND["tc_transfer"]), ("central", KIND["tc_central"]), ("rounding", KIND["tc_rounding"]))
    sizes = {**{k: v[rows] for k, v in use.items()}, "lost": lost[rows]}
    sizes["held"] = sizes["held"] - sizes["lost"]
    free = table.location[rows] != IN_USE
    sizes["held"] = np.where(free, (ends - starts).astype(np.int64), sizes["held"])
    run_starts, run_ends, run_kinds = [], [], []
    at = starts.copy()
    for name, kind in order:
        length = np.clip(sizes[name], 0, None).astype(np.uint64)
        run_starts.append(at)
        run_ends.append(np.minimum(at + length, ends))
        run_kinds.append(whole if kind is None else np.full(len(rows), kind, dtype=np.uint8))
        at = np.minimum(at + length, ends)
    run_starts.append(at)
    run_ends.append(ends)
    run_kinds.append(np.full(len(rows), KIND["unwalked"], dtype=np.uint8))   # bytes no figure explains
    rs, re_, rk = np.concatenate(run_starts), np.concatenate(run_ends), np.concatenate(run_kinds)
    keep = re_ > rs
    order_ = np.argsort(rs[keep], kind="stable")
    trim = np.stack([starts[table.location[rows] == NORMAL], ends[table.location[rows] == NORMAL]], axis=1)
    return HeapStrip(0, label, int(starts[0]), int(ends[-1]), rs[keep][order_], re_[keep][order_], rk[keep][order_],
                     trimmable=trim.astype(np.uint64), band=BAND)
