"""Which pages of the memory a command read hold anything but zeros, noted as the windows pass: a core that
does not say which pages were resident counts the pages that hold anything (`residency.in_core`), and need not
read again the pages a decoder's sweep or the leak scan already judged.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from heapwalk.analysis.lookup import nonzero_pages
from heapwalk.inferior.ranges import merged, ranges_without
from heapwalk.inferior.residency import runs_of

__all__ = ["PagesSeen"]

_PAGE = 4096


class PagesSeen:
    """Which whole pages of the windows read so far hold anything but zeros: what a core's contents
    (`residency.in_core`) need not read again."""

    def __init__(self, judged: Sequence[tuple[int, int]] = ()):
        self._judged: list[tuple[int, int]] = []
        self._nonzero: list[tuple[int, int]] = []
        self._before = merged(judged)
        self._before_starts = [lo for lo, _ in self._before]

    def note(self, base: int, words: np.ndarray) -> None:
        """Notes which of the whole pages of WORDS (read from BASE) hold anything but zeros, unless the pages
        judged before (JUDGED, given at the start: another reader's, whose answer is kept elsewhere) hold them."""
        first = -(-base // _PAGE) * _PAGE
        skip = (first - base) // 8
        pages = max(0, (len(words) - skip) // 512)
        if pages and not self._judged_before(first, first + pages * _PAGE):
            held = nonzero_pages(words[skip:skip + 512 * pages])
            self._judged.append((first, first + pages * _PAGE))
            self._nonzero.extend(runs_of(held, first))

    def apart(self) -> PagesSeen:
        """An empty record that judges as this one does, for another thread's windows (`take_in` them after)."""
        out = PagesSeen()
        out._before, out._before_starts = self._before, self._before_starts
        return out

    def take_in(self, other: PagesSeen) -> None:
        """Adds what OTHER (of `apart`) noted, as if its windows had been noted here."""
        self._judged.extend(other._judged)
        self._nonzero.extend(other._nonzero)

    def _judged_before(self, lo: int, hi: int) -> bool:
        """Whether [LO, HI) lies in one of the ranges judged before."""
        i = bisect.bisect_right(self._before_starts, lo) - 1
        return i >= 0 and hi <= self._before[i][1]

    def seen(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The whole pages judged (merged), and the runs of them that hold anything but zeros."""
        return merged(self._judged), merged(self._nonzero)

    def nonzero_bytes(self, ranges: Sequence[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]]:
        """Of RANGES (whole pages [lo, hi), apart), the bytes of the pages the windows judged that hold anything
        but zeros, and the pieces of RANGES they did not judge (the caller reads those)."""
        judged, nonzero = self.seen()
        if not judged or not ranges:
            return 0, list(ranges)
        los = np.array([lo for lo, _ in ranges], dtype=np.int64)
        his = np.array([hi for _, hi in ranges], dtype=np.int64)
        return int((_below(nonzero, his) - _below(nonzero, los)).sum()), ranges_without(ranges, judged)


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
