"""jemalloc's heap as the allocator-neutral view (`heapwalk.common.view`), so that it gets the report, its JSON and
`heapwalk diff` as glibc's does.

Per arena, the bytes it has mapped (malloc_stats_print's ``mapped``) split by what holds them: regions the
program holds (small and large allocations, less what the thread caches hold), and free bytes in the
thread caches, in slabs (free regions and the slabs' unused tails), in dirty and in muzzy pages; the rest
is metadata (its base's blocks) and the page each large allocation carries when cache_oblivious is on.
What decay would give back is the dirty and muzzy pages.  The free pieces' sizes are the slabs' free
regions, the cached regions, and the free extents of each page size class.
"""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType

from heapwalk.jemalloc.model import JeArena, JeState
from heapwalk.jemalloc.resident import ArenaRss, arena_rss
from heapwalk.common.view import ArenaView, HeapView

__all__ = ["heap_view", "FREE_KINDS", "arena_kind"]

#: the kinds of free bytes of a jemalloc arena, in the order the report shows them
FREE_KINDS = ("tcache", "slabs", "dirty", "muzzy")


def heap_view(state: JeState) -> HeapView:
    """The view of a decoded jemalloc state."""
    narenas = state.opt.get("narenas")
    manual = sum(1 for a in state.arenas if arena_kind(state, a.index) == "manual")
    limit = (f"opt.narenas {narenas} automatic arenas, {manual} more made with arenas.create"
             if isinstance(narenas, int) else "opt.narenas is not known")
    large = [c for a in state.arenas for c in a.large]
    rss = arena_rss(state)
    rows = tuple(_row(state, a, None if rss is None else rss[a.index]) for a in state.arenas)
    return HeapView(
        allocator="jemalloc", arenas=rows,
        free_sizes=MappingProxyType({a.index: _free_sizes(state, a) for a in state.arenas}), size_classes=(),
        large_count=sum(c.curlextents for c in large), large_bytes=sum(c.bytes for c in large),
        arena_limit=limit, arenas_idle=sum(1 for a in state.arenas if not a.nthreads),
        reclaim_total=sum(r.reclaim for r in rows),
        residency=state.residency.source if rss is not None and state.residency is not None else "",
        large_resident=None if rss is None else sum(r.large_resident for r in rss.values()))


def arena_kind(state: JeState, index: int) -> str:
    """"auto" for the arenas jemalloc picks for threads, "huge" for the one of oversize allocations (5.2 and
    later), "manual" for those made with arenas.create ("arena" when opt.narenas is unknown)."""
    narenas = state.opt.get("narenas")
    if not isinstance(narenas, int) or isinstance(narenas, bool):
        return "arena"
    huge = "oversize_threshold" in state.opt      # 5.2 and later keep an arena for huge allocations
    return "auto" if index < narenas else "huge" if index == narenas and huge else "manual"


def _row(state: JeState, a: JeArena, rss: ArenaRss | None) -> ArenaView:
    """One arena's bytes by what holds them (and in RAM, RSS, when known); balanced when its counters agree
    with its active pages."""
    small, large = a.small()["allocated"], a.large_totals()["allocated"]
    cached = state.cached_from(a.index)
    pages = a.active_bytes + a.dirty_bytes + a.muzzy_bytes
    padding, extents = a.active_slack(), a.large_extents()
    room = max(0, a.active_bytes - small - large)       # what active pages leave free: more is damage
    free = {"tcache": min(cached, small + large, a.active_bytes), "slabs": min(a.slab_bytes() - small, room),
            "dirty": a.dirty_bytes, "muzzy": a.muzzy_bytes}
    balanced = (0 <= padding <= extents * a.page and a.mapped >= pages and min(free.values()) >= 0
                and small + large >= cached)
    return ArenaView(a.index, a.address, arena_kind(state, a.index), a.nthreads,
                     sum(b.curslabs for b in a.bins) + extents, a.mapped, state.in_use(a),
                     MappingProxyType({k: max(0, v) for k, v in free.items()}), 0,
                     max(0, a.mapped - pages + padding), a.dirty_bytes + a.muzzy_bytes, balanced,
                     None if rss is None else rss.resident, None if rss is None else rss.free_resident, None,
                     tuple(sorted(t.name or "" for t in state.threads if t.arena == a.index)))


def _free_sizes(state: JeState, a: JeArena) -> Counter:
    """The sizes of the arena's free pieces: free regions of its slabs, regions its threads' caches hold, and
    its dirty and muzzy extents (within a page size class, its bytes spread over its extents)."""
    sizes: Counter = Counter()
    for b in a.bins:
        free = b.curslabs * b.nregs - b.curregs
        if free > 0:
            sizes[b.size] += free
    for t in state.threads:
        if t.tcache_arena == a.index:
            for size, count in t.tcache:
                sizes[size] += count
    for e in a.extents:
        count, total = e.ndirty + e.nmuzzy, e.dirty_bytes + e.muzzy_bytes
        if count:
            sizes[total // count] += count - 1
            sizes[total - (total // count) * (count - 1)] += 1
    return +sizes
