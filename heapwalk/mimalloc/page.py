"""A page of mimalloc's blocks of one size, as the decoder reads it: where its blocks are, how many are cut,
in use and free on each list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from heapwalk.common.slotted import slotted

__all__ = ["MiPage", "LISTS"]


#: the lists a block may be on, by the mark the walks give it (`lists.list_of` says which holds a block)
LISTS = {1: "free", 2: "local free", 3: "thread free", 4: "delayed"}


#: the marks of a page no list holds a block of
_NO_MARKS = np.zeros(0, dtype=np.uint8)
_NO_MARKS.flags.writeable = False


@slotted
@dataclass
class MiPage:
    """A page of blocks of one size: where its blocks start, how many it has made (capacity) and may make
    (reserved), and how many are free on each list."""

    segment: int
    index: int                  # its first slice
    address: int                # its mi_page_t (its first slice's entry)
    slices: int
    start: int                  # its first block
    block_size: int
    capacity: int
    reserved: int
    used: int                   # blocks in use, those on the thread-free and delayed lists included
    heap: int                   # 0: abandoned
    in_full: bool
    heads: tuple[int, int, int] = (0, 0, 0)   # its free, local-free and thread-free lists' first blocks
    free: int = 0               # blocks on its free list
    local_free: int = 0
    thread_free: int = 0
    delayed: int = 0            # blocks of it on its heap's delayed-free list
    damaged: bool = False       # a list of it could not be walked to its end: which blocks are free is unknown
    marks: Any = field(default=None, compare=False, repr=False)   # the bits its `freed` lies in, or None
    marks_at: int = 0           # its first block's bit in them

    @property
    def freed(self) -> Any:
        """A byte for each block it cut (numpy uint8; none where no list holds one): 1 where a list holds it, else
        0 (`lists.list_of` says which list).  Made from its bits of the marks (`marks`: a bit a block, packed
        little-endian, one array for many pages)."""
        if self.marks is None:
            return _NO_MARKS
        first = self.marks_at >> 3
        bits = np.unpackbits(self.marks[first:(self.marks_at + self.cut + 7) >> 3], bitorder="little")
        return bits[self.marks_at & 7:(self.marks_at & 7) + self.cut]

    @freed.setter
    def freed(self, marks: Any) -> None:
        """Marks the blocks where MARKS (a byte each) are not 0 (in bits of its own)."""
        self.marks, self.marks_at = np.packbits(np.asarray(marks) != 0, bitorder="little"), 0

    @property
    def end(self) -> int:
        """One past its last byte of slices."""
        return self.segment + (self.index + self.slices) * 65536

    @property
    def room(self) -> int:
        """Blocks it reserved, as many as its slices hold (a damaged count is held to them)."""
        return min(self.reserved, max(self.end - self.start, 0) // self.block_size)

    @property
    def cut(self) -> int:
        """Blocks it has cut (its capacity), within what it reserved."""
        return min(self.capacity, self.room)

    @property
    def in_use(self) -> int:
        """Blocks the program holds: those it counts used (within those it cut and its own lists leave), less those
        other threads freed."""
        return max(min(self.used, self.cut - self.free - self.local_free) - self.thread_free - self.delayed, 0)

    @property
    def free_cut(self) -> int:
        """Its free blocks, within those it cut and does not hold (damage never makes a figure impossible)."""
        return max(min(self.free_blocks, self.cut - self.in_use), 0)

    @property
    def free_blocks(self) -> int:
        return self.free + self.local_free + self.thread_free + self.delayed
