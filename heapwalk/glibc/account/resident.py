"""How much of each arena was in RAM, where the target says which pages were (`HeapState.residency`): its
heaps, its free chunks (those its lists and the tcaches in its heaps hold) and its top chunk."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heapwalk.glibc.model import Arena, HeapState
from heapwalk.inferior.residency import Residency

__all__ = ["ArenaResidency", "arena_residency", "mmapped_resident"]


@dataclass(frozen=True)
class ArenaResidency:
    """Resident bytes of one arena: all its heaps, its free chunks, its top chunk."""

    heaps: int
    free: int
    top: int


def _spans(arena: Arena) -> list[tuple[int, int]]:
    """ARENA's heaps as [start, end) ranges, with whatever of a heap's reservation is still mapped read-write."""
    return [(h.address, h.address + max(h.size, h.mprotect_size)) for h in arena.heaps]


def arena_residency(state: HeapState, tcached: dict[int, list[tuple[int, int]]]) -> dict[int, ArenaResidency]:
    """Arena number -> its resident bytes (an empty dict when STATE's residency is unknown); TCACHED: arena
    number -> (chunk address, size) of the tcache entries in its heaps."""
    if state.residency is None:
        return {}
    out = {}
    for a in state.arenas:
        spans = _spans(a)
        known = state.residency.covering(spans)
        starts, ends = _free_ranges(a, tcached.get(a.number, []))
        out[a.number] = ArenaResidency(
            known.resident_sum([lo for lo, _ in spans], [hi for _, hi in spans]),
            known.resident_sum(starts, ends),
            known.resident(a.top, a.top + a.top_size) if a.top and a.top_size else 0)
    return out


def _free_ranges(arena: Arena, tcached: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) of each free chunk of ARENA's lists and of TCACHED ((chunk, size) pairs), as two arrays."""
    starts, sizes = [np.array([c for c, _ in tcached], dtype=np.uint64)], [np.array([s for _, s in tcached],
                                                                                   dtype=np.uint64)]
    for lst in arena.free_lists():
        starts.append(np.asarray(lst.chunks, dtype=np.uint64))
        sizes.append(np.asarray(lst.sizes, dtype=np.uint64))
    lo = np.concatenate(starts)
    return lo, lo + np.concatenate(sizes)


def mmapped_resident(state: HeapState, residency: Residency | None) -> int | None:
    """Resident bytes of the mmapped chunks found in memory, or None when residency is unknown."""
    if residency is None:
        return None
    spans = [(c.address, c.address + c.span) for c in state.mmapped]
    if not spans:
        return 0
    known = residency.covering(spans)
    return known.resident_sum([lo for lo, _ in spans], [hi for _, hi in spans])
