"""mallocng's groups as the strips of a heap map (`view.HeapStrip`): the groups not inside another (their own
mappings, and what was donated) in address order, one strip for each stretch of them that follows on without a
gap; the requests mapped on their own apart, one strip for the stretch of them.  Each slot is drawn where it is:
the bytes the program asked for in use (or leaked), the rest of the slot musl's slack, a freed, available or never
used slot free by its kind, a slot that holds a smaller group as that group's slots; each group's header and the
end of its mapping past its last slot are musl's own.  Nothing is given back: musl has no trim."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from heapwalk.common.mapkinds import FREE, KINDS, MAP_KINDS, MapKind, add_map_kind
from heapwalk.common.view import HeapStrip
from heapwalk.inferior.residency import Residency
from heapwalk.musl.layout import MMAPPED
from heapwalk.musl.model import AVAILABLE, FREED, IN_USE, INSIDE, UNUSED, MuslState

__all__ = ["group_strips"]

for _kind in (MapKind("musl_freed", "freed slots", "#aec7e8", "f", 131, FREE),
              MapKind("musl_available", "available slots (handed out next)", "#ffbb78", "a", 132, FREE),
              MapKind("musl_unused", "slots never used (pages untouched)", "#ececec", "o", 161, FREE)):
    add_map_kind(_kind)
_KIND = {IN_USE: "in_use", FREED: "musl_freed", AVAILABLE: "musl_available", UNUSED: "musl_unused"}


def free_kinds_shown() -> tuple[dict[str, str], dict[str, str]]:
    """The colours and names of the kinds of free slots, as the page's chart of the context shows them (the heap
    maps' colours; "unused" is another allocator's mapped, unused memory there)."""
    colours = {state: KINDS[kind].colour for state, kind in _KIND.items() if state != IN_USE}
    return colours, {state: KINDS[kind].label for state, kind in _KIND.items() if state != IN_USE}


def group_strips(state: MuslState, residency: Residency | None = None, leaked=None) -> list[HeapStrip]:
    """The groups as strips; the allocations at LEAKED (the leak scan's, when it ran) drawn as leaked."""
    kind = {name: i for i, name in enumerate(MAP_KINDS)}
    lost = set(np.asarray(leaked, dtype=np.uint64).tolist()) if leaked is not None else set()
    sizes = (state.used_addr, state.used_size)
    inner = {(gi, (state.groups[i].mem - state.groups[gi].storage) // max(1, state.groups[gi].stride)): i
             for i, gi in state.nested.items()}
    runs: list[tuple[int, int, int]] = []

    def group(gi: int, end: int) -> None:
        g = state.groups[gi]
        runs.append((g.mem, g.storage, kind["overhead"]))
        for idx in range(g.slots):
            start = g.storage + g.stride * idx
            what = g.state(idx)
            if what != IN_USE:
                runs.append((start, start + g.stride, kind[_KIND[what]]))
            elif (gi, idx) in inner:
                group(inner[(gi, idx)], start + g.stride)
            else:
                _slot(runs, start, start + g.stride, sizes, lost, kind)
        runs.append((g.storage + g.stride * g.slots, end, kind["overhead"]))

    tops = sorted((g.mem, gi) for gi, g in enumerate(state.groups) if g.source != INSIDE)
    for _, gi in tops:
        g = state.groups[gi]
        group(gi, g.mem + g.extent)
    strips = _stretches(runs, state, tops)
    if residency is None:
        return strips
    known = residency.covering([(s.start, s.end) for s in strips])
    return [replace(s, resident=known.within(s.start, s.end).astype(np.uint64)) for s in strips]


def _slot(runs: list, start: int, end: int, sizes: tuple, lost: set, kind: dict) -> None:
    """A slot in use: the allocation in use (or leaked), the rest of the slot slack; a slot whose
    allocation the walk could not read (damage) not walked."""
    addr, size = sizes
    row = int(np.searchsorted(addr, np.uint64(start)))
    if row >= len(addr) or int(addr[row]) >= end:
        runs.append((start, end, kind["unwalked"]))
        return
    p = int(addr[row])
    stop = min(end, p + int(size[row]))
    runs.append((start, p, kind["overhead"]))             # the slot's start, before the offset it cycles to
    runs.append((p, stop, kind["leaked"] if p in lost else kind["in_use"]))
    runs.append((stop, end, kind["overhead"]))


def _stretches(runs: list, state: MuslState, tops: list) -> list[HeapStrip]:
    """The runs cut into strips where the groups' memory has a gap; the large requests' strips labelled apart."""
    arr = np.array([r for r in runs if r[1] > r[0]], dtype=np.uint64).reshape(-1, 3)
    arr = arr[np.argsort(arr[:, 0], kind="stable")]
    out = []
    if not len(arr):
        return out
    breaks = np.flatnonzero(arr[1:, 0] != arr[:-1, 1]) + 1
    large = {g.mem for g in state.groups if g.sizeclass == MMAPPED}
    for n, (lo, hi) in enumerate(zip([0, *breaks.tolist()], [*breaks.tolist(), len(arr)])):
        part = arr[lo:hi]
        start = int(part[0, 0])
        label = "musl: requests mapped on their own" if start in large else f"musl groups {n + 1}"
        out.append(HeapStrip(0, label, start, int(part[-1, 1]), part[:, 0].copy(), part[:, 1].copy(),
                             part[:, 2].astype(np.uint8), trimmable=np.zeros((0, 2), dtype=np.uint64),
                             band="given back (musl has no trim)"))
    return out
