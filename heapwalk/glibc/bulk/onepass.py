"""The one-pass path of a whole decode: each arena's heaps swept once, its lists followed in the sweep, its
account and trim estimate summed from it, then the sweep dropped.

`decode.collect` hands each arena to `OnePass.lists` as it decodes it; the lists it returns are the
arena's, the careful walkers' otherwise.  The accounts are kept, and `results` gives the chunk walk those of
the arenas swept soundly whose memory no other arena's list reaches into (the careful walk of such an arena
would have found exactly this); the careful walkers take the others, so that damage in one arena costs the
careful walk of that arena, not of every one.
"""

from __future__ import annotations

import numpy as np

from heapwalk.analysis.pages import PagesSeen
from heapwalk.glibc.bulk.ahead import NOT_AHEAD, SweepsAhead
from heapwalk.glibc.walk.chunks import Extent, extents
from heapwalk.glibc.bulk.indexlists import PLAIN, IndexedLists, lists_of_sweep
from heapwalk.glibc.locate.layout import Layout
from heapwalk.glibc.model import Account, Arena, Tcache, TrimEstimate
from heapwalk.glibc.bulk.runs import HeapRuns, swept_runs
from heapwalk.glibc.bulk.sweep import SweepRoom, sweep_extents
from heapwalk.glibc.bulk.sweepwalk import FENCEPOST_CODE, TCACHE_CODE, TCACHE_STRUCT_CODE, walk_of_sweep
from heapwalk.inferior.memory import Memory
from heapwalk.inferior.residency import Residency

__all__ = ["OnePass", "LISTS_SWEPT_FROM", "in_use_lengths", "lengths_fit", "HEADER", "TAIL"]

#: a decode of the lists alone (no chunk walk) sweeps an arena only when its heaps hold more than this.  Below
#: it, following the lists through memory costs a few tens of milliseconds either way, and less when few chunks
#: are free; above it, a sweep costs at most about a second a GiB, while the careful walkers pay about half a
#: microsecond a listed chunk, and more when lists hop across an arena bigger than their block cache
#: (measured in docs/performance.md)
LISTS_SWEPT_FROM = 16 << 20
#: a chunk's header before its user memory, and the part of the next chunk's header it owns: a chunk in use is
#: the block [chunk + HEADER, chunk + size + TAIL) to the leak scan
HEADER, TAIL = 16, 8
#: chunks whose lengths are made at a time
_STEP = 1 << 20


class OnePass:
    """Sweeps arenas as they are decoded and keeps what they give (see the module)."""

    def __init__(self, mem: Memory, layout: Layout, tcaches: list[Tcache], thp_pagesize: int,
                 main_contiguous: bool, progress=None, total: int = 0, lists_only: bool = False,
                 residency: Residency | None = None, keep_used: bool = False, keep_chunks: bool = False,
                 pages: PagesSeen | None = None, page: int = 4096):
        self.mem, self.layout, self.lists_only, self.residency = mem, layout, lists_only, residency
        self.tcached = _tcached(tcaches)
        self.thp_pagesize, self.main_contiguous, self.page = thp_pagesize, main_contiguous, page
        self.progress, self.total, self.done = progress, total, 0
        self.accounts: dict[int, tuple[Account, TrimEstimate]] = {}
        self.keep_used = keep_used
        self.pages = pages
        self.used: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.keep_chunks = keep_chunks
        self.room = SweepRoom()
        self.chunks: dict[int, dict[int, HeapRuns]] = {}     # by arena, each heap's runs by its start
        self.failed: set[int] = set()
        self.spans: list[tuple[int, int]] = []
        self.extents: dict[int, list[tuple[int, int]]] = {}
        self._ahead: SweepsAhead | bool | None = None   # None: not asked yet; False: not on this memory

    @property
    def sweeps_ahead(self) -> bool:
        """Whether `ahead` sweeps on a thread of heapwalk's own (the memory can be read there)."""
        if self._ahead is None:
            self._ahead = SweepsAhead.of(self.mem, self.room, self.pages) or False
        return bool(self._ahead)

    def ahead(self, arena: Arena) -> None:
        """Starts the sweep of ARENA (as decoded so far, without its lists), the arena `lists` is given next, on
        a thread of heapwalk's own where `sweeps_ahead` and its heaps hold `ahead.AHEAD_FROM` bytes or more:
        `lists` takes it when ARENA's turn comes."""
        arena_extents = self._sweepable(arena) if self.sweeps_ahead else None
        if arena_extents is not None:
            self._ahead.start(arena.address, arena_extents, arena.top)

    def _sweepable(self, arena: Arena) -> list[Extent] | None:
        """ARENA's extents in address order (the sweep's arrays are then sorted: a newer heap may lie below an
        older one), or None where this pass leaves the arena to the careful walkers."""
        if arena.is_main and arena.noncontiguous or not arena.lists_known:
            return None
        arena_extents = sorted(extents(arena, self.layout), key=lambda e: e.start)
        if any(not 0 <= e.start <= e.first <= e.end < 1 << 64 for e in arena_extents) or \
                any(b.start < a.end for a, b in zip(arena_extents, arena_extents[1:])):
            return None                      # bounds from damaged fields: the careful walkers say which
        if self.lists_only and sum(e.end - e.start for e in arena_extents) <= LISTS_SWEPT_FROM:
            return None
        return arena_extents

    def lists(self, arena: Arena, raw_arena: bytes) -> IndexedLists | None:
        """ARENA's lists (ARENA as decoded so far, without them; RAW_ARENA its malloc_state's bytes) from a
        sweep of its heaps, its account and trim estimate kept; None when the sweep cannot vouch for them."""
        lists = None
        arena_extents = self._sweepable(arena)
        if arena_extents is None:
            self.failed.add(arena.address)
            return None
        self.spans.extend((e.start, e.end) for e in arena_extents)
        self.extents[arena.address] = [(e.start, e.end) for e in arena_extents]
        tick = None if self.progress is None else (lambda walked, base=self.done: self.progress(base + walked,
                                                                                             self.total))
        sweep = self._ahead.take(arena.address, tick) if self._ahead else NOT_AHEAD
        if sweep is None or sweep is NOT_AHEAD:          # none ahead, or it gave up: swept here, as in turn
            sweep = sweep_extents(self.mem, arena_extents, arena.top, tick, self.pages, self.room)
        self.done += sum(e.end - e.start for e in arena_extents)
        if sweep is not None:
            lists = lists_of_sweep(sweep, self.layout, arena.address, raw_arena, arena.system_mem)
        walked = None
        if lists is not None and not self.lists_only:
            walked = walk_of_sweep(self.mem, self.layout, arena, sweep, lists.codes, self.tcached,
                                   self.thp_pagesize, self.main_contiguous, self.residency,
                                   self.pages,
                                   self.page)
        if walked is None:
            self.failed.add(arena.address)
        else:
            self.accounts[arena.address] = walked
            if self.keep_used:
                plain = lists.codes == PLAIN         # a byte a chunk, not the 8 of its row's index
                self.used[arena.address] = in_use_lengths(sweep.address[plain], sweep.sizes[plain])
            if self.keep_chunks:       # the codes as the walk left them: tcache, top and fenceposts marked
                self.chunks[arena.address] = swept_runs(sweep.address, sweep.sizes, lists.codes, sweep.segments,
                                                        FENCEPOST_CODE)
        if sweep is not None:          # nothing above keeps its columns
            self.room.give_back(sweep)
        return lists

    def swept_all(self) -> None:
        """Lets the room of the sweeps go, and the sweeps ahead not taken: no arena is swept after this."""
        if self._ahead:
            self._ahead.close()
        self._ahead = False
        self.room = SweepRoom()

    def results(self, arenas: tuple[Arena, ...]) -> dict[int, tuple[Account, TrimEstimate]] | None:
        """The accounts and trim estimates of those of ARENAS (the state's, as finally decoded) whose walk the
        sweep stands for (None: none of them): each swept soundly, when no two swept arenas share memory and
        no list of an arena the careful walkers take holds a chunk inside it (the careful walk of an arena
        looks only at its own memory and at the chunks listed inside it, so it would find exactly this)."""
        spans = sorted(self.spans)
        if any(b[0] < a[1] for a, b in zip(spans, spans[1:])):
            return None
        kept = {a.address: self.accounts[a.address] for a in arenas if a.address in self.accounts}
        careful = [a for a in arenas if a.address not in kept]
        if careful and kept:
            listed = np.unique(np.concatenate([np.zeros(0, dtype=np.uint64)] + [
                np.asarray(lst.chunks, dtype=np.uint64) for a in careful for lst in a.free_lists()]))
            for address in [k for k in kept if _holds_any(self.extents[k], listed)]:
                del kept[address]
        return kept or None


def _holds_any(spans: list[tuple[int, int]], chunks: np.ndarray) -> bool:
    """Whether any of CHUNKS (sorted) lies in one of SPANS."""
    for start, end in spans:
        i = int(np.searchsorted(chunks, np.uint64(start)))
        if i < len(chunks) and int(chunks[i]) < end:
            return True
    return False


def _tcached(tcaches: list[Tcache]) -> tuple[np.ndarray, np.ndarray]:
    """The chunk of every tcache entry and tcache struct, sorted, and each one's listing code (a struct's chunk
    wins over an entry at the same address, as the careful walk's listing has it)."""
    chunks: dict[int, int] = {}
    for tcache in tcaches:
        for b in tcache.bins:
            for entry in b.entries:
                chunks.setdefault(entry - 16, TCACHE_CODE)
    for tcache in tcaches:
        chunks[tcache.address - 16] = TCACHE_STRUCT_CODE
    keys = sorted(chunks)
    return np.array(keys, dtype=np.uint64), np.array([chunks[k] for k in keys], dtype=np.uint8)


def in_use_lengths(address: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """In-use chunks at ADDRESS of SIZES (int64 or uint64) as the one pass keeps them for the blocks
    (`account.blocks.blocks_of`): the addresses, and the usable lengths in `view.LENGTH_UNIT`s (uint32) where every
    chunk's fits, else the sizes (uint64): 12 bytes a chunk, not 16."""
    sizes = sizes.view(np.uint64) if sizes.dtype == np.int64 else sizes
    if not lengths_fit(sizes):
        return address, sizes
    lengths = np.empty(len(sizes), dtype=np.uint32)
    for at in range(0, len(sizes), _STEP):               # no array of 8 bytes a chunk made on the way
        part = sizes[at:at + _STEP] - np.uint64(HEADER - TAIL)
        lengths[at:at + _STEP] = np.right_shift(part, np.uint64(3), out=part)
    return address, lengths


def lengths_fit(sizes: np.ndarray) -> bool:
    """Whether every chunk of SIZES (uint64; lengths, uint32, are) has a usable length `view.Blocks` keeps in 32
    bits."""
    if sizes.dtype == np.uint32 or not len(sizes):
        return True
    return int(sizes.min()) >= HEADER - TAIL and (int(sizes.max()) - (HEADER - TAIL)) >> 3 < 1 << 32 and \
        not any(np.any(sizes[at:at + _STEP] & np.uint64(7)) for at in range(0, len(sizes), _STEP))
