"""Validation of a decoded heap: every invariant glibc relies on, as findings.

The walkers already refuse bad links (misaligned, unmapped, cycles) and the
chunk walk checks neighbours (prev_size, PREV_INUSE, NON_MAIN_ARENA); this
module adds the checks that need the whole picture: a chunk in two free lists
(a double free), free chunks outside their arena or overlapping top, tcache
entries of the wrong size or with an overwritten key, large-bin order and
nextsize links, the binmap and have_fastchunks.  `check` gathers all of it,
with `heapwalk.glibc.forensics.partial`'s notes on which numbers rest on damaged structures.
"""

from __future__ import annotations

import bisect
import struct
from collections import Counter

import numpy as np

from heapwalk.glibc.walk.chunks import extents
from heapwalk.glibc.locate.layout import IS_MMAPPED, NBINS, SIZE_BITS, Layout, layout_for
from heapwalk.inferior.memory import Memory, ReadError, drop_cached, u64
from heapwalk.inferior.ownmemory import give_back
from heapwalk.glibc.model import Arena, BinKind, HeapState, Tcache, list_name
from heapwalk.glibc.forensics.partial import partial
from heapwalk.common.arrays import ordered
from heapwalk.common.findings import CheckResult, Finding, Severity
from heapwalk.glibc.kinds import Kind

__all__ = ["CheckResult", "check", "scope"]

_QQ = struct.Struct("<QQ")
#: listed chunks `_inside_free` judges at a time
_STEP = 1 << 18


def check(state: HeapState, mem: Memory, layout: Layout) -> CheckResult:
    """Every violation heapwalk can see in STATE (decoded with the chunk walk, for the neighbour checks)."""
    listed = _listed_chunks(state, mem, layout)
    overlaps = {f.address for f in listed if f.kind is Kind.INSIDE_CHUNK}  # named with the list they lie in
    findings = [f for f in state.all_findings() if f.kind is not Kind.INSIDE_CHUNK or f.address not in overlaps]
    findings += listed
    for arena in state.arenas:
        findings += _large_bins(mem, arena)
        findings += _arena_flags(mem, layout, arena)
    findings += _tcache_keys(state, mem)
    findings += _unwalked(state)
    unique: dict[tuple, Finding] = {}
    for f in findings:
        unique.setdefault((f.kind, f.address, f.structure, f.message), f)
    ordered = sorted(unique.values(), key=lambda f: (f.severity is not Severity.ERROR,
                                                     f.severity is not Severity.WARNING, f.kind is not Kind.ABORT,
                                                     f.address))
    return CheckResult(tuple(ordered), partial(state))


def _unwalked(state: HeapState) -> list[Finding]:
    """An error for each arena with bytes the walk could not pass: a heap is consistent only when every byte
    of it is accounted for (the damage that stopped the walk is named where it lies)."""
    out = []
    for arena in state.arenas:
        acc = state.accounts.get(arena.address)
        if acc is not None and acc.unwalked:
            out.append(Finding(Severity.ERROR, arena.address, f"arena {arena.number}",
                               f"{acc.unwalked:#x} of its {arena.system_mem:#x} bytes could not be walked, so "
                               "they are accounted for as neither in use nor free", Kind.ACCOUNTING,
                               "every byte walked", f"{acc.unwalked:#x} bytes not walked"))
    return out


def _arena_spans(state: HeapState, layout: Layout) -> dict[int, list[tuple[int, int]]]:
    return {a.address: [(e.first, e.end) for e in extents(a, layout)] for a in state.arenas}


def _inside(spans: list[tuple[int, int]], lo: int, hi: int) -> bool:
    return any(s <= lo and hi <= e for s, e in spans)


def _misplaced(chunks, sizes, spans: list[tuple[int, int]], tops: list[tuple[int, int]]):
    """(chunk, size) of each of CHUNKS (of SIZES) that is not plainly inside one of SPANS and clear of TOPS:
    those need a closer look.  Looked at all at once: a binary search and a few compares a chunk."""
    spans = sorted(spans)
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    top_lo, top_hi = [0] * len(spans), [0] * len(spans)      # the top inside each span, if any
    for lo, hi in tops:
        for k, (s, e) in enumerate(spans):
            if lo < e and s < hi:
                if top_hi[k]:                                 # two tops in one heap: look at every chunk
                    starts, ends = [], []
                top_lo[k], top_hi[k] = lo, hi
    c, n = np.asarray(chunks, dtype=np.uint64), np.asarray(sizes, dtype=np.uint64)
    if not len(c):
        return
    if starts and max(starts + ends + top_lo + top_hi) < 1 << 64:  # else damaged bounds: look at all
        k = np.searchsorted(np.array(starts, dtype=np.uint64), c, side="right") - 1
        at = np.maximum(k, 0)
        end, lo, hi = (np.array(v, dtype=np.uint64)[at] for v in (ends, top_lo, top_hi))
        look = (k < 0) | (n >= np.uint64(1 << 47)) | (c + n > end) | (n < 16) | ((c < hi) & (lo < c + n))
    else:
        look = np.ones(len(c), dtype=bool)
    where = np.flatnonzero(look)
    yield from zip(c[where].tolist(), n[where].tolist())


def _listed_chunks(state: HeapState, mem: Memory, layout: Layout) -> list[Finding]:
    """Free-list members: in one list only, inside their arena's heaps, clear of top, of their bin's size."""
    every = _Every(state)
    give_back()
    listed = _Listed(state, layout, every.twice)
    for arena in state.arenas:
        listed.arena_lists(arena)
    for owner, tcache in state.tcaches():
        listed.tcache(mem, owner, tcache)
    drop_cached(mem)
    give_back()
    return listed.out + _inside_free(state, every)


class _Every:
    """Every chunk any list holds (a tcache entry by its chunk), as GROUPS (where, chunks, bytes from the chunk to
    what a finding names, the bin's index in BINS or -1), sorted once: whether one is listed twice, and the order
    the chunks of the bins (unsorted, small and large, whose chunks others may lie inside) come in."""

    def __init__(self, state: HeapState):
        self.bins = [(a, lst) for a in state.arenas for lst in (a.unsorted, *a.bins) if len(lst.chunks)]
        holder = {id(lst): i for i, (_, lst) in enumerate(self.bins)}
        self.groups = [(list_name(a, lst.kind, lst.index), np.asarray(lst.chunks, dtype=np.uint64), 0,
                        holder.get(id(lst), -1))
                       for a in state.arenas for lst in (*a.fastbins, a.unsorted, *a.bins) if len(lst.chunks)]
        self.groups += [(f"tcache bin {b.index} of {owner}", np.array(b.entries, dtype=np.uint64) - np.uint64(16),
                         16, -1) for owner, tc in state.tcaches() for b in tc.bins if b.entries]
        self.every = np.concatenate([np.zeros(0, dtype=np.uint64)] + [g[1] for g in self.groups])
        order = ordered(self.every)
        self.order = order.astype(np.int32) if len(order) < 1 << 31 else order   # (4 bytes a chunk where they do)
        del order
        ranked = self.every[self.order]
        self.twice = bool(np.any(ranked[1:] == ranked[:-1]))


def _inside_free(state: HeapState, every: _Every) -> list[Finding]:
    """A tcache entry, a fastbin chunk or a bin chunk that starts inside another free chunk of the bins: the same
    memory handed out twice (a chunk freed again after it was merged into its neighbour, how2heap's botcake; a
    forged size).  The error is at the entry inside (a tcache entry by its user pointer), naming the chunk it
    lies in.  A heap may list millions of free chunks: they are judged in address order (one sort, EVERY's), _STEP
    of them at a time (the arrays of a step, not of all, held at once), Python only for the ones inside."""
    bins = every.bins
    if not bins:
        return []
    n = len(every.every)
    holder = np.concatenate([np.full(len(chunks), h, dtype=np.int32) for _, chunks, _, h in every.groups])
    order = every.order                            # stable: where a chunk is listed twice, the lists' order
    in_bin = holder[order] >= 0                    # decides which copy is met first, as always
    pick = order[in_bin]                           # the bin chunks in address order, by their place in EVERY
    holder = holder[pick]
    sizes = np.zeros(n, dtype=np.uint64)
    at = 0
    for _, chunks, _, h in every.groups:
        if h >= 0:
            sizes[at:at + len(chunks)] = bins[h][1].raw_sizes
            sizes[at:at + len(chunks)] &= np.uint64(~SIZE_BITS & (1 << 64) - 1)
        at += len(chunks)
    ends = sizes[pick]
    del sizes
    starts = every.every[pick]
    del pick
    ends += starts
    reach = np.maximum.accumulate(ends)            # the furthest any free chunk starting so far reaches
    inside = _starting_inside(every, in_bin, starts, reach)
    del in_bin
    out = []
    for g, _, chunk, j in sorted(inside):          # in the lists' order, as each list names its chunks
        where, _, named, _ = every.groups[g]
        while j >= 0 and not chunk < int(ends[j]):
            j -= 1
        if j < 0:
            continue
        a, lst = bins[int(holder[j])]
        s, e = int(starts[j]), int(ends[j])
        out.append(Finding(Severity.ERROR, chunk + named, where, f"free chunk {chunk:#x} lies {chunk - s:#x} "
                           f"bytes into the free chunk {s:#x} (size {e - s:#x}) of "
                           f"{list_name(a, lst.kind, lst.index)}: the same memory is free twice (freed again "
                           "after it was merged into its neighbour, or a size was forged)", Kind.INSIDE_CHUNK,
                           f"outside {s:#x}..{e:#x}", f"{chunk:#x}"))
    return out


def _starting_inside(every: _Every, in_bin, starts, reach) -> list[tuple[int, int, int, int]]:
    """(group, place in it, chunk, the last bin chunk starting below it) of each listed chunk that may start
    inside a bin chunk (REACH of that one, the furthest any bin chunk from STARTS up to it reaches, is past it):
    every listed chunk in address order (IN_BIN: which of them are the bins'), _STEP of them at a time."""
    order, n = every.order, len(every.every)
    index = np.int32 if n < 1 << 31 else np.int64  # (each array a chunk listed: 4 bytes where they do)
    offsets = np.cumsum([0] + [len(chunks) for _, chunks, _, _ in every.groups]).tolist()
    inside, below = [], 0
    for lo in range(0, n, _STEP):
        places = order[lo:lo + _STEP]
        chunk_at = every.every[places]
        if every.twice:                            # the last bin chunk starting below each, equal ones not
            k = np.searchsorted(starts, chunk_at, side="left") - 1
        else:                                      # (no two alike: the bin chunks met before each in the order)
            step_in_bin = in_bin[lo:lo + _STEP]
            k = np.cumsum(step_in_bin, dtype=index)
            k -= step_in_bin
            k += below - 1
            below += int(np.count_nonzero(step_in_bin))
        for p in np.flatnonzero((k >= 0) & (chunk_at < reach[np.maximum(k, 0)])).tolist():
            e = int(places[p])
            g = bisect.bisect_right(offsets, e) - 1
            inside.append((g, e - offsets[g], int(chunk_at[p]), int(k[p])))
    return inside


class _Listed:
    """The checks of free-list members, with what they share: each arena's spans, the tops, and the list
    each chunk was first met in (when TWICE says some chunk is listed twice)."""

    def __init__(self, state: HeapState, layout: Layout, twice: bool):
        self.out: list[Finding] = []
        self.spans = _arena_spans(state, layout)
        self.every_span = [s for v in self.spans.values() for s in v]
        self.tops = [(a.top, a.top + a.top_size) for a in state.arenas if a.top]
        self.twice = twice
        self.first_list: dict[int, str] = {}

    def seen(self, chunk: int, where: str) -> None:
        other = self.first_list.setdefault(chunk, where)
        if other != where:
            self.out.append(Finding(Severity.ERROR, chunk, where, f"double free: chunk {chunk:#x} is in {other} "
                                    f"and in {where}", Kind.DOUBLE_FREE, "one free list", f"{other} and {where}"))

    def placed(self, chunk: int, size: int, where: str, allowed: list[tuple[int, int]],
               near_tops: list[tuple[int, int]] | None = None) -> None:
        """Inside ALLOWED, and clear of every top (of NEAR_TOPS, the tops within ALLOWED, when inside)."""
        inside = _inside(allowed, chunk, chunk + max(size, 16))
        if not inside:
            self.out.append(Finding(Severity.ERROR, chunk, where, f"free chunk {chunk:#x} (size {size:#x}) is not "
                                    "inside the heaps of its arena", Kind.OUTSIDE_HEAP, "inside the arena's heaps",
                                    f"{chunk:#x}"))
        for lo, hi in (near_tops if inside and near_tops is not None else self.tops):
            if chunk < hi and lo < chunk + size:
                self.out.append(Finding(Severity.ERROR, chunk, where, f"free chunk {chunk:#x} (size {size:#x}) "
                                        f"overlaps the top chunk {lo:#x}..{hi:#x}", Kind.OVERLAPS_TOP,
                                        "clear of top", f"{chunk:#x}..{chunk + size:#x}"))

    def arena_lists(self, arena: Arena) -> None:
        """ARENA's bins and fastbins: their chunks inside its heaps and clear of its tops."""
        own = self.spans[arena.address]
        near_tops = [(lo, hi) for lo, hi in self.tops if any(lo < e and s < hi for s, e in own)]
        for lst in arena.free_lists():
            where = list_name(arena, lst.kind, lst.index)
            if self.twice:
                for chunk in lst.chunks:
                    self.seen(chunk, where)
            for chunk, size in _misplaced(lst.chunks, lst.sizes, own, near_tops):
                self.placed(chunk, size, where, own, near_tops)

    def tcache(self, mem: Memory, owner: str, tcache: Tcache) -> None:
        """TCACHE's entries: of their bin's size, and (unless mmapped) inside some arena's heaps."""
        for b in tcache.bins:
            where = f"tcache bin {b.index} of {owner}"
            for entry in b.entries:
                chunk = entry - 16
                if self.twice:
                    self.seen(chunk, where)
                try:
                    size_field = u64(mem, chunk + 8)
                except ReadError:
                    continue  # the walker reported it
                size = size_field & ~SIZE_BITS
                if b.index < 64 and size != b.chunk_size:
                    self.out.append(Finding(Severity.ERROR, chunk, where, f"tcache entry {entry:#x} has chunk size "
                                            f"{size:#x}, its bin holds {b.chunk_size:#x}", Kind.TCACHE_SIZE,
                                            f"{b.chunk_size:#x}", f"{size:#x}"))
                if not size_field & IS_MMAPPED:
                    self.placed(chunk, size, where, self.every_span)


def _large_bins(mem: Memory, arena: Arena) -> list[Finding]:
    """Large bins are sorted by size, largest first, and the first chunk of each size links to the first of
    the next and previous sizes through fd_nextsize/bk_nextsize (a ring of those leaders)."""
    out: list[Finding] = []
    for lst in arena.bins:
        if lst.kind is not BinKind.LARGE or not lst.chunks or not lst.complete:
            continue
        where = list_name(arena, lst.kind, lst.index)
        sizes = lst.sizes
        unsorted_at = next((i for i in range(1, len(sizes)) if sizes[i] > sizes[i - 1]), None)
        if unsorted_at is not None:
            c = lst.chunks[unsorted_at]
            out.append(Finding(Severity.ERROR, c, where, f"chunk {c:#x} of size {sizes[unsorted_at]:#x} follows "
                               f"a smaller one ({sizes[unsorted_at - 1]:#x})", Kind.LARGE_ORDER,
                               f"at most {sizes[unsorted_at - 1]:#x}", f"{sizes[unsorted_at]:#x}"))
            continue
        leaders = [c for i, c in enumerate(lst.chunks) if i == 0 or sizes[i] != sizes[i - 1]]
        for i, leader in enumerate(leaders):
            want_fd, want_bk = leaders[(i + 1) % len(leaders)], leaders[i - 1]
            try:
                fd_next, bk_next = _QQ.unpack(mem.read(leader + 32, 16))
            except ReadError:
                continue
            for name, want, got in (("fd_nextsize", want_fd, fd_next), ("bk_nextsize", want_bk, bk_next)):
                if got != want:
                    out.append(Finding(Severity.ERROR, leader, where, f"{name} of chunk {leader:#x} is {got:#x}, "
                                       f"the next chunk size's first chunk is {want:#x}", Kind.NEXTSIZE,
                                       f"{want:#x}", f"{got:#x}"))
    return out


def _arena_flags(mem: Memory, layout: Layout, arena: Arena) -> list[Finding]:
    """The binmap marks every non-empty bin; have_fastchunks is set while any fastbin holds a chunk."""
    out: list[Finding] = []
    where = f"arena {arena.number}"
    try:
        binmap = struct.unpack("<4I", mem.read(arena.address + layout.off_binmap, 16))
    except ReadError:
        return out
    for lst in arena.bins:
        if lst.chunks and lst.index < NBINS and not binmap[lst.index >> 5] & (1 << (lst.index & 31)):
            out.append(Finding(Severity.ERROR, arena.address + layout.off_binmap + 4 * (lst.index >> 5), where,
                               f"bin {lst.index} holds {lst.count} chunk(s) but its binmap bit is clear",
                               Kind.BINMAP, "bit set", "bit clear"))
    if arena.have_fastchunks == 0 and any(b.chunks for b in arena.fastbins):
        out.append(Finding(Severity.WARNING, arena.address, where, "the fastbins hold chunks but have_fastchunks "
                           "is false (malloc would not consolidate them; or a free was mid-way)", Kind.FASTCHUNKS,
                           "true", "false"))
    return out


def _tcache_keys(state: HeapState, mem: Memory) -> list[Finding]:
    """Since 2.29 every tcache entry carries a key in its second word (the tcache struct's address up to
    2.33, one random value per process from 2.34); an entry without it was written to after its free."""
    holds = layout_for(state.glibc_version).tcache_key
    if not holds:
        return []
    keyed: list[tuple[int, int, str, int | None]] = []  # entry, key found, where, key expected
    for owner, tcache in state.tcaches():
        for b in tcache.bins:
            for entry in b.entries:
                try:
                    key = u64(mem, entry + 8)
                except ReadError:
                    continue
                want = tcache.address if holds == "tcache" else None
                keyed.append((entry, key, f"tcache bin {b.index} of {owner}", want))
    if holds == "random":
        common = Counter(k for _, k, _, _ in keyed).most_common(1)
        if not common or common[0][1] < 3 or common[0][1] * 2 <= len(keyed):
            return []  # too few entries to know the process's key
        keyed = [(e, k, w, common[0][0]) for e, k, w, _ in keyed]
    return [Finding(Severity.ERROR, entry, where, f"tcache entry {entry:#x} has key {key:#x}, not the tcache key "
                    f"{want:#x}: written to after it was freed", Kind.TCACHE_KEY, f"{want:#x}", f"{key:#x}")
            for entry, key, where, want in keyed if key != want]


def scope(state: HeapState) -> dict[str, int]:
    """What a check covered: arenas, heaps, chunks walked, free-list entries and tcaches."""
    return {"arenas": len(state.arenas), "heaps": sum(len(a.heaps) for a in state.arenas),
            "chunks": sum(sum(acc.counts.values()) for acc in state.accounts.values()),
            "listed": sum(b.count for a in state.arenas for b in a.free_lists())
            + sum(tc.count for _, tc in state.tcaches()),
            "tcaches": len(state.tcaches())}

