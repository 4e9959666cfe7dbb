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

import mmap
import threading
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from heapwalk.analysis.pages import PagesSeen
from heapwalk.common.arrays import STAGGER, staggered
from heapwalk.glibc.walk.chunks import Extent
from heapwalk.glibc.locate.layout import MINSIZE
from heapwalk.glibc.bulk.native import chase, sweep_window
from heapwalk.glibc.walk.resync import FENCEPOST_ROOM
from heapwalk.inferior.memory import Memory
from heapwalk.inferior.window import SPAN, let_go_ahead, read_window, window_ahead

__all__ = ["Segment", "Sweep", "SweepRoom", "sweep_extents", "TAIL_NONE", "TAIL_FENCEPOST", "TAIL_LEFTOVER",
           "TAIL_ZERO"]

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
                  pages: PagesSeen | None = None, room: SweepRoom | None = None) -> Sweep | None:
    """Every chunk of EXTENTS (one arena's, TOP its top), or None where a heap is not as glibc leaves it (or
    not in memory).  PROGRESS(bytes), when given, hears how far the sweep is; PAGES, when given, notes
    which pages of each window hold anything; ROOM, when given, lends the room the columns are written in."""
    columns = _Columns(sum(max(0, e.end - e.first) for e in extents) // MINSIZE + 2 * len(extents), room)
    segments = []
    done = 0
    for extent in extents:
        lo = columns.count
        swept = _sweep_extent(mem, extent, top, columns, pages)
        if swept is None:
            let_go_ahead(mem)            # the window read ahead, untaken where the sweep stopped
            return None
        tail, kind = swept
        segments.append(Segment(extent, lo, columns.count, tail, kind))
        done += extent.end - extent.start
        if progress is not None:
            progress(done)
    let_go_ahead(mem)                    # the window read ahead past the last extent's end, untaken
    return Sweep(*columns.joined(), tuple(segments))


#: words each column's room starts after the one before's, from where it would start (a power of two): the
#: sweep writes the four columns side by side (`arrays.staggered`; measured: 55-65 ns a chunk on the huge bench
#: core, 10-12 staggered)
_STAGGER = STAGGER // 8


class _Columns:
    """The sweep's four columns (address, size field, fd and bk), written in place window by window: in room for
    as many chunks as the arena's bytes hold at the least chunk size (MOST), BLOCK chunks at the most at a time,
    lent by a `SweepRoom` (room not written to costs no memory: its pages are not touched); without one, in
    gdb's heap, HEAP_BLOCK chunks at a time (blocks that fit the holes earlier arrays left there, which
    `ownmemory` keeps while a command runs: room of its own would come on top of them).  A further block is
    made where one fills, and the blocks are joined at the end only where there are more than one."""

    BLOCK = 1 << 25
    HEAP_BLOCK = 1 << 20

    def __init__(self, most: int, room: SweepRoom | None = None):
        self.most, self.count, self._lender = most, 0, room
        self._blocks: list[list[np.ndarray]] = []
        self._filled: list[int] = []

    def room(self, need: int) -> tuple[list[np.ndarray], int]:
        """The block to write NEED chunks more into, and where in it they go (see `wrote`)."""
        if not self._blocks or len(self._blocks[-1][0]) - self._filled[-1] < need:
            if self._lender is None:
                size = max(need, min(self.HEAP_BLOCK, self.most - self.count))
                self._blocks.append([staggered(size, np.uint64, c) for c in range(4)])
            else:
                size = max(need, min(self.BLOCK, self.most - self.count))
                self._blocks.append([self._lender.take(c, size) for c in range(4)])
            self._filled.append(0)
        return self._blocks[-1], self._filled[-1]

    def wrote(self, k: int) -> None:
        """Counts the K chunks written where `room` said."""
        self._filled[-1] += k
        self.count += k

    def append(self, part: tuple[np.ndarray, ...]) -> None:
        """Writes the chunks of PART (address, size field, fd and bk arrays) after the others."""
        k = len(part[0])
        block, at = self.room(k)
        for column, values in zip(block, part):
            column[at:at + k] = values
        self.wrote(k)

    def last(self, column: int) -> int:
        """COLUMN's value for the last chunk written (0 address, 1 size field)."""
        return int(self._blocks[-1][column][self._filled[-1] - 1])

    def joined(self) -> list[np.ndarray]:
        """The four columns, the blocks let go as they are joined."""
        if not self._blocks:
            return [np.zeros(0, dtype=np.uint64) for _ in range(4)]
        parts = [[block[c][:filled] for block, filled in zip(self._blocks, self._filled)] for c in range(4)]
        self._blocks.clear()
        if len(self._filled) == 1:
            return [column[0] for column in parts]
        out = []
        for column in parts:
            out.append(np.concatenate(column))
            column.clear()
        return out


def _untouched(n: int, column: int) -> np.ndarray:
    """Room for N uint64 of COLUMN in a private mapping of its own: its pages take memory only once written to, and
    all of it goes back to the system with the array (in gdb's heap, where `ownmemory` keeps what is freed while a
    command runs, room of tens of MiB would stay beside the next phase's arrays).  In small pages, as numpy's arrays
    are while a command runs (`ownmemory`).  Staggered by the column (`_STAGGER`)."""
    pad = _STAGGER * column
    return np.frombuffer(mmap.mmap(-1, 8 * (n + pad) or 8, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS),
                         dtype=np.uint64, count=n + pad)[pad:]


class SweepRoom:
    """The room of sweeps done, given back to be written again by the next arena's sweep: a page written to
    for the first time costs the kernel a fault (microseconds on a virtual machine, a tenth of a sweep's time),
    one written before does not, and the room is the largest arena's, not every arena's."""

    def __init__(self):
        self._free: list[list[np.ndarray]] = [[] for _ in range(4)]
        self._lock = threading.Lock()    # a sweep ahead takes room on its thread while the caller gives back

    def take(self, column: int, n: int) -> np.ndarray:
        """Room for N values of COLUMN (0 address, 1 size field, 2 fd, 3 bk): a block given back, else a new one of
        the next power of two (arenas of much the same size then take each other's)."""
        with self._lock:
            free = self._free[column]
            for i, block in enumerate(free):
                if len(block) >= n:
                    return free.pop(i)
        return _untouched(1 << max(0, n - 1).bit_length(), column)

    def let_go(self) -> None:
        """Lets the room given back go (its pages to the system): no sweep will take it."""
        with self._lock:
            self._free = [[] for _ in range(4)]

    def give_back(self, sweep: Sweep) -> None:
        """Takes back the room of SWEEP's columns: the caller keeps no array of them, nor a view of one."""
        for column, values in enumerate((sweep.address, sweep.field, sweep.fd, sweep.bk)):
            block = values.base          # the whole mapping's array: the room lent was staggered in it
            if isinstance(block, np.ndarray) and isinstance(block.base, memoryview) and \
                    isinstance(block.base.obj, mmap.mmap):
                with self._lock:
                    self._free[column].append(block[_STAGGER * column:])


def _sweep_extent(mem: Memory, extent: Extent, top: int, columns: _Columns,
                  pages: PagesSeen | None = None) -> tuple[int, int] | None:
    """The chunks of EXTENT a window at a time, written to COLUMNS, and the tail bytes and kind; None at anything
    a sound heap does not have."""
    c, end = extent.first, extent.end
    has_top = extent.first <= top < end
    lo = columns.count
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
        j, k = _chunks(array64, n if last else n - _MARGIN, first, w, before, columns)
        if j < 0:
            return None
        if k:
            before = columns.last(1) & ~7
            if pages is not None:
                pages.note(w, array64)
        stop = w + 8 * (j - 1)           # the chunk the chase stopped at
        if j < (n if last else n - _MARGIN):
            return _tail(words, j, stop, extent, has_top, top, before, columns, lo)  # at a size no chunk has
        if stop > end or stop == c:
            return None                  # the last chunk runs past the extent, or memory ends here
        c = stop                         # the next chunk's header is in the next window
        w = ahead if not last and c > ahead > w else c
        del data, words, array64         # this window gone before the next is read ahead: two at a time
    if columns.count == lo or not has_top or columns.last(0) != top:
        return None
    return 0, TAIL_NONE


def _chunks(words: np.ndarray, limit: int, first: int, base: int, before: int, columns: _Columns) -> tuple[int, int]:
    """The chunks of the window WORDS (read from BASE) stepped on from the size field at word FIRST to word
    LIMIT, written to COLUMNS as `_gather` gives them, and the word the steps stopped at (-1 where `_gather`
    answers None) and how many chunks.  In one C loop when the library has it."""
    into, at = columns.room(max(0, limit - first) // (MINSIZE // 8) + 1)
    swept = sweep_window(words, limit, first, MINSIZE, base, before, into, at)
    if swept is not NotImplemented:
        if swept[0] >= 0:
            columns.wrote(swept[1])
        return swept
    found, j = chase(words[:limit], first, MINSIZE)
    if not len(found):
        return j, 0
    part = _gather(words, found, base, before)
    if part is None:
        return -1, 0
    columns.append(part)
    return j, len(found)


def _gather(words: np.ndarray, found: np.ndarray, base: int, before: int) -> tuple[np.ndarray, ...] | None:
    """The address, size field, fd and bk of each chunk whose size field is at FOUND in WORDS (read from
    BASE); None when a chunk with PREV_INUSE clear does not have its neighbour's size (BEFORE: the size of
    the chunk before the first, -1 when it is the extent's first) as prev_size.  In numpy, where the library was
    not built (`native.sweep_window` does it with the chase)."""
    if found[-1] + 2 >= len(words):
        return None                      # the last chunk runs past the extent's end
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


def _tail(words, j: int, stop: int, extent: Extent, has_top: bool, top: int, before: int, columns: _Columns,
          lo: int) -> tuple[int, int] | None:
    """How an extent without top ends, where the chase stopped at STOP (field at word J): a 16-byte
    fencepost and a zero size, or a zero size alone; None for anything else.  The extent's chunks are COLUMNS'
    from LO on."""
    end = extent.end
    if has_top or columns.count == lo:
        return None
    size = words[j] & ~7
    if size == 16 and j + 2 < len(words) and words[j + 2] & ~7 == 0:
        after = stop + 16
        if end - after > FENCEPOST_ROOM:
            return None
        fencepost = words[j]
        if not fencepost & 1 and words[j - 1] != before:
            return None
        columns.append((np.array([stop], dtype=np.uint64), np.array([fencepost], dtype=np.uint64),
                        np.zeros(1, dtype=np.uint64), np.zeros(1, dtype=np.uint64)))
        return end - after, TAIL_FENCEPOST
    if size == 0 and end - stop <= FENCEPOST_ROOM and words[j] & 1:
        leftover = before < MINSIZE + 16 and words[j - 1] == before
        return end - stop, TAIL_LEFTOVER if leftover else TAIL_ZERO
    return None
