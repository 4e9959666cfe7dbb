"""glibc's heap as the allocator-neutral view (`heapwalk.common.view`): each arena's bytes by what holds them, from
its account; what malloc_trim(0) would give back; the free chunks' sizes by arena; glibc's size classes."""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType

import numpy as np

from heapwalk.common.arrays import counted
from heapwalk.glibc.model import FREE_STATES, KEPT_REASONS, Arena, ChunkState, HeapState
from heapwalk.glibc.account.resident import ArenaResidency, arena_residency, mmapped_resident
from heapwalk.common.view import ArenaView, HeapView, SizeClass

__all__ = ["arena_limit", "GLIBC_CLASSES", "heap_view", "free_sizes_by_arena"]

#: glibc's size classes of free chunks (64-bit): fastbin sizes, small bins, then the large-bin spacings
GLIBC_CLASSES = (SizeClass(32, 0x90, "fastbin sizes (32-128 B)"), SizeClass(0x90, 1024, "small bins (144 B-1 KiB)"),
                 SizeClass(1024, 3136, "large bins, 64 B apart"), SizeClass(3136, 10752, "large bins, 512 B apart"),
                 SizeClass(10752, 45056, "large bins, 4 KiB apart"),
                 SizeClass(45056, 163840, "large bins, 32 KiB apart"),
                 SizeClass(163840, 786432, "large bins, 256 KiB apart"),
                 SizeClass(786432, 1 << 64, "the last large bin"))


def heap_view(state: HeapState) -> HeapView:
    """The view of a state decoded with its chunk walk."""
    limit = arena_limit(state)
    trims = state.trims.values()
    count, size = state.mmap_counters()
    resident = arena_residency(state, _tcache_chunks_by_arena(state)) if state.residency is not None else {}
    return HeapView(
        allocator="glibc", arenas=tuple(_rows(state, resident)),
        free_sizes=MappingProxyType(free_sizes_by_arena(state)),
        size_classes=GLIBC_CLASSES, large_count=count, large_bytes=size, arena_limit=limit,
        arenas_idle=sum(1 for a in state.arenas if a.on_free_list), reclaim_total=sum(t.total for t in trims),
        reclaim_kept=MappingProxyType({k: sum(t.kept[k] for t in trims) for k in KEPT_REASONS}),
        residency=state.residency.source if state.residency is not None else "",
        large_resident=mmapped_resident(state, state.residency),
        thresholds=MappingProxyType(_thresholds(state)))


def _thresholds(state: HeapState) -> dict[str, int]:
    """mp_'s trim and mmap thresholds and whether they are pinned (no_dyn_threshold), where mp_ was read."""
    if not state.mp:
        return {}
    values = {k: state.mp.get(k) for k in ("trim_threshold", "mmap_threshold", "no_dyn_threshold")}
    return {k: v for k, v in values.items() if isinstance(v, int) and not isinstance(v, bool)}


def arena_limit(state: HeapState) -> str:
    """How many arenas glibc may make in STATE's process and why, and whether it has made them all."""
    mp = state.mp
    arena_max = mp.get("arena_max") if mp else None
    count = len(state.arenas)
    if arena_max:
        limit, why = arena_max, "MALLOC_ARENA_MAX / M_ARENA_MAX"
    elif state.cpus is None:
        return "8 x the CPU count (the default; the core does not record the CPU count: 'heapwalk capture' does)"
    else:
        online, allowed = state.cpus
        # glibc counts the CPUs online; its 2.35-2.38 releases (before a backport) counted those allowed
        cpus = lambda n: f"{n} CPU{'s' if n != 1 else ''}"  # noqa: E731
        limit, why = 8 * online, f"the default: 8 x {cpus(online)} online"
        if allowed != online:
            why += f"; {8 * allowed} on glibc 2.35-2.38 builds that count the {cpus(allowed)} the process may use"
    reached = (f": reached, so a thread that finds every arena busy waits for one ({count} arenas)"
               if count >= limit else f", {count} made")
    return f"{limit} ({why}){reached}"


def _arena_of(state: HeapState):
    """A function from a chunk address to the number of the arena whose heap holds it (None if none)."""
    ranges = sorted((h.address, h.address + h.size, a.number) for a in state.arenas for h in a.heaps)

    def find(address: int) -> int | None:
        return next((n for lo, hi, n in ranges if lo <= address < hi), None)
    return find


def free_sizes_by_arena(state: HeapState) -> dict[int, Counter]:
    """Arena number -> the sizes of its free chunks (bins, fastbins, and the tcache entries in its heaps),
    as size -> how many.  (2.43's tcache'd mmapped chunks are counted with the mmapped memory.)"""
    out = _tcache_sizes_by_arena(state)
    for a in state.arenas:
        listed = [np.frombuffer(lst.sizes, dtype=np.uint64) for lst in a.free_lists() if len(lst.raw_sizes)]
        if listed:
            sizes, counts = counted(np.concatenate(listed))
            out[a.number].update(dict(zip(sizes.tolist(), counts.tolist())))
    return out


def _tcache_sizes_by_arena(state: HeapState) -> dict[int, Counter]:
    """Arena number -> the sizes of the tcache entries that lie in its heaps, as size -> how many."""
    return {n: Counter(size for _, size in chunks) for n, chunks in _tcache_chunks_by_arena(state).items()}


def _tcache_chunks_by_arena(state: HeapState) -> dict[int, list[tuple[int, int]]]:
    """Arena number -> (chunk address, size) of the tcache entries that lie in its heaps."""
    out: dict[int, list[tuple[int, int]]] = {a.number: [] for a in state.arenas}
    find = _arena_of(state)
    for _, tcache in state.tcaches():
        for b in tcache.bins:
            for entry, size in zip(b.entries, b.sizes or (b.chunk_size,) * len(b.entries)):
                number = find(entry)
                if number is not None:
                    out[number].append((entry - 16, size))
    return out


def _rows(state: HeapState, resident: dict[int, ArenaResidency]) -> list[ArenaView]:
    """Each arena's bytes from its account (or, where Ctrl-C left it unwalked, from its lists and top), and in
    RAM (RESIDENT, by arena number, when known)."""
    users: dict[int, int] = {}
    names: dict[int, list[str]] = {}
    for t in state.threads:
        if t.arena:
            users[t.arena] = users.get(t.arena, 0) + 1
            names.setdefault(t.arena, []).append(t.name or "")
    lost = any(t.tls_lost for t in state.threads)
    if lost:  # thread_arena is unknown for some threads: glibc's own count
        users = {a.address: a.attached_threads for a in state.arenas if a.attached_threads is not None}
    rows = []
    for a in state.arenas:
        acc = state.accounts[a.address]
        trim = state.trims.get(a.address)
        free = {s.value: acc.bytes[s] for s in FREE_STATES if s is not ChunkState.FREE_UNLISTED}
        free["unsorted"] += acc.bytes[ChunkState.FREE_UNLISTED]
        top = acc.bytes[ChunkState.TOP]
        if a.system_mem and acc.unwalked >= a.system_mem:   # not walked (Ctrl-C): what its lists and top hold
            free, top = _listed_free(state, a), a.top_size
        r = resident.get(a.number)
        rows.append(ArenaView(a.number, a.address, a.kind, users.get(a.address, 0), len(a.heaps), a.system_mem,
                              acc.bytes[ChunkState.IN_USE] + acc.bytes[ChunkState.TCACHE_STRUCT],
                              MappingProxyType(free), top, acc.overhead + acc.bytes[ChunkState.FENCEPOST],
                              trim.resident if trim else 0, acc.balanced, r and r.heaps, r and r.free, r and r.top,
                              None if lost else tuple(sorted(names.get(a.address, ())))))
    return rows


def _listed_free(state: HeapState, arena: Arena) -> dict[str, int]:
    """ARENA's free bytes by kind as its free lists and the tcache entries in its heaps hold them."""
    free = dict.fromkeys(("tcache", "fast", "unsorted", "small", "large"), 0)
    for lst in arena.free_lists():
        free[lst.kind.value] += lst.total
    free["tcache"] = sum(size * n for size, n in _tcache_sizes_by_arena(state)[arena.number].items())
    return free
