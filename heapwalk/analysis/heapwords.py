"""The words of the heaps the leak scan needs, kept while a decoder reads the heaps for its own walk, so that a
report reads each heap once.

A decoder that sweeps a heap window by window hands each window to `HeapWords.window` with the runs of words
that may lie inside an allocation the program holds (a superset: the allocator's cached free pieces may be
among them), or finds the runs and their words in its own C pass and writes them into the room `fill` gives.
Of those words it keeps the ones whose value falls in SPANS (where allocations can be: the memory that may hold
heaps), with their addresses, and each run's first word.  A heap swept to its end is `commit`ted as covered; one the decoder gives up on is
`abandon`ed, and the scan reads it itself.  Every window also says which of its whole pages hold anything
but zeros (`pages_seen`), for a core's contents; a decode without the scan keeps those alone.  `reach.scan` then takes the covered heaps' words from here, judged
against the final blocks exactly as if it had read them: a word counts only inside a block, and only when it
points into one; it then gives them back (`release`), and the memory they held serves the arrays after.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from heapwalk.analysis.lookup import NATIVE, keep, nonzero_pages
from heapwalk.inferior.memory import merged, ranges_without
from heapwalk.inferior.residency import runs_of

__all__ = ["HeapWords", "PagesSeen", "run_mask"]

_PAGE = 4096
#: rows of a slab of kept words: its two columns are one block of gdb's memory (48 MiB for a word's index and
#: value), freed whole once the scan has taken the words, so that the arrays made after it fit in its place
#: (thousands of small arrays would leave holes between longer-lived ones); only the pages written are touched
SLAB_ROWS = 1 << 22


class Slabs:
    """Rows of two columns (a uint32 index, a uint64 word), appended a window at a time in slabs of SLAB_ROWS (or
    of a window's rows, when more): what is kept is written once, where it stays, and given back in a few big
    blocks."""

    def __init__(self, rows: int | None = None):
        self.rows = rows or SLAB_ROWS
        self._slabs: list[tuple[np.ndarray, np.ndarray]] = []
        self._used = 0

    @staticmethod
    def _slab(rows: int) -> tuple[np.ndarray, np.ndarray]:
        """A slab of ROWS rows: both columns cut from one block, the second 8-aligned."""
        rows += rows & 1
        block = np.empty(rows * 12, dtype=np.uint8)
        return block[:rows * 4].view(np.uint32), block[rows * 4:].view(np.uint64)

    def room(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """The two columns' next N rows (a new slab when the last has fewer free), to write into, then `take`."""
        if not self._slabs or self._used + n > len(self._slabs[-1][0]):
            self._slabs.append(self._slab(max(n, self.rows)))
            self._used = 0
        first, second = self._slabs[-1]
        return first[self._used:self._used + n], second[self._used:self._used + n]

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Keeps the first N of the rows `room` gave: the two columns' views of them."""
        (first, second), lo = self._slabs[-1], self._used
        self._used += n
        return first[lo:lo + n], second[lo:lo + n]

    def mark(self) -> tuple[int, int]:
        """Where the next row goes, for `rewind`."""
        return len(self._slabs), self._used

    def rewind(self, mark: tuple[int, int]) -> None:
        """Drops the rows kept since MARK."""
        count, used = mark
        del self._slabs[max(count, 1):]
        self._used = used if count else 0


def run_mask(n: int, run_lo: np.ndarray, run_hi: np.ndarray) -> np.ndarray:
    """N booleans, true inside each run [RUN_LO, RUN_HI) (ascending, apart, within N): the runs cut the N into
    stretches outside and inside by turns, each repeated for its length."""
    cuts = np.empty(2 * len(run_lo) + 2, dtype=np.int64)
    cuts[0], cuts[-1] = 0, n
    cuts[1:-1:2], cuts[2:-1:2] = run_lo, run_hi
    turns = np.zeros(len(cuts) - 1, dtype=bool)
    turns[1::2] = True
    return np.repeat(turns, np.diff(cuts))


class PagesSeen:
    """Which whole pages of the windows read so far hold anything but zeros: what a core's contents
    (`residency.in_core`) need not read again."""

    def __init__(self):
        self._judged: list[tuple[int, int]] = []
        self._nonzero: list[tuple[int, int]] = []

    def note(self, base: int, words: np.ndarray) -> None:
        """Notes which of the whole pages of WORDS (read from BASE) hold anything but zeros."""
        first = -(-base // _PAGE) * _PAGE
        skip = (first - base) // 8
        pages = max(0, (len(words) - skip) // 512)
        if pages:
            held = nonzero_pages(words[skip:skip + 512 * pages])
            self._judged.append((first, first + pages * _PAGE))
            self._nonzero.extend(runs_of(held, first))

    def seen(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The whole pages judged (merged), and the runs of them that hold anything but zeros."""
        return merged(self._judged), merged(self._nonzero)


class HeapWords:
    """The words kept so far (see the module)."""

    def __init__(self, spans: Sequence[tuple[int, int]], keep_words: bool = True, keep_pages: bool = True):
        self.keep_words, self.keep_pages = keep_words, keep_pages
        spans = [(lo, hi) for lo, hi in merged(spans) if hi > lo]
        self.spans = tuple(spans)
        self._bounds = np.array([x for span in spans for x in span], dtype=np.uint64)
        self._lo = np.uint64(spans[0][0] if spans else 0)
        self._hi = np.uint64(spans[-1][1] if spans else 0)
        self._kept: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._covered: list[tuple[int, int]] = []
        self._gaps: list[tuple[int, int]] = []
        self._words, self._runs = Slabs(), Slabs()
        self._marks = self._words.mark(), self._runs.mark()
        self.pages = PagesSeen()

    def begin(self) -> None:
        """Starts a heap: its windows are kept only if it is committed."""
        self.abandon()

    def gap(self, lo: int, hi: int) -> None:
        """[LO, HI) of the heap begun last was not read (the inside of a big allocation the decoder stepped
        over): the scan reads it."""
        self._gaps.append((lo, hi))

    def window(self, base: int, words: np.ndarray, run_lo: np.ndarray, run_hi: np.ndarray) -> None:
        """WORDS (uint64) read from BASE; RUN_LO and RUN_HI (int64, ascending, not overlapping) the word
        indices [lo, hi) of each run that may lie inside a held allocation."""
        if self.keep_pages:
            self.pages.note(base, words)
        if not len(run_lo) or not self.keep_words:
            return
        index = keep(words, run_lo, run_hi, self._bounds) if NATIVE else self._numpy(words, run_lo, run_hi)
        self._add(base, words, run_lo, index)

    def fill(self, base: int, words: np.ndarray, runs: int, keep) -> None:
        """WORDS (uint64) read from BASE, whose runs and kept words an allocator's own pass finds: KEEP(bounds,
        out) writes into OUT (room for RUNS runs' first word's index, uint32, and that word, uint64, then for one
        kept word a word of WORDS: its index, uint32, and value) the runs that may lie inside a held allocation
        and their words whose values lie in BOUNDS (the spans, as pairs), and returns how many runs and words.
        Kept as `window` keeps its runs."""
        if self.keep_pages:
            self.pages.note(base, words)
        if not self.keep_words:
            return
        at, values = self._words.room(len(words))
        run_at, run_first = self._runs.room(runs)
        runs, count = keep(self._bounds, (run_at, run_first, at, values))
        if runs:
            at, values = self._words.take(count)
            starts, firsts = self._runs.take(runs)
            self._pending.append((base, at, values, starts, firsts))

    def _add(self, base: int, words: np.ndarray, run_lo: np.ndarray, index: np.ndarray) -> None:
        """Keeps the words at INDEX of WORDS (read from BASE) and the first word of each run at RUN_LO, each by its
        index in the window (32 bits: the window's base is kept once)."""
        at, values = self._words.room(len(index))
        at[:] = index
        np.take(words, index, out=values)
        at, values = self._words.take(len(index))
        starts, firsts = self._runs.room(len(run_lo))
        starts[:] = run_lo
        np.take(words, run_lo, out=firsts)
        starts, firsts = self._runs.take(len(run_lo))
        self._pending.append((base, at, values, starts, firsts))

    def pages_seen(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The whole pages the windows held (merged), and the runs of them that hold anything but zeros: what a
        core's contents (`residency.in_core`) need not read again."""
        return self.pages.seen()

    def nonzero_bytes(self, ranges: Sequence[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]]:
        """Of RANGES (whole pages [lo, hi), apart), the bytes of the pages the windows judged that hold anything
        but zeros, and the pieces of RANGES they did not judge (the caller reads those)."""
        judged, nonzero = self.pages.seen()
        if not judged or not ranges:
            return 0, list(ranges)
        los = np.array([lo for lo, _ in ranges], dtype=np.int64)
        his = np.array([hi for _, hi in ranges], dtype=np.int64)
        return int((_below(nonzero, his) - _below(nonzero, los)).sum()), ranges_without(ranges, judged)

    def _numpy(self, words: np.ndarray, run_lo: np.ndarray, run_hi: np.ndarray) -> np.ndarray:
        """`lookup.keep` in numpy: the runs as a mask, its words' values compared with the spans."""
        held = run_mask(len(words), run_lo, run_hi)
        index = np.flatnonzero(held & (words >= self._lo) & (words < self._hi))
        if len(self._bounds) > 2 and len(index):
            index = index[(np.searchsorted(self._bounds, words[index], side="right") & 1) == 1]
        return index

    def commit(self, ranges: Sequence[tuple[int, int]]) -> None:
        """The heap begun last was read whole: RANGES are covered, its words kept (when words are kept at all:
        else nothing is covered, and only the pages seen are kept)."""
        self._kept.extend(self._pending)
        if self.keep_words:
            self._covered.extend(ranges_without(merged(ranges), self._gaps))
        self._pending, self._gaps = [], []
        self._marks = self._words.mark(), self._runs.mark()

    def abandon(self) -> None:
        """The heap begun last is not covered (its words are dropped): the scan reads it."""
        self._pending, self._gaps = [], []
        self._words.rewind(self._marks[0])
        self._runs.rewind(self._marks[1])

    def release(self) -> None:
        """Gives back the kept words, once the scan has taken them: the memory they covered is covered no more (a
        later scan reads it).  The pages seen stay."""
        self._kept, self._pending, self._covered, self._gaps = [], [], [], []
        self._words, self._runs = Slabs(), Slabs()
        self._marks = self._words.mark(), self._runs.mark()

    @property
    def covered(self) -> list[tuple[int, int]]:
        """The memory whose words are all here, merged."""
        return merged(self._covered)

    def holds(self, ranges: Sequence[tuple[int, int]]) -> bool:
        """Whether every one of RANGES lies within the spans the values were kept for."""
        los = np.array([lo for lo, _ in ranges], dtype=np.uint64)
        his = np.array([hi - 1 for _, hi in ranges], dtype=np.uint64)
        if not len(los):
            return True
        side = np.searchsorted(self._bounds, los, side="right")
        return bool(np.all(side & 1) and np.all(np.searchsorted(self._bounds, his, side="right") == side))

    def pairs(self):
        """(address, value) of the kept words (uint64), a window at a time in address order."""
        for base, at, values, _, _ in sorted(self._kept, key=lambda part: part[0]):
            yield _addresses(base, at), values

    def firsts(self):
        """The address and first word of every kept run (uint64), a window at a time in address order."""
        for base, _, _, starts, firsts in sorted(self._kept, key=lambda part: part[0]):
            yield _addresses(base, starts), firsts


def _addresses(base: int, index: np.ndarray) -> np.ndarray:
    """The addresses of the words at INDEX of a window read from BASE."""
    return np.uint64(base) + (index.astype(np.uint64) << np.uint64(3))


def _below(runs: list[tuple[int, int]], at: np.ndarray) -> np.ndarray:
    """For each address of AT, how many bytes of RUNS (merged) lie below it."""
    if not runs:
        return np.zeros(len(at), dtype=np.int64)
    starts = np.array([lo for lo, _ in runs], dtype=np.int64)
    ends = np.array([hi for _, hi in runs], dtype=np.int64)
    before = np.concatenate(([0], np.cumsum(ends - starts)))
    i = np.searchsorted(starts, at, side="right")          # the runs starting at or below each address
    past = np.where(i > 0, np.maximum(ends[np.maximum(i - 1, 0)] - at, 0), 0)   # the last one's part above it
    return before[i] - past
