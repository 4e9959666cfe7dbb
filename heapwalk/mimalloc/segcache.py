"""mimalloc 2.0's segment cache: a table of 1024 slots in the object's data, each the address of a segment freed
whole (or NULL), its memory id, whether it is pinned, its commit mask and the mask of what waits for its purge,
and when that purge is due; a bitmap of 16 words, a bit per slot in use, and one of the slots available (all
ones, but a slot that holds a segment; huge OS pages' slots have a bitmap of their own).  A cached segment keeps
its header only while the cache has not decommitted it; the slot says where it is either way.  Found without
symbols: the slots are the segment-aligned words of the data at one stride, a bitmap in the data has exactly
their bits set, and another exactly the others."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heapwalk.mimalloc.layout import MiLayout
from heapwalk.arch import USER_SPACE_END

__all__ = ["CacheSlot", "find_segment_cache", "slot_words", "SLOTS"]

SLOTS = 1024            # MI_CACHE_MAX
_FIELDS = SLOTS // 64
_TOP = USER_SPACE_END     # user-space addresses end below this


@dataclass(frozen=True)
class CacheSlot:
    """One segment the cache keeps: its address, memory id (an arena's number in its low 7 bits), whether it is
    pinned (never decommitted), and the slices committed, a bit each."""

    segment: int
    memid: int
    pinned: bool
    commit_mask: int


def slot_words(layout: MiLayout) -> int:
    """Words of a slot: address, memid, pinned, two masks of a bit per slice, expiry."""
    return 4 + 2 * layout.mask_bytes // 8


def find_segment_cache(base: int, words: np.ndarray, layout: MiLayout, live: set[int]
                       ) -> tuple[int | None, tuple[CacheSlot, ...]]:
    """(the table's address, its slots in use) in the object's data (BASE, WORDS): the segment-aligned words, not
    LIVE segments, whose slot reads as one (pinned 0 or 1), at the places of the bits of a 16-word bitmap of the
    data, and no other such word within the table.  (None, ()) when it is not found (an empty cache cannot be)."""
    stride = slot_words(layout)
    found = _candidates(words, layout, live, stride)
    for r in sorted(set((found % stride).tolist())):
        group = found[found % stride == r].tolist()
        members = set(group)
        for count in range(len(group), 0, -1):
            for w in _bitmaps(base, words, count):
                bits = _bit_indices(words[w:w + _FIELDS])
                for anchor in group:
                    start = anchor - bits[0] * stride
                    end = start + SLOTS * stride
                    if start < 0 or (base + 8 * start) % 64 or end > len(words):
                        continue
                    slots = [start + b * stride for b in bits]
                    if set(slots) == {a for a in members if start <= a < end} and \
                            _available(base, words, words[w:w + _FIELDS]):
                        return base + 8 * start, tuple(_slot(words, a, layout) for a in slots)
    return None, ()


def _candidates(words: np.ndarray, layout: MiLayout, live: set[int], stride: int) -> np.ndarray:
    """The word indices that read as a slot in use: a segment-aligned address that is no live segment, a memory
    id from the system (0) or of an arena (its number, 1 to 64, in its low 7 bits), a pinned flag of 0 or 1, and
    room for the slot."""
    if len(words) < stride:
        return np.zeros(0, dtype=np.int64)
    mask = np.uint64(layout.segment_size - 1)
    aligned = (words != 0) & ((words & mask) == 0) & (words < np.uint64(_TOP))
    aligned[len(words) - stride + 1:] = False
    at = np.flatnonzero(aligned)
    memid = words[at + 1]
    arena = memid & np.uint64(0x7F)
    at = at[(words[at + 2] <= 1) & ((memid == 0) | ((arena >= 1) & (arena <= 64)))]
    return np.array([a for a in at.tolist() if int(words[a]) not in live], dtype=np.int64)


def _bitmaps(base: int, words: np.ndarray, count: int) -> list[int]:
    """The 64-byte-aligned runs of 16 words of the data with COUNT bits set in all (the bitmap of slots in
    use), as word indices."""
    if len(words) < _FIELDS:
        return []
    ones = np.unpackbits(words.view(np.uint8)).reshape(-1, 64).sum(axis=1)
    sums = np.concatenate(([0], np.cumsum(ones)))
    first = (-(base // 8)) % 8
    starts = np.arange(first, len(words) - _FIELDS + 1, 8)
    return starts[(sums[starts + _FIELDS] - sums[starts]) == count].tolist()


def _available(base: int, words: np.ndarray, inuse: np.ndarray) -> bool:
    """Whether the data holds the bitmap of slots available next to INUSE: all ones but the slots in use (a cleared
    bit is a slot that holds a segment)."""
    count = SLOTS - int(np.unpackbits(inuse.view(np.uint8)).sum())
    return any(np.array_equal(words[w:w + _FIELDS], ~inuse) for w in _bitmaps(base, words, count))


def _bit_indices(field: np.ndarray) -> list[int]:
    """The indices of the bits set in FIELD (16 words, lowest first)."""
    value = int.from_bytes(field.tobytes(), "little")
    return [i for i in range(SLOTS) if value >> i & 1]


def _slot(words: np.ndarray, at: int, layout: MiLayout) -> CacheSlot:
    """The slot at word AT."""
    mask = words[at + 3:at + 3 + layout.mask_bytes // 8].tobytes()
    return CacheSlot(int(words[at]), int(words[at + 1]), bool(words[at + 2] & np.uint64(0xFF)),
                     int.from_bytes(mask, "little"))
