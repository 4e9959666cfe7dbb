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

from heapwalk.inferior.ranges import merged
from heapwalk.inferior.slots import SlotMarks
from heapwalk.mimalloc.decode import MiState, good_size
from heapwalk.common.view import Blocks, TagRuns, index_type, retagged

__all__ = ["mimalloc_blocks"]


def mimalloc_blocks(state: MiState, arena_of: dict[int, int]) -> Blocks:
    """The blocks the program holds in STATE's pages; ARENA_OF: segment address -> its owner's number (the
    report's row).  A byte a block each page cut (`slots.SlotMarks`): its lists' blocks marked, the rest made
    into the blocks' arrays `slots._STEP` at a time; each block's owner kept as a run a page (`view.TagRuns`)."""
    pages, owners, unknown = [], [], []
    for seg in state.live():
        owner = arena_of.get(seg.address, 0)
        for page in seg.pages:
            if page.damaged:
                unknown.append((page.start, page.start + page.cut * page.block_size))
            elif page.cut and page.in_use:
                pages.append(page)
                owners.append(owner)
    order = sorted(range(len(pages)), key=lambda k: pages[k].start)
    pages, owners = [pages[k] for k in order], np.array([owners[k] for k in order], dtype=np.int32)
    slots = SlotMarks(np.array([p.start for p in pages], dtype=np.uint64),
                      np.array([p.block_size for p in pages], dtype=np.int64),
                      np.array([p.cut for p in pages], dtype=np.int64))
    for k, page in enumerate(pages):
        marks = slots.of(k)
        freed = page.freed
        n = min(len(freed), len(marks))           # the same (the blocks it cut) but where none is free
        marks[:n] = freed[:n]
    numbers, index = np.unique(owners, return_inverse=True) if len(owners) else (owners, owners)
    made = slots.blocks(np.zeros(len(pages), dtype=np.uint8))     # owners apart: a byte a block, made after the scan
    tags, runs = index.astype(index_type(len(numbers))), slots.unmarked_counts()
    held = np.bincount(tags, weights=runs, minlength=len(numbers)) > 0   # owners with a block left (their lists
    if not held.all():                                                  # may leave none)
        tags, numbers = retagged(tags, held), numbers[held]
    heaps = merged([*((s.address, s.address + s.reserved) for s in state.live()),
                    *((a.start, a.start + a.reserved) for a in state.discovery.arenas)])
    td = good_size(state.layout.thread_data)
    own = state.own_ranges()
    private = merged([*((at, at + td) for at, _ in state.thread_data), *own])
    return Blocks(made.starts, made.ends, (numbers.astype(np.int32), TagRuns(tags, runs)), 0, 0, heaps=tuple(heaps),
                  private=tuple(private), lengths=made.lengths,
                  unknown=tuple(merged(unknown)))
