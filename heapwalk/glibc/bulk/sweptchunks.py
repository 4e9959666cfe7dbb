"""The chunks `heapwalk chunks` lists, an arena at a time, from a sweep of its heaps (`sweep`) instead of the
careful walk, when the sweep shows nothing the careful walk would stop at.

The careful walk (`chunkwalk.walk_batches`) gives each chunk its state from the state's `Listing` (every
list and tcache of every arena), top and the fenceposts.  Here the same comes from whole arrays: each swept
chunk is looked up in the listing, top and the fenceposts are marked, and the sweep is used only when every
chunk's neighbour agrees with its state, each held chunk has its arena's NON_MAIN_ARENA bit, every listed
address inside the arena's heaps is a chunk's start and the bytes add up to system_mem.  Then the careful
walk would find nothing either and meet the very same chunks; otherwise it takes the arena and says what is
wrong.  Only the chunks a command shows become Python objects.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from heapwalk.glibc.walk.chunks import Chunk, Extent, Listing, extents
from heapwalk.glibc.bulk.ahead import NOT_AHEAD, SweepsAhead
from heapwalk.glibc.bulk.indexlists import PLAIN
from heapwalk.glibc.locate.layout import Layout
from heapwalk.glibc.model import Arena
from heapwalk.glibc.bulk.sweep import Sweep, SweepRoom, sweep_extents
from heapwalk.glibc.bulk.sweepwalk import STATE_OF_CODE, tally_of_sweep
from heapwalk.inferior.memory import Memory

__all__ = ["SweptChunks", "Sweeper", "listing_arrays", "swept_chunks"]

_FREE_CODES = (1, 2, 3, 4, 5)            # tcache, fast, unsorted, small, large: FREE_STATES the sweep can see
_USED_CODES = (PLAIN, 0)                  # in use, tcache struct


class SweptChunks:
    """An arena's chunks as swept, each with its listing code and size: `select` picks rows, `chunks` makes
    them `Chunk`s."""

    def __init__(self, sweep: Sweep, codes: np.ndarray, sizes: np.ndarray):
        self.sweep, self.codes, self.sizes = sweep, codes, sizes

    def select(self, free: bool, used: bool, min_size: int, max_size: int | None) -> np.ndarray:
        """The indices of the chunks that are free (or used, or either) and of a size in range."""
        keep = np.ones(len(self.codes), dtype=bool)
        if free:
            keep &= np.isin(self.codes, _FREE_CODES)
        if used:
            keep &= np.isin(self.codes, _USED_CODES)
        if min_size:
            keep &= self.sizes >= min_size
        if max_size is not None:
            keep &= self.sizes <= max_size
        return np.flatnonzero(keep)

    def chunks(self, rows: np.ndarray) -> Iterator[Chunk]:
        """The chunks at ROWS, as the careful walk would give them."""
        segments = self.sweep.segments
        heap = np.searchsorted(np.array([s.hi for s in segments], dtype=np.int64), rows, side="right")
        starts = np.array([s.extent.start for s in segments], dtype=np.uint64)[heap].tolist()
        address, field = self.sweep.address[rows].tolist(), self.sweep.field[rows].tolist()
        codes = self.codes[rows].tolist()
        for a, f, code, start in zip(address, field, codes, starts):
            yield Chunk(a, f & ~7, f & 7, STATE_OF_CODE[code], start)


def listing_arrays(listing: Listing) -> tuple[np.ndarray, np.ndarray]:
    """LISTING's addresses (sorted, uint64) and the code of each (`Listing.arrays`)."""
    return listing.arrays()


class Sweeper:
    """The sweeps `swept_chunks` takes arena after arena: where the memory may be read on another thread (a core
    file's own bytes), the sweep of an arena of `ahead.AHEAD_FROM` bytes or more started ahead
    (`ahead.SweepsAhead`, its room its own: the chunks a command was given keep theirs) while the caller lists
    the arena before; in turn otherwise, and where a sweep ahead gave up."""

    def __init__(self, mem: Memory, layout: Layout):
        self.mem, self.layout = mem, layout
        self._ahead: SweepsAhead | None | bool = None           # made for the first arena started

    def start(self, arena: Arena) -> None:
        """Starts sweeping ARENA ahead, where it is swept at all and holds enough."""
        arena_extents = _sweepable(arena, self.layout)
        if arena_extents is None:
            return
        if self._ahead is None:
            self._ahead = SweepsAhead.of(self.mem, SweepRoom(), None) or False
        if self._ahead:
            self._ahead.start(arena.address, arena_extents, arena.top)

    def sweep(self, arena: Arena, arena_extents: list[Extent]) -> Sweep | None:
        """ARENA's sweep: the one started ahead, else made now."""
        if self._ahead:
            sweep = self._ahead.take(arena.address)
            if sweep is not None and sweep is not NOT_AHEAD:
                return sweep
        return sweep_extents(self.mem, arena_extents, arena.top)

    def close(self) -> None:
        """Lets go the sweeps not taken, and the thread."""
        if self._ahead:
            self._ahead.close()


def _sweepable(arena: Arena, layout: Layout) -> list[Extent] | None:
    """ARENA's extents as `swept_chunks` sweeps them, or None where it leaves the arena to the careful walk."""
    if arena.is_main and arena.noncontiguous or not arena.lists_known:
        return None
    arena_extents = extents(arena, layout)
    if any(not 0 <= e.start <= e.first <= e.end < 1 << 64 for e in arena_extents):
        return None
    return arena_extents


def swept_chunks(mem: Memory, layout: Layout, arena: Arena, listed: tuple[np.ndarray, np.ndarray],
                 sweeper: Sweeper | None = None) -> SweptChunks | None:
    """ARENA's chunks from one sweep of its heaps (SWEEPER's, when given), with their states from LISTED
    (`listing_arrays` of the state's listing); None when the careful walk must take the arena (see the
    module)."""
    arena_extents = _sweepable(arena, layout)
    if arena_extents is None:
        return None
    sweep = sweep_extents(mem, arena_extents, arena.top) if sweeper is None else \
        sweeper.sweep(arena, arena_extents)
    if sweep is None:
        return None
    codes = _listed_codes(sweep, listed)
    if codes is None:
        return None
    sizes = sweep.sizes
    if tally_of_sweep(arena, sweep, codes, sizes) is None:
        return None
    return SweptChunks(sweep, codes, sizes)


def _listed_codes(sweep: Sweep, listed: tuple[np.ndarray, np.ndarray]) -> np.ndarray | None:
    """Each swept chunk's listing code (PLAIN if no list holds it); None when a listed address inside the
    sweep's extents is not a chunk's start."""
    addresses, their_codes = listed
    codes = np.full(sweep.count, PLAIN, dtype=np.uint8)
    for segment in sweep.segments:
        lo = int(np.searchsorted(addresses, np.uint64(segment.extent.start)))
        hi = int(np.searchsorted(addresses, np.uint64(segment.extent.end)))
        if lo == hi:
            continue
        inside = addresses[lo:hi]
        at = np.searchsorted(sweep.address[segment.lo:segment.hi], inside) + segment.lo
        if np.any(at >= segment.hi) or np.any(sweep.address[np.minimum(at, segment.hi - 1)] != inside):
            return None
        codes[at] = their_codes[lo:hi]
    return codes
