"""Which block each of millions of words points into, for the leak scan: in C through a table of slots when
`pip install` built heapwalk's small library (`_reach.c`, `hw_locate`), with numpy's searchsorted otherwise.

numpy's searchsorted costs a binary search over every block for each word, a cache miss at most of its steps
when the words point anywhere in the heaps.  The table cuts the stretches of memory that hold blocks into
slots (one or half a one per block) and keeps for each slot the last block starting at or below it, so a word's search
starts within a block or two of its answer.  Both forms give the same answers (tests/unit/analysis/test_lookup.py);
HEAPWALK_PURE=1 in the environment turns the library off.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from heapwalk.common.view import LENGTH_UNIT
from heapwalk.inferior.clib import built_library

__all__ = ["Locator", "NATIVE", "merge_blocks", "nonzero_pages", "text_words",
           "FirstHits"]

#: the version of `_reach.c`'s arguments this module calls them with (`hw_reach_abi`)
ABI = 9
#: blocks further apart than this start a new stretch of the table (the memory between is given no slots)
GAP = 1 << 20
#: the smallest slot, in bytes (a power of two)
MIN_SLOT = 64
#: blocks the table gives a slot, at least (between this many and twice as many: a word's search then starts a few
#: blocks from its answer).  At 2, about a byte a block: on the large mimalloc 3 bench core `leaks` peaked 4 MiB
#: lower than at 1 (two bytes a block), the scan as fast; at 4 it took a fifth longer; at half (two slots a block,
#: 4 bytes) a report on the large jemalloc core was 2% faster
BLOCKS_A_SLOT = 2


def _load():
    """The built library's lookup, or None (see `inferior.clib`; also when the library was built from older
    sources that lack a function)."""
    lib = built_library(Path(__file__).parent, "_reach", ("hw_reach_abi",))
    try:
        return _declared(lib) if lib is not None and lib.hw_reach_abi() == ABI else None
    except AttributeError:
        return None


def _declared(lib):
    """LIB with the types of the functions used here declared."""
    if lib is not None:
        p, i64, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64
        blocks = [p, p, p, i64]                        # starts, ends, lengths, how many
        table = [p, p, p, i64, p, i64, i64]            # lo, slots, first, stretches, table, bases, shift
        lib.hw_locate.restype = None
        lib.hw_locate.argtypes = [p, i64] + blocks + table + [p]
        lib.hw_locate_sorted.restype = None
        lib.hw_locate_sorted.argtypes = [p, i64] + blocks + [i64, p]
        lib.hw_first_hits.restype = None
        lib.hw_first_hits.argtypes = [p, p, i64, ctypes.c_int32, p, p, p]
        lib.hw_root_window.restype = i64
        lib.hw_root_window.argtypes = [p, i64, u64, u64, u64] + blocks + table + [ctypes.c_int32] + [p] * 6
        lib.hw_scan_rows.restype = i64
        lib.hw_scan_rows.argtypes = [p, i64, u64, u64, u64] + blocks + [i64] + table + [p] * 3 + [i64, p, i64, i64] + \
            [p] * 6 + [i64] + [p] * 3
        lib.hw_table_packed.restype = i64
        lib.hw_table_packed.argtypes = [p, p, i64, i64, p, i64, p, i64]
        lib.hw_merge_blocks.restype = ctypes.c_int64
        lib.hw_merge_blocks.argtypes = ([ctypes.c_void_p] * 3 + [ctypes.c_int64]) * 2 + [ctypes.c_void_p, ctypes.c_int64] \
            + [ctypes.c_void_p] * 3
        lib.hw_table.restype = None
        lib.hw_table.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                 ctypes.c_int64, ctypes.c_void_p]
        lib.hw_nonzero_pages.restype = None
        lib.hw_nonzero_pages.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        lib.hw_text_words.restype = None
        lib.hw_text_words.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    return lib


_LIB = _load()
#: whether the C lookup is in use
NATIVE = _LIB is not None


class Locator:
    """The blocks [STARTS[i], ENDS[i]) (uint64, sorted, apart), and the lookup of words among them.  The ends may
    be given as LENGTHS instead (ENDS None: uint32 in units of `view.LENGTH_UNIT`, as `view.Blocks` keeps them)."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray | None, lengths: np.ndarray | None = None):
        self.starts = np.ascontiguousarray(starts, dtype=np.uint64)
        self.ends = None if ends is None else np.ascontiguousarray(ends, dtype=np.uint64)
        self.lengths = None if ends is not None else np.ascontiguousarray(lengths, dtype=np.uint32)
        self.lo = np.uint64(self.starts[0]) if len(self.starts) else np.uint64(1)
        self.hi = np.uint64(self._end(len(self.starts) - 1)) if len(self.starts) else np.uint64(0)
        self._table = self._build() if _LIB is not None and len(self.starts) else None
        self._scratch: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _build(self):
        """The stretches' starts, slot counts and first slots, the table, and the slot's shift (see `_reach.c`)."""
        cut = self._gaps()
        first_block = np.concatenate(([0], cut))
        last_block = np.concatenate((cut, [len(self.starts)])) - 1
        lo = self.starts[first_block]
        last_end = self._end(last_block)
        span = np.where(last_end > lo, last_end - lo, 0).astype(np.int64)
        total = int(span.sum())
        shift = max(MIN_SLOT.bit_length() - 1, (max(total * BLOCKS_A_SLOT // len(self.starts), 1) - 1).bit_length())
        slots = (span + (1 << shift) - 1) >> shift
        first = np.concatenate(([0], np.cumsum(slots)[:-1])).astype(np.int64)
        lo, slots = np.ascontiguousarray(lo), np.ascontiguousarray(slots, dtype=np.int64)
        table, nbases = self._table_of(lo, slots, shift)
        return lo, slots, first, table, nbases, shift

    def _table_of(self, lo: np.ndarray, slots: np.ndarray, shift: int) -> tuple[np.ndarray, int]:
        """The table of the stretches from LO, SLOTS slots each of 1 << SHIFT bytes, and one entry past them: packed,
        a base for each 32 entries and 16 bits an entry (a little over half the room), as `_reach.c`'s entry reads
        it, and how many bases; whole (int32) and 0 where an entry lies too far from its group's base."""
        n = int(slots.sum()) + 1
        nbases = (n >> 5) + 1
        packed = np.empty(nbases + (n + 1) // 2, dtype=np.int32)
        if _LIB.hw_table_packed(lo.ctypes.data, slots.ctypes.data, len(lo), shift, self.starts.ctypes.data,
                                len(self.starts), packed.ctypes.data, n) == 0:
            return packed, nbases
        del packed
        table = np.empty(n, dtype=np.int32)
        _LIB.hw_table(lo.ctypes.data, slots.ctypes.data, len(lo), shift, self.starts.ctypes.data, len(self.starts),
                      table.ctypes.data)
        table[-1] = len(self.starts) - 1
        return table, 0

    def _gaps(self, step: int = 1 << 18) -> np.ndarray:
        """The blocks that start more than GAP past the end of the block before them (where damage made blocks
        overlap there is no gap), STEP blocks at a time: no array of a block each is made."""
        parts = [np.zeros(0, dtype=np.int64)]
        for at in range(0, len(self.starts) - 1, step):
            after = self.starts[at + 1:at + 1 + step]
            before = self._end(slice(at, at + len(after)))
            parts.append(np.flatnonzero((after > before) & (after - before > np.uint64(GAP))) + at + 1)
        return np.concatenate(parts)

    def __call__(self, values: np.ndarray) -> np.ndarray:
        """The block (int32) each of VALUES (uint64) points into, -1 where none."""
        values = np.ascontiguousarray(values, dtype=np.uint64)
        if self._table is None:
            return self._numpy(values)
        lo, slots, first, table, nbases, shift = self._table
        out = np.empty(len(values), dtype=np.int32)
        _LIB.hw_locate(values.ctypes.data, len(values), self.starts.ctypes.data, *self._ends_pointers(),
                       len(self.starts), lo.ctypes.data, slots.ctypes.data, first.ctypes.data, len(lo),
                       table.ctypes.data, nbases, shift, out.ctypes.data)
        return out

    def ascending(self, values: np.ndarray) -> np.ndarray:
        """The same for VALUES in ascending order, in one walk through them and the blocks when in C."""
        if _LIB is None:
            return self._numpy(values)
        values = np.ascontiguousarray(values, dtype=np.uint64)
        out = np.empty(len(values), dtype=np.int32)
        if not len(values):
            return out
        start = int(np.searchsorted(self.starts, values[0], side="right")) - 1
        _LIB.hw_locate_sorted(values.ctypes.data, len(values), self.starts.ctypes.data, *self._ends_pointers(),
                              len(self.starts), start, out.ctypes.data)
        return out

    def edges_inside(self, at: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`edges` for words of which many lie outside every block (free memory read whole): the blocks the
        words lie in are found first, in one walk, and only those words' values are looked up."""
        source = self.ascending(at)
        inside = np.flatnonzero(source >= 0)
        source, block = source[inside], self(values[inside])
        ok = np.flatnonzero((block >= 0) & (block != source))
        return source[ok], block[ok]

    def window_edges(self, base: int, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`edges_inside` of every word of WORDS (uint64, read from BASE) that points between the first block's
        start and the last one's end, in numpy (`window_rows` is the C pass)."""
        near = np.flatnonzero((words >= self.lo) & (words < self.hi))
        return self.edges_inside(np.uint64(base) + near.astype(np.uint64) * np.uint64(8), words[near])

    def window_rows(self, base: int, words: np.ndarray, scratch: tuple[np.ndarray, np.ndarray, np.ndarray],
                    seen: np.ndarray, defer: bool, edges_before: int, targets: np.ndarray, keys: np.ndarray,
                    starts: np.ndarray, nkeys: int, last: int, followed: np.ndarray | None = None,
                    firsts: tuple[np.ndarray, int, int] | None = None) -> int:
        """`hw_scan_rows` (`_reach.c`) on the window WORDS read from BASE: SCRATCH is its room (values, blocks,
        sources, as many each as it judges at a time), SEEN the blocks reached so far; the rows kept go to TARGETS,
        KEYS and STARTS (room for N each; NKEYS and LAST the addresses of its two counters); returns the edges
        kept.  The blocks FOLLOWED (int32, ascending) are passed by: their words were followed already.  FIRSTS,
        when given (room for N uint64 from its place, and the addresses of its two counters: the first block, how
        many), receives the first word of each block whose first word lies in the window.  Only where `native`."""
        words = np.ascontiguousarray(words, dtype=np.uint64)
        lo, slots, first, table, nbases, shift = self._table
        values, block, source = scratch
        start = int(np.searchsorted(self.starts, np.uint64(base), side="right")) - 1
        return _LIB.hw_scan_rows(words.ctypes.data, len(words), base, int(self.lo), int(self.hi),
                                 self.starts.ctypes.data, *self._ends_pointers(), len(self.starts), start,
                                 lo.ctypes.data, slots.ctypes.data, first.ctypes.data, len(lo), table.ctypes.data,
                                 nbases, shift, values.ctypes.data, block.ctypes.data, source.ctypes.data,
                                 len(values), seen.ctypes.data,
                                 int(defer), edges_before, targets.ctypes.data, keys.ctypes.data, starts.ctypes.data,
                                 nkeys, last, None if followed is None else followed.ctypes.data,
                                 0 if followed is None else len(followed),
                                 *((None, None, None) if firsts is None else firsts))

    def _end(self, rows):
        """The ends of the blocks at ROWS (an index, a slice or an array of them)."""
        if self.ends is not None:
            return self.ends[rows]
        return self.starts[rows] + (self.lengths[rows].astype(np.uint64) << np.uint64(LENGTH_UNIT.bit_length() - 1))

    def _ends_pointers(self) -> tuple[int | None, int | None]:
        """The ends, or the lengths, as `_reach.c`'s functions take them (the other NULL)."""
        return (self.ends.ctypes.data, None) if self.ends is not None else (None, self.lengths.ctypes.data)

    def release(self) -> None:
        """Gives back the room `root_hits` keeps from one window to the next."""
        self._scratch = None

    @property
    def native(self) -> bool:
        """Whether the lookups are made in C (the library built, and blocks to look among)."""
        return self._table is not None

    def pointing(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The indices of VALUES that point into a block, and each one's block."""
        near = np.flatnonzero((values >= self.lo) & (values < self.hi))
        block = self(values[near])
        found = np.flatnonzero(block >= 0)
        return near[found], block[found]

    def root_hits(self, base: int, words: np.ndarray, root: int, hits: "FirstHits") -> None:
        """Adds to HITS the words of WORDS (uint64, read from BASE, of the root ROOT) that point into a block: in one
        C pass over the words when built (its room kept for the next window), else in numpy."""
        if self._table is None or not len(words):
            where, block = self.pointing(words)
            if len(where):
                hits.add(block, np.uint64(base) + (where.astype(np.uint64) << np.uint64(3)), root)
            return
        words = np.ascontiguousarray(words, dtype=np.uint64)
        n = len(words)
        if self._scratch is None or len(self._scratch[0]) < n:
            self._scratch = (np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int32))
        values, index, block = self._scratch
        lo, slots, first, table, nbases, shift = self._table
        _LIB.hw_root_window(words.ctypes.data, n, base, int(self.lo), int(self.hi), self.starts.ctypes.data,
                            *self._ends_pointers(), len(self.starts), lo.ctypes.data, slots.ctypes.data,
                            first.ctypes.data, len(lo), table.ctypes.data, nbases, shift, root, *hits._pointers(),
                            values.ctypes.data, index.ctypes.data, block.ctypes.data)

    def _numpy(self, values: np.ndarray) -> np.ndarray:
        out = np.full(len(values), -1, dtype=np.int32)
        near = np.flatnonzero((values >= self.lo) & (values < self.hi))
        if len(near):
            block = np.searchsorted(self.starts, values[near], side="right") - 1
            ok = values[near] < self._end(block)
            out[near[ok]] = block[ok]
        return out


def merge_blocks(a: tuple[np.ndarray, np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray, np.ndarray],
                 excluded: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Two runs of blocks (starts, ends, arenas; each strictly ascending by start) merged in address order, less
    those starting at one of EXCLUDED (ascending), in one C pass (`hw_merge_blocks`); None when the library is
    not built, or the merged starts would not be strictly ascending (damage: the caller sorts)."""
    if _LIB is None:
        return None
    c = np.ascontiguousarray
    a = (c(a[0], dtype=np.uint64), c(a[1], dtype=np.uint64), c(a[2], dtype=np.int32))
    b = (c(b[0], dtype=np.uint64), c(b[1], dtype=np.uint64), c(b[2], dtype=np.int32))
    excluded = c(excluded, dtype=np.uint64)
    room = len(a[0]) + len(b[0])
    start, end, arena = np.empty(room, dtype=np.uint64), np.empty(room, dtype=np.uint64), np.empty(room, dtype=np.int32)
    count = _LIB.hw_merge_blocks(*(x.ctypes.data for x in a), len(a[0]), *(x.ctypes.data for x in b), len(b[0]),
                                 excluded.ctypes.data, len(excluded), start.ctypes.data, end.ctypes.data,
                                 arena.ctypes.data)
    if count < 0:
        return None
    return start[:count], end[:count], arena[:count]


def nonzero_pages(words: np.ndarray) -> np.ndarray:
    """Whether each page of WORDS (uint64, whole pages of 512 words) holds any word but zero (bool), in C when
    built (it stops reading a page at its first such word), else in numpy."""
    pages = len(words) // 512
    if _LIB is None:
        return words[:pages * 512].reshape(pages, 512).max(axis=1) != 0 if pages else np.zeros(0, dtype=bool)
    words = np.ascontiguousarray(words, dtype=np.uint64)
    out = np.empty(pages, dtype=np.uint8)
    _LIB.hw_nonzero_pages(words.ctypes.data, pages, out.ctypes.data)
    return out.view(bool)


def text_words(words: np.ndarray) -> np.ndarray | None:
    """Whether each of WORDS (uint64) begins with text (`leaks.begins_with_text`), in C; None when the library
    is not built."""
    if _LIB is None:
        return None
    words = np.ascontiguousarray(words, dtype=np.uint64)
    out = np.empty(len(words), dtype=np.uint8)
    _LIB.hw_text_words(words.ctypes.data, len(words), out.ctypes.data)
    return out.view(bool)


class FirstHits:
    """For each of COUNT blocks, the first word of the roots found pointing into it (WORD: its address, a
    register's value) and that word's root (ROOT, -1 for none); words are added in the order the roots are
    read.  Given SEEN (uint8, a block each), only which blocks a root points into is kept, marked there (WORD
    and ROOT None)."""

    def __init__(self, count: int, seen: np.ndarray | None = None):
        self.seen = seen
        self.word = np.zeros(count, dtype=np.uint64) if seen is None else None
        self.root = np.full(count, -1, dtype=np.int32) if seen is None else None

    def _pointers(self) -> tuple[int | None, int | None, int | None]:
        """WORD's, ROOT's and SEEN's addresses for the C calls (None: not kept)."""
        return tuple(None if a is None else a.ctypes.data for a in (self.word, self.root, self.seen))

    def add(self, block: np.ndarray, words: np.ndarray, root: int) -> None:
        """The words at WORDS (uint64) of the root ROOT point into BLOCK (int32, each a block): each block with no
        hit yet keeps its first one there (in C when built, else in numpy)."""
        block = np.ascontiguousarray(block, dtype=np.int32)
        words = np.ascontiguousarray(words, dtype=np.uint64)
        if _LIB is not None:
            _LIB.hw_first_hits(block.ctypes.data, words.ctypes.data, len(block), root, *self._pointers())
            return
        if self.root is None:
            self.seen[block] = 1
            return
        fresh = np.flatnonzero(self.root[block] < 0)
        block, first = np.unique(block[fresh], return_index=True)
        self.root[block] = root
        self.word[block] = words[fresh[first]]
