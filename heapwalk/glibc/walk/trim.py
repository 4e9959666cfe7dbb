"""What ``malloc_trim(0)`` would give back, computed from memory the way glibc's trim works.

For every arena glibc first consolidates the fastbins (up to 2.42): each
fastbin chunk merges with free neighbours and, next to top, into top.  Then it
``madvise(MADV_DONTNEED)``s the page-aligned interior of every free chunk in
the unsorted bin and in the bins that can hold a page (past its first 48
bytes: header and links stay).  Only for the main arena, and only when it is
contiguous, it then lowers the break: top minus MINSIZE, rounded down to pages
(or to the transparent huge page size when one is set).  Pages are the target's
(AT_PAGESZ: 4 KiB, or 16 or 64 KiB on kernels so built).  tcache is not
flushed, and a thread arena's top is never trimmed.

Which of those pages are resident comes from the target's residency where it
is known (a live process's page map, a core `heapwalk capture` wrote); elsewhere
an all-zero page is counted as not resident (never touched, or already given
back), judged from the pages a sweep already read where it read them.  So `TrimEstimate.resident` is the drop in RSS to expect and
`TrimEstimate.total` the address space released.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Protocol

from heapwalk.glibc.locate.layout import MINSIZE, Layout
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.inferior.residency import Residency
from heapwalk.glibc.model import KEPT_REASONS, Arena, ChunkState, TrimEstimate

__all__ = ["TrimSimulation", "trim_settings", "PAGE", "SUB_PAGE", "sub_page"]

PAGE = 4096
_SPAN = 1 << 20                 # bytes read at once when looking for resident pages
_LINKS = 48                     # sizeof(struct malloc_chunk): stays resident in a trimmed chunk


def sub_page(page: int = PAGE) -> int:
    """The largest free chunk that holds no whole PAGE-byte page to give back."""
    return page - 1 + _LINKS


SUB_PAGE = sub_page()
_RUN_STATES = frozenset((ChunkState.FAST, ChunkState.UNSORTED, ChunkState.SMALL, ChunkState.LARGE))


class PagesSeen(Protocol):
    """What a sweep already read of the heaps' pages (`analysis.pages.PagesSeen`)."""

    def nonzero_bytes(self, ranges: list[tuple[int, int]]) -> tuple[int, list[tuple[int, int]]]:
        """Of RANGES (whole pages), the bytes of the pages it read that hold anything, and the pieces it did not
        read."""


def _resident_bytes(mem: Memory, start: int, length: int, page: int = PAGE) -> int:
    """Bytes of the PAGE-byte pages in [start, start+length) that hold anything but zeros (page-aligned range).

    Read a MiB at a time; where that fails, page by page, giving up after 256 unreadable pages in a row
    (past the end of what the target has: a damaged size, a truncated core)."""
    resident = missing = 0
    zero = bytes(page)
    at, end = start, start + length
    while at < end:
        span = min(_SPAN, end - at)
        try:
            data = mem.read(at, span)
        except ReadError:
            data = None
        if data is not None:
            missing = 0
            if data.count(0) != span:
                view = memoryview(data)
                resident += sum(page for off in range(0, span, page) if view[off:off + page] != zero)
            at += span
            continue
        for first in range(at, at + span, page):
            try:
                if mem.read(first, page) != zero:
                    resident += page
                missing = 0
            except ReadError:
                missing += 1
                if missing > 256:
                    return resident
        at += span
    return resident


def _page_interior(address: int, size: int, page: int = PAGE) -> tuple[int, int]:
    """(start, length) of the whole PAGE-byte pages mtrim would madvise in a free chunk."""
    if size <= page - 1 + _LINKS:
        return 0, 0
    start = (address + _LINKS + page - 1) & ~(page - 1)
    rest = address + size - start
    return (start, rest & ~(page - 1)) if rest > page - 1 else (0, 0)


def trim_settings(mp) -> tuple[int, bool]:
    """From mp_ (its values, or None when not found): the transparent huge page size the main top is trimmed
    by (0: pages), and whether the main arena may lower the break (not when huge pages back it)."""
    thp = (mp.get("thp_pagesize") or 0) if mp else 0
    return thp, not (mp and mp.get("hp_pagesize"))


class TrimSimulation:
    """malloc_trim(0) on one arena, fed the chunks of its walk that are not plainly in use (see
    `chunkwalk.account`); `result` gives the estimate.

    Free chunks next to each other (fastbin chunks and binned ones) form runs that
    consolidation merges into one chunk, or into top when a run with a fastbin chunk
    touches it; tcache chunks stay put and break runs.
    """

    def __init__(self, mem: Memory, layout: Layout, arena: Arena, thp_pagesize: int = 0,
                 main_contiguous: bool = True, residency: Residency | None = None, seen: PagesSeen | None = None,
                 page: int = PAGE):
        self.mem, self.arena, self.thp_pagesize, self.residency = mem, arena, thp_pagesize, residency
        self.page, self.sub_page = page, sub_page(page)
        self.seen = seen
        self.systrim_allowed = arena.is_main and main_contiguous
        self.consolidate = layout.has_fastbins
        self.top_start, self.top_size = arena.top, arena.top_size
        self.kept = dict.fromkeys(KEPT_REASONS, 0)
        self.runs: list[tuple[int, int]] = []  # consolidated free chunks holding a whole page
        self.run_start: int | None = None
        self.run_size = 0
        self.run_has_fast = False

    def chunks(self, batch) -> None:
        """The next chunks of the walk that are not plainly in use, as (address, size, flags, state) in address
        order; a gap between two of them is in-use memory, which ends a run.  (A closed run with no whole
        page inside, the common case of a fragmented heap, is summed here rather than through `_close`.)"""
        run_start, run_size, run_has_fast = self.run_start, self.run_size, self.run_has_fast
        run_states = _RUN_STATES if self.consolidate else _RUN_STATES - {ChunkState.FAST}
        tcache = sub_page = 0
        runs, small = self.runs, self.sub_page
        fast, top, tcache_state = ChunkState.FAST, ChunkState.TOP, ChunkState.TCACHE
        for address, size, _, state in batch:
            if run_start is not None and address != run_start + run_size:
                # an in-use chunk ended the run
                if run_size <= small:
                    sub_page += run_size
                else:
                    runs.append((run_start, run_size))
                run_start = None
            if state in run_states:
                if run_start is None:
                    run_start, run_size, run_has_fast = address, size, state is fast
                else:
                    run_size += size
                    if state is fast:
                        run_has_fast = True
                continue
            if state is tcache_state:
                tcache += size
            if run_start is not None:
                if state is top and run_has_fast:  # consolidation merges the run into top
                    self.top_start, self.top_size = run_start, self.top_size + run_size
                elif run_size <= small:
                    sub_page += run_size
                else:
                    runs.append((run_start, run_size))
                run_start = None
        self.run_start, self.run_size, self.run_has_fast = run_start, run_size, run_has_fast
        self.kept["tcache"] += tcache
        self.kept["sub_page"] += sub_page

    def take(self, runs: list[tuple[int, int]], sub_page: int, tcache: int) -> None:
        """What `chunks` would have gathered from a whole arena, summed elsewhere (`sweepwalk`): the closed
        RUNS holding a whole page, the bytes of the others (SUB_PAGE), and the bytes of the tcache chunks."""
        self.runs.extend(runs)
        self.kept["sub_page"] += sub_page
        self.kept["tcache"] += tcache

    def extent_done(self) -> None:
        if self.run_start is not None:
            self._close(self.run_start, self.run_size)
            self.run_start = None

    def _close(self, address: int, size: int) -> None:
        """A free chunk as consolidation leaves it: the whole pages inside are given back, the rest is kept."""
        if size <= self.sub_page:  # no whole page inside: the common case of a fragmented heap
            self.kept["sub_page"] += size
            return
        self.runs.append((address, size))

    def result(self) -> TrimEstimate:
        """The estimate, once the walk has fed every chunk."""
        kept = dict(self.kept)
        interiors, released = self._interiors(), self._released_top()
        madvise = sum(end - start for start, end in interiors)
        kept["sub_page"] += sum(size for _, size in self.runs) - madvise
        systrim = sum(end - start for start, end in released)
        if self.systrim_allowed:
            kept["main_top"] += self.top_size - systrim
        else:
            kept["main_top" if self.arena.is_main else "thread_top"] += self.top_size
        return TrimEstimate(self.arena.address, madvise, self._resident(interiors), systrim,
                            self._resident(released), MappingProxyType(kept))

    def released(self) -> list[tuple[int, int]]:
        """The [start, end) ranges the trim gives back, once the walk has fed every chunk: the pages madvised
        inside free chunks, then the end of the main arena's top (in address order within each)."""
        return self._interiors() + self._released_top()

    def _interiors(self) -> list[tuple[int, int]]:
        """The whole pages inside the consolidated free runs, which madvise gives back."""
        out = []
        for address, size in self.runs:
            start, length = _page_interior(address, size, self.page)
            if length:
                out.append((start, start + length))
        return out

    def _released_top(self) -> list[tuple[int, int]]:
        """The end of the main arena's top that lowering the break gives back (nothing elsewhere)."""
        if not self.systrim_allowed:
            return []
        area = self.top_size - MINSIZE - 1
        unit = self.thp_pagesize or self.page
        systrim = area // unit * unit if area > 0 else 0
        top_end = self.top_start + self.top_size
        return [(top_end - systrim, top_end)] if systrim else []

    def _resident(self, ranges: list[tuple[int, int]]) -> int:
        """Resident bytes of the page-aligned RANGES: from the residency when known, else the pages that are
        not all zeros."""
        if not ranges:
            return 0
        if self.residency is None:
            seen = self.seen if self.page == PAGE else None     # the sweep judged 4 KiB pages
            known, unread = seen.nonzero_bytes(ranges) if seen is not None else (0, ranges)
            return known + sum(_resident_bytes(self.mem, start, end - start, self.page) for start, end in unread)
        known = self.residency.covering([(h.address, h.address + max(h.size, h.mprotect_size))
                                         for h in self.arena.heaps] + ranges)
        starts, ends = zip(*ranges)
        return known.resident_sum(starts, ends)
