"""Where mimalloc's memory goes, by owner (each thread, and the threads that exited: their abandoned segments
and the thread data kept for reuse): the bytes it took from the system, those in blocks the program holds, free
in pages (on their lists, and not yet cut into blocks), in free spans of slices, and its own (segment headers,
what pages lose to rounding, the system's rounding of each allocation, thread data)."""

from __future__ import annotations

from dataclasses import dataclass, field

from heapwalk.mimalloc.decode import MiSegment, MiState, good_size

__all__ = ["Owner", "owners", "FREE_KINDS", "EXITED", "UNOWNED", "ARENAS", "META", "CACHED", "NO_THREAD"]

#: the kinds of free bytes, as the report's columns name them
FREE_KINDS = ("free blocks", "not yet cut", "free spans", "arena blocks")
EXITED = 0          # the owner of abandoned segments and cached thread data
UNOWNED = -1        # the owner of huge segments that belong to no thread (2.0.5 to 2.0.7)
ARENAS = -2         # the arenas' blocks no segment uses (from 2.1)
META = -3           # 3.6: the pages of the theap mimalloc allocates its own data with (theaps, thread data)
CACHED = -4         # to 2.0.9: the freed segments its segment cache keeps for reuse
#: the owners that are no thread
NO_THREAD = (EXITED, UNOWNED, ARENAS, META, CACHED)


@dataclass
class Owner:
    """One owner's share: THREAD_ID is its thread pointer (EXITED: threads that exited)."""

    thread_id: int
    heaps: list[int] = field(default_factory=list)
    segments: list[MiSegment] = field(default_factory=list)
    thread_data: int = 0            # bytes of thread data
    reserved: int = 0
    committed: int = 0
    in_use: int = 0
    free: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FREE_KINDS, 0))
    overhead: int = 0
    pending: int = 0                # committed bytes waiting for their purge delay
    pages: int = 0
    blocks: int = 0                 # blocks in use

    @property
    def balanced(self) -> bool:
        return self.in_use + sum(self.free.values()) + self.overhead == self.reserved

    def ranges(self) -> list[tuple[int, int]]:
        return [(s.address, s.address + s.reserved) for s in self.segments]

    def free_ranges(self) -> list[tuple[int, int]]:
        """The free spans' bytes (a cached segment's, whole)."""
        return [(s.address + sp.index * 65536, s.address + (sp.index + sp.slices) * 65536)
                for s in self.segments for sp in s.spans] + \
            [(s.address, s.address + s.reserved) for s in self.segments if not s.live]


def owners(state: MiState) -> list[Owner]:
    """Each owner's share of STATE: the main thread first, then the other threads by their heaps' order, then
    the exited threads' (when they left anything)."""
    by: dict[int, Owner] = {}
    main = next((h.thread_id for h in state.heaps if h.main), None)
    meta = {h.thread_id for h in state.heaps if h.meta}
    for h in state.heaps:
        if h.thread_id:
            key = META if h.meta else h.thread_id
            by.setdefault(key, Owner(key)).heaps.append(h.address)
    for seg in state.live():
        key = UNOWNED if state.unowned(seg) else META if seg.thread_id in meta else seg.thread_id or EXITED
        _add_segment(by.setdefault(key, Owner(key)), seg)
    if META in by:                  # its blocks are mimalloc's own data, not the program's
        by[META].overhead += by[META].in_use
        by[META].in_use = by[META].blocks = 0
    td = good_size(state.layout.thread_data, state.os_page)
    for at, kind in state.thread_data:
        heap = next((h for h in state.heaps if h.address == at), None)
        key = heap.thread_id if kind == "thread" and heap and heap.thread_id in by else EXITED
        owner = by.setdefault(key, Owner(key))
        owner.thread_data += td
        owner.reserved += td
        owner.committed += td
        owner.overhead += td
    _add_arenas(state, by)
    for seg in state.cached():
        cache = by.setdefault(CACHED, Owner(CACHED))
        cache.segments.append(seg)
        cache.reserved += seg.reserved
        cache.committed += seg.committed
        cache.free["free spans"] += seg.reserved
    order = sorted(by.values(), key=lambda o: (o.thread_id in NO_THREAD, o.thread_id in (ARENAS, CACHED),
                                               o.thread_id == EXITED, o.thread_id != main, min(o.heaps or [0])))
    return order


def _add_arenas(state: MiState, by: dict[int, Owner]) -> None:
    """The arenas' row: their blocks no segment uses, and their descriptions taken from the system (and from 2.1.8 the
    segment map's parts); a family that makes its own row (mimalloc 3's) makes it instead."""
    free_blocks = state.arena_free()
    if state.add_arenas_row(by, free_blocks):
        return
    meta = sum(good_size(a.meta, state.os_page) for a in state.discovery.arenas if a.meta) + state.map_bytes()
    if not free_blocks and not meta:
        return
    arenas = by.setdefault(ARENAS, Owner(ARENAS))
    arenas.reserved += free_blocks + meta
    arenas.free["arena blocks"] += free_blocks
    arenas.overhead += meta
    arenas.committed += meta + sum(a.committed_blocks() * a.block_size for a in state.discovery.arenas) - sum(
        s.reserved for s in state.live() if s.arena is not None and s.in_committed_blocks())


def _add_segment(owner: Owner, seg: MiSegment) -> None:
    owner.segments.append(seg)
    owner.reserved += seg.reserved
    owner.committed += seg.committed
    owner.pending += seg.pending
    owner.overhead += seg.reserved - seg.size + seg.info_slices * 65536
    for sp in seg.spans:
        owner.free["free spans"] += sp.slices * 65536
    for p in seg.pages:
        owner.pages += 1
        owner.blocks += p.in_use
        owner.in_use += p.in_use * p.block_size
        owner.free["free blocks"] += p.free_cut * p.block_size
        owner.free["not yet cut"] += (p.room - p.cut) * p.block_size
        owner.overhead += (p.end - p.start) - p.room * p.block_size + (p.start - seg.address - p.index * 65536)
