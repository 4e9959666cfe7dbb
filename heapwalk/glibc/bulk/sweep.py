"""One pass over an arena's heaps: every chunk's header and links, read once in address order into arrays.

The careful walkers (`heapwalk.glibc.walk.lists`, `heapwalk.glibc.walk.chunkwalk`) follow each free list through
memory, then walk the heaps.  On a heap freed in random order every list hops across the whole arena, and
reading it costs far more than the heap's bytes.  A sweep reads each heap once, a few MiB at a time, steps
from chunk to chunk by their sizes, and keeps for each chunk its address, size field and the two words
after it (fd and bk, or a tcache or fastbin entry's next): the index the lists are then followed in
(`heapwalk.glibc.bulk.indexlists`) and the walk's account is summed from (`heapwalk.glibc.bulk.sweepwalk`).

A sweep only vouches for a heap that is sound as glibc leaves it: every size leads to the next chunk, the
last chunk is top (ending where the heap ends) or an old heap's fenceposts, and every chunk whose
PREV_INUSE is clear has the size of the chunk before it as its prev_size.  At the first thing that is not
so it gives up (None), and the careful walkers take the arena instead: they name what is wrong, where.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from heapwalk.analysis.pages import PagesSeen
from heapwalk.glibc.walk.chunks import Extent
from heapwalk.glibc.locate.layout import MINSIZE
from heapwalk.glibc.bulk.native import chase, gather
from heapwalk.glibc.walk.resync import FENCEPOST_ROOM
from heapwalk.inferior.memory import Memory
from heapwalk.inferior.window import SPAN, let_go_ahead, read_window, window_ahead

__all__ = ["Segment", "Sweep", "sweep_extents", "TAIL_NONE", "TAIL_FENCEPOST", "TAIL_LEFTOVER", "TAIL_ZERO"]

#: words a window keeps past the last size field it steps on: that chunk's fd and bk are read from it too
_MARGIN = 3
#: how an extent ends: at top (or nothing to say) ...
TAIL_NONE = 0
#: ... with a 16-byte fencepost chunk, the sweep's last chunk, then a zero size (an old heap of a thread arena)
TAIL_FENCEPOST = 1
#: ... with a zero size after the sweep's last chunk, an old top too small to free (a fencepost if no list holds it)
TAIL_LEFTOVER = 2
#: ... with a zero size after the sweep's last chunk, a chunk like any other
TAIL_ZERO = 3


@dataclass(frozen=True)
class Segment:
    """One extent as swept: its chunks are [lo, hi) of the sweep's arrays; TAIL bytes after them are a
    fencepost's; KIND says how it ends (TAIL_*)."""

    extent: Extent
    lo: int
    hi: int
    tail: int
    kind: int


@dataclass(frozen=True)
class Sweep:
    """Every chunk of an arena's extents, in address order per extent: address, size field, and the two words
    after the size field (fd and bk of a binned chunk; a tcache or fastbin entry's next and key)."""

    address: np.ndarray
    field: np.ndarray
    fd: np.ndarray
    bk: np.ndarray
    segments: tuple[Segment, ...]

    @property
    def count(self) -> int:
        return len(self.address)

    @cached_property
    def sizes(self) -> np.ndarray:
        """Each chunk's size, flags masked (int64, read-only): made once, for the lists, the account and the scan."""
        sizes = (self.field & np.uint64(~7 & (2 ** 64 - 1))).view(np.int64)
        sizes.setflags(write=False)
        return sizes


def sweep_extents(mem: Memory, extents: list[Extent], top: int, progress=None,
                  pages: PagesSeen | None = None) -> Sweep | None:
    """Every chunk of EXTENTS (one arena's, TOP its top), or None where a heap is not as glibc leaves it (or
    not in memory).  PROGRESS(bytes), when given, hears how far the sweep is; PAGES, when given, notes
    which pages of each window hold anything."""
    parts: list[tuple[np.ndarray, ...]] = []
    segments = []
    count = done = 0
    for extent in extents:
        swept = _sweep_extent(mem, extent, top, pages)
        if swept is None:
            let_go_ahead(mem)            # the window read ahead, untaken where the sweep stopped
            return None
        extent_parts, tail, kind = swept
        n = sum(len(p[0]) for p in extent_parts)
        segments.append(Segment(extent, count, count + n, tail, kind))
        parts.extend(extent_parts)
        del swept, extent_parts          # the parts are PARTS' alone: `_joined` lets each go
        count += n
        done += extent.end - extent.start
        if progress is not None:
            progress(done)
    let_go_ahead(mem)                    # the window read ahead past the last extent's end, untaken
    if not parts:
        empty = np.zeros(0, dtype=np.uint64)
        return Sweep(empty, empty, empty, empty, tuple(segments))
    return Sweep(*_joined(parts), tuple(segments))


def _joined(parts: list[tuple[np.ndarray, ...]]) -> list[np.ndarray]:
    """The windows' PARTS (address, field, fd, bk each) joined column by column, each column's parts let go once
    joined: the sweep's room and a column's more at the most, not twice the sweep's."""
    columns = [list(column) for column in zip(*parts)]
    parts.clear()
    out = []
    for column in columns:
        out.append(np.concatenate(column))
        column.clear()
    return out


def _sweep_extent(mem: Memory, extent: Extent, top: int,
                  pages: PagesSeen | None = None) -> tuple[list[tuple[np.ndarray, ...]], int, int] | None:
    """The chunks of EXTENT a window at a time, as (address, field, fd, bk) arrays per window, with the tail
    bytes and kind; None at anything a sound heap does not have."""
    c, end = extent.first, extent.end
    has_top = extent.first <= top < end
    parts: list[tuple[np.ndarray, ...]] = []
    before = -1                          # the size of the chunk before c (-1: c is the extent's first)
    w = c                                # the window's base: c, or below it where the window was read ahead
    while c < end:
        data = read_window(mem, w, end, SPAN)
        n, first = len(data) // 8, (c - w) // 8 + 1     # words, and c's size field among them
        last = w + 8 * n >= end
        if w != c and (n < 2 or first >= (n if last else n - _MARGIN)):
            w = c                        # the window read ahead does not hold c's chunk: read from c, as always
            continue
        if n < 2:
            return None                  # not in memory
        ahead = w + 8 * (n - _MARGIN - 1)            # the least the chase stops at, unless the extent ends here
        if not last and ahead > c:
            window_ahead(mem, ahead, end, SPAN)       # read while this one is judged
        words = memoryview(data)[:8 * n].cast("Q")
        array64 = np.frombuffer(data, dtype=np.uint64, count=n)
        found, j = chase(array64 if last else array64[:n - _MARGIN], first, MINSIZE)
        if len(found):
            part = _gather(array64, found, w, before)
            if part is None:
                return None
            parts.append(part)
            before = int(part[1][-1]) & ~7
            if pages is not None:
                pages.note(w, array64)
        stop = w + 8 * (j - 1)           # the chunk the chase stopped at
        if j < (n if last else n - _MARGIN):
            return _tail(words, j, stop, extent, has_top, top, before, parts)  # at a size no chunk has
        if stop > end or stop == c:
            return None                  # the last chunk runs past the extent, or memory ends here
        c = stop                         # the next chunk's header is in the next window
        w = ahead if not last and c > ahead > w else c
        del data, words, array64         # this window gone before the next is read ahead: two at a time
    if not parts or not has_top or int(parts[-1][0][-1]) != top:
        return None
    return parts, 0, TAIL_NONE


def _gather(words: np.ndarray, found: np.ndarray, base: int, before: int,
            native: bool = True) -> tuple[np.ndarray, ...] | None:
    """The address, size field, fd and bk of each chunk whose size field is at FOUND in WORDS (read from
    BASE); None when a chunk with PREV_INUSE clear does not have its neighbour's size (BEFORE: the size of
    the chunk before the first, -1 when it is the extent's first) as prev_size.  In one C loop when the library
    is built (`native.gather`) and NATIVE, else in numpy."""
    if found[-1] + 2 >= len(words):
        return None                      # the last chunk runs past the extent's end
    if native:
        gathered = gather(words, found, base, before)
        if gathered is not NotImplemented:
            return gathered
    fields = words[found]
    free_before = np.flatnonzero((fields & 1) == 0)
    if len(free_before):
        sizes_before = np.empty(len(found), dtype=np.int64)
        sizes_before[1:] = (fields[:-1] & ~np.uint64(7)).astype(np.int64)
        sizes_before[0] = before
        if free_before[0] == 0 and before < 0:
            return None
        if np.any(words[found[free_before] - 1].astype(np.int64) != sizes_before[free_before]):
            return None
    address = np.uint64(base - 8) + (found.astype(np.uint64) << np.uint64(3))
    return address, fields, words[found + 1], words[found + 2]


def _tail(words, j: int, stop: int, extent: Extent, has_top: bool, top: int, before: int,
          parts: list) -> tuple[list, int, int] | None:
    """How an extent without top ends, where the chase stopped at STOP (field at word J): a 16-byte
    fencepost and a zero size, or a zero size alone; None for anything else."""
    end = extent.end
    if has_top or not parts:
        return None
    size = words[j] & ~7
    if size == 16 and j + 2 < len(words) and words[j + 2] & ~7 == 0:
        after = stop + 16
        if end - after > FENCEPOST_ROOM:
            return None
        fencepost = words[j]
        if not fencepost & 1 and words[j - 1] != before:
            return None
        parts.append((np.array([stop], dtype=np.uint64), np.array([fencepost], dtype=np.uint64),
                      np.zeros(1, dtype=np.uint64), np.zeros(1, dtype=np.uint64)))
        return parts, end - after, TAIL_FENCEPOST
    if size == 0 and end - stop <= FENCEPOST_ROOM and words[j] & 1:
        leftover = before < MINSIZE + 16 and words[j - 1] == before
        return parts, end - stop, TAIL_LEFTOVER if leftover else TAIL_ZERO
    return None
