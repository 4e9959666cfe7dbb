"""mimalloc 3's page map: for each 64 KiB of the address space, the page that covers it.  A table in the
system's memory (a pointer each 512 MiB of addresses) whose first entry points just past the table itself, to
the sub-map of the first 512 MiB, whose first entry is the library's empty page (NULL from 3.2); each other
entry, when set, points to a sub-map (64 KiB taken from the system) of the pages of its 512 MiB.  Found
without symbols by that shape, from a word of the library's data; it names every page, those taken from the
system included."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heapwalk.common.arrays import distinct
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.arch import USER_SPACE_END

__all__ = ["PageMap", "find_page_map"]

_SUB_ENTRIES = 1 << 13
_TOP = USER_SPACE_END     # user-space addresses end below this


@dataclass(frozen=True)
class PageMap:
    """The page map at ADDRESS: the sub-maps taken from the system (their count), and every page it names."""

    address: int
    subs: int
    pages: frozenset[int]
    size: int = 0                                 # its table's bytes
    ranges: tuple[tuple[int, int], ...] = ()      # its table and sub-maps: mimalloc's own memory, never a root


def find_page_map(mem: Memory, base: int, words: np.ndarray, image: tuple[int, int],
                  readable: list[tuple[int, int]] | None, header: int = 0, null_first: bool = True
                  ) -> PageMap | None:
    """The page map a word of the object's data (WORDS from BASE) points to: a table whose first entry points
    just past it (its size a power of two) to a sub-map whose first entry is in the object (IMAGE: its
    addresses: the empty page), or NULL (from 3.1, NULL_FIRST; before, a NULL there is a block of zeros that
    looks like it, as in a 3.0.1 core where a word of the data pointed into an arena); from 3.6 (HEADER: its
    fields' bytes before the table) a structure that names itself (its memid) and its size, the first entry of
    its table pointing just past it.  None when no word does.  READABLE: what may be read of the process (None:
    all)."""
    lo, hi = image
    pointer = np.flatnonzero((words > np.uint64(0x10000)) & (words < np.uint64(_TOP)) &
                             ((words & np.uint64(0xFFF)) == 0))
    for i in pointer.tolist():
        at = int(words[i])
        try:
            if header:
                size = u64(mem, at + 8)
                if size % 4096 or not header < size <= 1 << 30 or u64(mem, at + 16) != at or \
                        u64(mem, at + header) != at + size:
                    continue
            else:
                first = u64(mem, at)
                size = first - at
                null = u64(mem, first)
                if size < 4096 or size > 1 << 30 or size & (size - 1) or \
                        (null or not null_first) and not lo <= null < hi:
                    continue
        except ReadError:
            continue
        return _walk(mem, at, header, size, readable)
    return None


def _walk(mem: Memory, at: int, header: int, size: int, readable: list[tuple[int, int]] | None) -> PageMap:
    """Every page the map at AT (SIZE bytes, its table HEADER bytes in) names."""
    subs, pages, ranges = 0, set(), [(at, at + size + 8 * _SUB_ENTRIES)]
    for lo, hi in _within(at + header, at + size, readable):
        try:
            table = np.frombuffer(mem.read(lo, hi - lo), dtype=np.uint64)
        except ReadError:
            continue
        for j in np.flatnonzero(table).tolist():
            if lo + 8 * j == at + header:
                continue            # the first 512 MiB: its sub-map is inside the table's own allocation
            subs += 1
            sub = int(table[j])
            ranges.append((sub, sub + 8 * _SUB_ENTRIES))
            for a, b in _within(sub, sub + 8 * _SUB_ENTRIES, readable):
                try:
                    entries = np.frombuffer(mem.read(a, b - a), dtype=np.uint64)
                except ReadError:
                    continue
                pages.update(distinct(entries[entries != 0]).tolist())
    return PageMap(at, subs, frozenset(pages), size, tuple(ranges))


def _within(lo: int, hi: int, readable: list[tuple[int, int]] | None) -> list[tuple[int, int]]:
    """LO..HI, within READABLE when given, 8-byte aligned."""
    if readable is None:
        return [(lo, hi)]
    return [(max(lo, a) & ~7, min(hi, b)) for a, b in readable if min(hi, b) > max(lo, a)]
