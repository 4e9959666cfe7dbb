"""mimalloc's blocks as the leak scan takes them (`view.Blocks`): every block a page has cut (its capacity) that
no list holds (its free, local-free and thread-free lists, its heap's delayed-free list), a huge page's one
block included.

Every live segment and every arena is mimalloc's heap (scanned only inside its blocks: the segment's header and
slices, an arena's free blocks (stale copies of what they held) and its own slices are never a root); the thread
data (each thread's heap and thread-local data, taken from the system) is its private memory.
A page whose lists could not be walked cannot say which of its blocks are free: it is scanned as unknown memory
(a root, never judged), never as leaks."""

from __future__ import annotations

import numpy as np

from heapwalk.inferior.memory import merged
from heapwalk.mimalloc.decode import MiState, good_size
from heapwalk.common.view import Blocks

__all__ = ["mimalloc_blocks"]


def mimalloc_blocks(state: MiState, arena_of: dict[int, int]) -> Blocks:
    """The blocks the program holds in STATE's pages; ARENA_OF: segment address -> its owner's number (the
    report's row)."""
    starts, ends, arenas, unknown = [], [], [], []
    for seg in state.live():
        for page in seg.pages:
            if page.damaged:
                unknown.append((page.start, page.start + page.cut * page.block_size))
                continue
            if page.cut == 0 or page.in_use == 0:
                continue
            slots = np.uint64(page.start) + np.arange(page.cut, dtype=np.uint64) * np.uint64(page.block_size)
            if page.freed:
                slots = slots[~np.isin(slots, np.array(page.freed, dtype=np.uint64))]
            starts.append(slots)
            ends.append(slots + np.uint64(page.block_size))
            arenas.append(np.full(len(slots), arena_of.get(seg.address, 0), dtype=np.int32))
    start = np.concatenate(starts) if starts else np.zeros(0, dtype=np.uint64)
    end = np.concatenate(ends) if ends else np.zeros(0, dtype=np.uint64)
    arena = np.concatenate(arenas) if arenas else np.zeros(0, dtype=np.int32)
    order = np.argsort(start, kind="stable")
    heaps = merged([*((s.address, s.address + s.reserved) for s in state.live()),
                    *((a.start, a.start + a.reserved) for a in state.discovery.arenas)])
    td = good_size(state.layout.thread_data)
    own = state.own_ranges()
    private = merged([*((at, at + td) for at, _ in state.thread_data), *own])
    return Blocks(start[order], end[order], arena[order], 0, 0, heaps=tuple(heaps), private=tuple(private),
                  unknown=tuple(merged(unknown)))
