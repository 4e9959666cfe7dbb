"""How much of each jemalloc arena is in RAM, when the target says which pages are (a capture's page map, a
live process's): its extents (through the radix tree) and its base's blocks.  Of its free bytes, the dirty
and muzzy pages in RAM, and the free regions of the slabs wholly in RAM; a slab only partly in RAM adds none
of its free regions (which of its pages hold them is not known), and is counted so that the report can say
what its figure leaves out."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heapwalk.jemalloc.extents import ACTIVE, DIRTY, MUZZY
from heapwalk.jemalloc.heapmap import held_bytes
from heapwalk.jemalloc.model import JeState

__all__ = ["ArenaRss", "arena_rss"]


@dataclass(frozen=True)
class ArenaRss:
    """One arena's memory in RAM: all of it, its free bytes, its large allocations', and the slabs only partly
    in RAM (how many, and their free bytes, which the free figure leaves out)."""

    resident: int
    free_resident: int
    large_resident: int
    partial_slabs: int = 0
    partial_free: int = 0


def arena_rss(state: JeState) -> dict[int, ArenaRss] | None:
    """Each arena's memory in RAM by its index, None when the target does not say which pages are in RAM or
    the extents are not known."""
    table, residency = state.extents, state.residency
    if residency is None or table is None:
        return None
    blocks = [(start, start + size) for a in state.arenas for start, size in a.base_blocks]
    ends = table.address + table.size.astype(np.uint64)
    known = residency.covering([(int(s), int(e)) for s, e in zip(table.address.tolist(), ends.tolist())] + blocks)
    res = known.resident_each(table.address, ends)
    used = held_bytes(table)
    free_pages = (table.state == DIRTY) | (table.state == MUZZY)
    slab = table.slab & (table.state == ACTIVE)
    whole = slab & (res == table.size)
    partial = slab & (res < table.size)
    large = ~table.slab & (table.state == ACTIVE)
    free_in_slab = np.maximum(table.size - table.offset - used, 0)
    out = {}
    for a in state.arenas:
        rows = table.arena == a.index
        base = sum(known.resident(start, start + size) for start, size in a.base_blocks)
        out[a.index] = ArenaRss(
            int(res[rows].sum()) + base, int(res[rows & free_pages].sum() + free_in_slab[rows & whole].sum()),
            int(res[rows & large].sum()), int((rows & partial).sum()), int(free_in_slab[rows & partial].sum()))
    return out
