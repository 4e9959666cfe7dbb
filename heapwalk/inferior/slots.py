"""A free list walked through the slots of one page or span (tcmalloc's spans, mimalloc's pages): slot i is
[start + i*size, start + (i+1)*size), and each free slot links the next by its first word.  The walk reads the
page's bytes once, keeps the slots it reached as indexes (4 bytes each, not a Python integer each), and says why
it stopped: at a null link, at a link that is no slot, at a slot already on a list, or where the bytes end.

In C when `pip install` built heapwalk's small library (`_slots.c`); the same loop in Python otherwise (the tests
hold the two equal)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from heapwalk.common.view import LENGTH_UNIT
from heapwalk.inferior.clib import built_library

__all__ = ["ENDED", "OUTSIDE", "TWICE", "CUT", "Walked", "slot_list", "slot_lists", "SlotMarks", "Sorted", "NATIVE"]

#: why a walk stopped
ENDED, OUTSIDE, TWICE, CUT = 0, 1, 2, 3
_ABI = 3


def _load():
    """The built library, or None (see `inferior.clib`)."""
    lib = built_library(Path(__file__).parent, "_slots", ("hw_slots_abi", "hw_slot_list", "hw_slot_lists"))
    if lib is None or lib.hw_slots_abi() != _ABI:
        return None
    p = ctypes.c_void_p
    lib.hw_slot_list.restype = ctypes.c_int64
    lib.hw_slot_list.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64,
                                 ctypes.c_uint64, p, p, p, p]
    lib.hw_slot_lists.restype = None
    lib.hw_slot_lists.argtypes = [ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64] + [p] * 6 + \
        [ctypes.c_uint8] + [p] * 3
    return lib


_LIB = _load()
NATIVE = _LIB is not None


@dataclass(frozen=True)
class Walked:
    """The slots a list reached, in its order (uint32 indexes), why it stopped (ENDED, OUTSIDE, TWICE, CUT) and
    where (the link that is no slot, the slot met again, the slot whose word is missing; 0 at ENDED)."""

    slots: np.ndarray
    stop: int
    at: int


def slot_list(data: bytes, start: int, size: int, count: int, head: int, seen: np.ndarray) -> Walked:
    """The list from HEAD through the COUNT slots of SIZE bytes from START, whose bytes DATA holds (from START;
    a slot whose first word DATA lacks ends the walk: CUT); SEEN (uint8, a slot each, shared by a page's lists)
    marks the slots reached, this walk's added."""
    out = np.empty(count, dtype=np.uint32)
    if _LIB is not None and count:
        stop, at = ctypes.c_int32(0), ctypes.c_uint64(0)
        n = _LIB.hw_slot_list(bytes(data) if not isinstance(data, bytes) else data, len(data), start, size, count,
                              head, seen.ctypes.data, out.ctypes.data, ctypes.addressof(stop), ctypes.addressof(at))
        return Walked(out[:n].copy(), stop.value, at.value)
    n, link = 0, head
    while link:
        off = link - start
        if link < start or off // size >= count or off % size:
            return Walked(out[:n].copy(), OUTSIDE, link)
        i = off // size
        if seen[i]:
            return Walked(out[:n].copy(), TWICE, link)
        seen[i] = 1
        out[n] = i
        n += 1
        if off + 8 > len(data):
            return Walked(out[:n].copy(), CUT, link)
        link = int.from_bytes(data[off:off + 8], "little")
    return Walked(out[:n].copy(), ENDED, 0)


def slot_lists(data: bytes, base: int, starts: np.ndarray, sizes: np.ndarray, counts: np.ndarray, heads: np.ndarray,
               offsets: np.ndarray, seen: np.ndarray, mark: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lists of many pages at once, whose bytes DATA holds from BASE: page k's COUNTS[k] slots of SIZES[k]
    bytes from STARTS[k] (uint64), its list from HEADS[k] (uint64; 0: none), its marks at SEEN[OFFSETS[k]:]
    (int64), each slot reached marked MARK (1 to 255).  (how many slots each reached, why it stopped, where): as
    `slot_list` says, without the slots; a page DATA does not hold whole is CUT at its start, not walked."""
    n = len(starts)
    found, stops, ats = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int32), np.zeros(n, dtype=np.uint64)
    if _LIB is not None:
        args = [np.ascontiguousarray(a, dtype=t) for a, t in ((starts, np.uint64), (sizes, np.int64),
                                                             (counts, np.int64), (heads, np.uint64),
                                                             (offsets, np.int64))]
        _LIB.hw_slot_lists(bytes(data) if not isinstance(data, bytes) else data, len(data), base, n,
                           *(a.ctypes.data for a in args), seen.ctypes.data, mark, found.ctypes.data,
                           stops.ctypes.data, ats.ctypes.data)
        return found, stops, ats
    for k in range(n):
        start, size, count = int(starts[k]), int(sizes[k]), int(counts[k])
        if start < base or start + count * size > base + len(data):
            stops[k], ats[k] = CUT, start
            continue
        lo, offset = start - base, int(offsets[k])
        marks = seen[offset:offset + count]
        walked = slot_list(data[lo:lo + count * size], start, size, count, int(heads[k]), marks)
        marks[walked.slots] = mark
        found[k], stops[k], ats[k] = len(walked.slots), walked.stop, walked.at
    return found, stops, ats


#: slots made into addresses at a time
_STEP = 1 << 16


class SlotMarks:
    """A byte for each slot of many pages (STARTS ascending, uint64; their slots' SIZES and COUNTS, int64), page k's
    from OFFSETS[k]: the walks of its lists and the caches' blocks mark the free ones (or every one of a page whose
    lists are not known), and those left unmarked are the program's blocks, made into addresses `_STEP` at a time
    (no array of every slot's address is made)."""

    def __init__(self, starts: np.ndarray, sizes: np.ndarray, counts: np.ndarray):
        self.starts, self.sizes, self.counts = starts, sizes.astype(np.int64), counts.astype(np.int64)
        self.offsets = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(self.counts, out=self.offsets[1:])
        self.marks = np.zeros(int(self.offsets[-1]), dtype=np.uint8)

    def of(self, k: int) -> np.ndarray:
        """The marks of page K (a view)."""
        return self.marks[self.offsets[k]:self.offsets[k + 1]]

    def mark(self, addresses: np.ndarray) -> None:
        """Marks the slots at ADDRESSES (uint64); an address in no page's slots, or not at a slot's start, marks
        nothing."""
        good, at = self._at(addresses)
        self.marks[at[good]] = 1

    def marked(self, addresses: np.ndarray) -> np.ndarray:
        """Whether each of ADDRESSES (uint64) is the start of a slot marked (a mask)."""
        good, at = self._at(addresses)
        good[good] = self.marks[at[good]] != 0
        return good

    def _at(self, addresses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Whether each of ADDRESSES starts a slot of the pages, and where its mark is (meaningful where it does)."""
        addresses = np.asarray(addresses, dtype=np.uint64)
        k = np.searchsorted(self.starts, addresses, side="right") - 1
        inside = k >= 0
        k = np.maximum(k, 0)
        offset = addresses - self.starts[k] if len(self.starts) else addresses
        size = self.sizes[k].astype(np.uint64) if len(self.starts) else np.ones(len(addresses), dtype=np.uint64)
        index = offset // size
        counts = self.counts[k].astype(np.uint64) if len(self.starts) else np.zeros(len(addresses), dtype=np.uint64)
        good = inside & (offset % size == 0) & (index < counts)
        return good, np.where(good, self.offsets[k] + index.astype(np.int64), 0)

    def mark_slots(self, k: int, slots: np.ndarray) -> None:
        """Marks page K's SLOTS (indexes)."""
        self.marks[self.offsets[k] + np.asarray(slots, dtype=np.int64)] = 1

    def unmarked(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(addresses, sizes as uint64, pages) of the slots left unmarked, in address order, `_STEP` slots at a
        time."""
        for at in range(0, len(self.marks), _STEP):
            g = np.flatnonzero(self.marks[at:at + _STEP] == 0) + at
            k = np.searchsorted(self.offsets, g, side="right") - 1
            size = self.sizes[k].astype(np.uint64)
            yield self.starts[k] + (g - self.offsets[k]).astype(np.uint64) * size, size, k

    def unmarked_counts(self) -> np.ndarray:
        """How many of each page's slots are left unmarked (int64): the blocks `blocks` makes of it, in its order."""
        marked = np.zeros(len(self.starts), dtype=np.int64)
        for at in range(0, len(self.marks), _STEP):
            g = np.flatnonzero(self.marks[at:at + _STEP]) + at
            marked += np.bincount(np.searchsorted(self.offsets, g, side="right") - 1, minlength=len(self.starts))
        return self.counts - marked

    def blocks(self, tags: np.ndarray, other: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> Sorted:
        """The unmarked slots, with OTHER blocks (starts ascending, sizes, tags: a span of one allocation each)
        merged in: made straight into the arrays `view.Blocks` keeps (`Sorted`), each block tagged with its page's
        TAGS[k] (or its own)."""
        o_starts, o_sizes, o_tags = other if other is not None else (np.zeros(0, dtype=np.uint64),) * 2 + (tags[:0],)
        o_sizes = np.asarray(o_sizes, dtype=np.uint64)
        n = int(len(self.marks) - np.count_nonzero(self.marks)) + len(o_starts)
        fits = (not len(self.sizes) or not np.any(self.sizes % LENGTH_UNIT)) and not np.any(o_sizes % LENGTH_UNIT) \
            and int(max(self.sizes.max(initial=0), o_sizes.max(initial=0))) // LENGTH_UNIT < 1 << 32
        out = Sorted(np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint32) if fits else None,
                     None if fits else np.empty(n, dtype=np.uint64), _tags_room(n, tags, o_tags))
        placed, before = 0, np.zeros(len(o_starts), dtype=np.int64)   # each other block's slots below it (a slot
        #                                                                at the same address goes after it)
        for addresses, sizes, k in self.unmarked():
            at = placed + np.searchsorted(o_starts, addresses, side="right") + np.arange(len(addresses))
            out.put(at, addresses, sizes, tags[k])
            before += np.searchsorted(addresses, o_starts)
            placed += len(addresses)
        out.put(before + np.arange(len(o_starts)), o_starts, o_sizes, o_tags)
        return out


def _tags_room(n: int, tags: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Room for N blocks' tags, each a page's of TAGS or one of OTHER: where they are all one tag, that tag seen as
    N of them (read-only, no byte a block: a heap of one arena's blocks)."""
    both = np.concatenate((np.asarray(tags).ravel(), np.asarray(other, dtype=tags.dtype).ravel()))
    if len(both) and bool((both == both[0]).all()):
        return np.broadcast_to(both[:1].copy(), (n,))
    return np.empty(n, dtype=tags.dtype)


@dataclass
class Sorted:
    """Blocks in address order as `view.Blocks` keeps them: STARTS, and LENGTHS in `view.LENGTH_UNIT`s (uint32) or
    ENDS where a size does not fit that; a tag each (one seen as many where all are one: `_tags_room`)."""

    starts: np.ndarray
    lengths: np.ndarray | None
    ends: np.ndarray | None
    tags: np.ndarray

    def put(self, at: np.ndarray, starts: np.ndarray, sizes: np.ndarray, tags: np.ndarray) -> None:
        """Blocks at STARTS of SIZES (uint64) with TAGS, at the places AT."""
        self.starts[at] = starts
        if self.lengths is not None:
            self.lengths[at] = sizes // np.uint64(LENGTH_UNIT)
        else:
            self.ends[at] = starts + sizes
        if self.tags.strides != (0,):      # one tag for every block (`_tags_room`): nothing to write
            self.tags[at] = tags
