"""An arena's free lists followed through a `Sweep` instead of through memory.

Each fastbin and regular bin starts at its head in the arena and goes on through the fd (or safe-linked next)
the sweep kept of each chunk.  Links are looked up among the sweep's sorted addresses in a `native.ChunkDirectory`
(a few chunks' bytes an entry): the bins' free chunks, nearly all of them listed, all at once (`native.linked`),
so that following a bin is a step through an array of indices; the fastbins' few, a hop at a time, never every
small chunk in use.  The checks the careful walkers make of a sound list (each bk mirrors its fd, each size
belongs in its bin, the list ends at its head or at NULL, it is not longer than the arena can hold, no chunk is
in two lists, a bin's chunks are free and a fastbin's in use) are made in the same C call (`native.walk_linked`,
`native.walk_list`), or on the list's arrays in numpy where the library was not built (every candidate's link
looked up at once with a `Locator`).  A list that fails any of them, or leads anywhere but to a chunk the sweep
met, gives None: the careful walkers then take the arena.
"""

from __future__ import annotations

import struct
from array import array
from functools import partial

import numpy as np

from heapwalk.glibc.locate.layout import MINSIZE, NBINS, NSMALLBINS, Layout
from heapwalk.glibc.walk.lists import MAX_LIST, bin_kind
from heapwalk.glibc.model import BinKind, BinList
from heapwalk.glibc.bulk.native import (LINKED_MAX, ChunkDirectory, follow, linked, lists_native, successors,
                                        walk_linked, walk_list)
from heapwalk.glibc.bulk.sweep import Sweep
from heapwalk.analysis.lookup import Locator
from heapwalk.common.arrays import staggered
from heapwalk.common.view import LENGTH_UNIT

__all__ = ["IndexedLists", "lists_of_sweep", "PLAIN", "FREE", "IN_USE", "ANY", "bin_indices"]

#: a chunk's code before any list claims it (`chunks.LIST_CODES` otherwise)
PLAIN = 255
_FAST_CODE, _UNSORTED_CODE, _SMALL_CODE, _LARGE_CODE = 2, 3, 4, 5


class IndexedLists:
    """An arena's lists as `decode_arena` gives them, and each swept chunk's listing code (PLAIN if none)."""

    __slots__ = ("fastbins", "unsorted", "bins", "codes")

    def __init__(self, fastbins: tuple[BinList, ...], unsorted: BinList, bins: tuple[BinList, ...],
                 codes: np.ndarray):
        self.fastbins, self.unsorted, self.bins, self.codes = fastbins, unsorted, bins, codes


def bin_indices(sizes: np.ndarray) -> np.ndarray:
    """glibc's bin_index of each chunk size (sizes of at least MINSIZE), as int64."""
    s = sizes.astype(np.int64)
    return np.select([s < NSMALLBINS * 16, (s >> 6) <= 48, (s >> 9) <= 20, (s >> 12) <= 10, (s >> 15) <= 4,
                      (s >> 18) <= 2],
                     [s >> 4, 48 + (s >> 6), 91 + (s >> 9), 110 + (s >> 12), 119 + (s >> 15), 124 + (s >> 18)],
                     126)


def _bin_ranges() -> tuple[tuple[int, int], ...]:
    """For each bin index, the sizes [lo, hi) `bin_indices` gives it (glibc's bin_index grows with the size, and
    every size it steps at is a multiple of 16 below 1 MiB; sizes of 2**63 and more it gives no bin)."""
    grid = np.arange(0, 1 << 20, 16, dtype=np.uint64)
    firsts = np.searchsorted(bin_indices(grid), np.arange(NBINS + 1), side="left") * 16
    return tuple((int(firsts[i]), int(firsts[i + 1]) if firsts[i + 1] < 1 << 20 else 1 << 63) for i in range(NBINS))


#: `bin_indices`'s sizes of each bin, so that a list is checked with two comparisons
_BIN_RANGES = _bin_ranges()


def lists_of_sweep(sweep: Sweep, layout: Layout, arena: int, raw_arena: bytes, system_mem: int
                   ) -> IndexedLists | None:
    """ARENA's fastbins, unsorted bin and small and large bins, followed through SWEEP (RAW_ARENA: the bytes
    of its malloc_state); None when any of them is not sound."""
    bound = min(max(system_mem, 1 << 20) // MINSIZE + 1, MAX_LIST)
    walk = _Walk(sweep, min(bound, sweep.count + 1), bound, (layout.nfastbins + 1) * 16)
    fastbins = []
    if layout.nfastbins:
        heads = struct.unpack_from(f"<{layout.nfastbins}Q", raw_arena, layout.off_fastbins)
        for i, head in enumerate(heads):
            size = (i + 2) * 16
            listed = walk.list(IN_USE, head, 0, layout.safe_linking, size, size, None, _FAST_CODE)
            if listed is None:
                return None
            fastbins.append(BinList(BinKind.FAST, i, arena + layout.off_fastbins + 8 * i, *listed, True))
    regular = []
    for index in range(1, NBINS):
        head = layout.bin_header(arena, index)
        fd, bk = struct.unpack_from("<QQ", raw_arena, head + 16 - arena)
        lo, hi = (MINSIZE, 1 << 64) if index == 1 else _BIN_RANGES[index]
        code = _UNSORTED_CODE if index == 1 else _SMALL_CODE if index < NSMALLBINS else _LARGE_CODE
        listed = walk.list(FREE, fd, head, False, lo, hi - 1, bk, code)
        if listed is None:
            return None
        regular.append(BinList(bin_kind(index), index, head, *listed, True))
    return IndexedLists(tuple(fastbins), regular[0], tuple(regular[1:]), walk.codes)


#: the chunks a list may hold: those the next chunk says are free (the bins'), in use (the fastbins'), or any
FREE, IN_USE, ANY = 1, 0, -1


class _Walk:
    """The lists of one swept arena followed and judged one at a time, in one C call each when the library has it
    (`native.walk_list`, each link looked up as it is met), else in numpy (every candidate's link looked up at
    once, `_successors`); each list's chunks claimed in CODES (PLAIN when no list holds one).  FAST_MAX: the
    largest size a chunk in use may have to be followed in numpy (the fastbins' largest)."""

    def __init__(self, sweep: Sweep, steps: int, bound: int, fast_max: int = (1 << 64) - 1):
        self.sweep, self.steps, self.bound, self.fast_max = sweep, steps, bound, fast_max
        self.codes = np.full(sweep.count, PLAIN, dtype=np.uint8)
        self.native = lists_native()
        self._directory: ChunkDirectory | None = None
        self._linked: dict[tuple[int, bool], np.ndarray] = {}              # C: `native.linked`, by (want, safe)
        self._links: dict[tuple[int, bool], tuple[np.ndarray, object]] = {}  # numpy: `_candidates`
        self._starts: Locator | None = None
        if self.native:
            self.chunks = tuple(np.ascontiguousarray(a, dtype=np.uint64)
                                for a in (sweep.address, sweep.field, sweep.fd, sweep.bk))
            self.out = (staggered(steps, np.uint64, 0), staggered(steps, np.uint64, 1),
                        staggered(steps, np.int64, 2))

    def list(self, want: int, first: int, end: int, safe: bool, lo: int, hi: int, head_bk: int | None,
             code: int) -> tuple[array, array] | None:
        """The addresses and size fields of the list from the chunk at FIRST (a bin's fd) to END (its head, or NULL),
        every chunk as WANT says (FREE, IN_USE or ANY), each chunk's link undone of safe-linking when SAFE, every
        size in [LO, HI], each bk leading back and the head's bk HEAD_BK to the last when HEAD_BK is given, its
        chunks claimed with CODE; None when it is not sound."""
        chunks = array("Q")
        count = NotImplemented
        if self.native and first != end:
            if self._directory is None:
                self._directory = ChunkDirectory(self.chunks[0], _spans(self.sweep))
            if want == FREE and self.sweep.count <= LINKED_MAX:   # most free chunks are listed: linked at once
                if (want, safe) not in self._linked:
                    self._linked[want, safe] = linked(self.chunks, self._directory, want, safe)
                count = walk_linked(self._linked[want, safe], self.chunks, want, first, end, safe, self.steps,
                                    self.bound, lo, hi, head_bk, self.codes, PLAIN, code, self.out)
            else:                    # a few of the chunks in use: a lookup a hop
                count = walk_list(self.chunks, self._directory, want, first, end, safe, self.steps, self.bound, lo,
                                  hi, head_bk, self.codes, PLAIN, code, self.out)
        if count is None:
            return None
        if count is not NotImplemented:
            chunks.frombytes(self.out[0][:count].view(np.uint8))
            return chunks, _fields(self.out[1][:count])
        if first == end:
            return (chunks, _fields(np.zeros(0, dtype=np.uint64))) if head_bk is None or head_bk == end else None
        sweep = self.sweep
        next_link = partial(_fast_next, sweep, True) if safe else partial(_fd, sweep)
        candidate, links = self._candidates(want, safe)
        order = _follow(sweep.address, links, next_link, first, end, self.bound)
        if order is None or not candidate[order].all() or \
                head_bk is not None and not _mirrored(sweep.address, sweep.bk, order, end, head_bk):
            return None
        if len(order) and not _sizes_in(sweep.sizes.view(np.uint64)[order], lo, hi + 1):
            return None
        if not _claim(self.codes, order, code):
            return None
        if len(order):
            chunks.frombytes(sweep.address[order].tobytes())
        return chunks, _fields(sweep.field[order])

    def _candidates(self, want: int, safe: bool) -> tuple[np.ndarray, object]:
        """The chunks a list of WANT may hold (a mask) and each one's successor (`native.successors`, its link
        undone of safe-linking when SAFE), made once."""
        if (want, safe) not in self._links:
            sweep, n = self.sweep, self.sweep.count
            free = np.zeros(n, dtype=bool)       # the chunks whose next chunk says they are free
            free[:-1] = (sweep.field[1:] & np.uint64(1)) == 0
            candidate = free if want == FREE else ~free if want == IN_USE else np.ones(n, dtype=bool)
            rows = np.flatnonzero(candidate & (sweep.sizes.view(np.uint64) <= np.uint64(self.fast_max))
                                  if want == IN_USE else candidate)
            nexts = sweep.fd[rows]
            if safe:
                nexts = nexts ^ ((sweep.address[rows] + np.uint64(16)) >> np.uint64(12))
            if self._starts is None:             # every chunk's first 16 bytes, looked up in: made once
                self._starts = Locator(sweep.address, None, np.full(n, 16 // LENGTH_UNIT, dtype=np.uint32))
            self._links[want, safe] = (candidate, _successors(sweep.address, self._starts, nexts, rows,
                                                        np.empty(n, dtype=np.int64)))
        return self._links[want, safe]


def _spans(sweep: Sweep) -> list[tuple[int, int]]:
    """The spans SWEEP's chunks lie in, one an extent swept (from its first chunk to just past its last's start),
    or one for them all when the sweep says no extents."""
    address = sweep.address
    if not len(address):
        return []
    if not sweep.segments:
        return [(int(address[0]), int(address[-1]) + 1)]
    return [(int(address[s.lo]), int(address[s.hi - 1]) + 1) for s in sweep.segments if s.hi > s.lo]


def _fields(fields: np.ndarray) -> array:
    """A list's size fields (uint64) as `BinList.raw_sizes` keeps them: 4 bytes each where every one fits (a free
    chunk under 4 GiB), else 8."""
    if len(fields) and int(fields.max()) >= 1 << 32:
        return array("Q", fields.astype(np.uint64).tobytes())
    return array("I", fields.astype(np.uint32).tobytes())


def _fd(sweep: Sweep, j: int) -> int:
    """The fd of the swept chunk J."""
    return int(sweep.fd[j])


def _fast_next(sweep: Sweep, safe_linking: bool, j: int) -> int:
    """The next chunk's address a fastbin entry J links to (its fd, safe-linking undone)."""
    fd = int(sweep.fd[j])
    return fd ^ ((int(sweep.address[j]) + 16) >> 12) if safe_linking else fd


def _successors(address: np.ndarray, starts: Locator, targets: np.ndarray, rows: np.ndarray, out: np.ndarray):
    """For each chunk of ADDRESS, the index of the chunk its link points to (TARGETS: the links of the chunks at
    ROWS, those that may be in the lists followed), into OUT; -1 when that is no chunk's start, or the chunk is
    not among ROWS.  Looked up with STARTS (a `Locator` of the chunks' first 16 bytes: a table of about one
    slots a chunk, in C), whatever the order of the links, in memory bounded by the chunks, not the bytes.  In
    the form `native.follow` takes."""
    out.fill(-1)
    found = starts(targets)
    hit = np.flatnonzero(found >= 0)
    hit = hit[address[found[hit]] == targets[hit]]
    out[rows[hit]] = found[hit]
    return successors(out)


def _follow(address: np.ndarray, links, next_link, first: int, end: int, bound: int) -> np.ndarray | None:
    """The indices of the list's chunks from FIRST, through LINKS (`native.successors`), until a chunk's link
    (NEXT_LINK of its index) is END; None when a link leads elsewhere, or the list is BOUND long (or loops)."""
    if first == end:
        return np.zeros(0, dtype=np.int64)
    j = int(np.searchsorted(address, np.uint64(first)))
    if j >= len(address) or int(address[j]) != first:
        return None
    order = follow(links, j, min(bound, len(address) + 1))
    if order is None or next_link(int(order[-1])) != end or len(order) >= bound:
        return None
    return order


def _sizes_in(sizes: np.ndarray, lo: int, hi: int) -> bool:
    """Whether every one of SIZES lies in [LO, HI)."""
    return not (np.any(sizes < np.uint64(lo)) or (hi < 1 << 64 and np.any(sizes >= np.uint64(hi))))


def _mirrored(address: np.ndarray, bk: np.ndarray, order: np.ndarray, head: int, head_bk: int) -> bool:
    """Whether each chunk's bk in ORDER leads back to the one before it (the first's to HEAD), and the head's
    bk HEAD_BK to the last."""
    if not len(order):
        return head_bk == head
    back = bk[order]
    return (int(back[0]) == head and head_bk == int(address[order[-1]])
            and bool(np.all(back[1:] == address[order[:-1]])))


def _claim(codes: np.ndarray, order: np.ndarray, code: int) -> bool:
    """Marks ORDER's chunks as listed with CODE; False when a list holds one of them already."""
    if not len(order):
        return True
    if np.any(codes[order] != PLAIN):
        return False
    codes[order] = code
    return True
