"""Where Google's tcmalloc keeps its state in a target, found without symbols by the shapes of its static
objects in the data of the object that holds it (a program links it in; a stripped one names nothing):

- the transfer caches: one per size class, a fixed stride apart, each holding the address of the first (its
  owner): the one word equal to its own address less the owner's offset, repeated at every stride;
- the page allocator: its huge-page-aware allocators side by side, then a pointer to the first (the normal one)
  and to the second (the sampled one): the word that points its allocators' size times their count below itself;
- the per-CPU caches: the word of their slabs' address and shift, then the per-CPU stopped flags and the size
  classes' begin offsets (increasing, past the headers), then each CPU's resize record; absent while the per-CPU
  caches are off;
- the sharded transfer caches: the other word that points at the transfer caches (their owner).

Each is searched for every measured layout (`gtcmalloc.layout`); a build whose shapes none of them shows is
refused in one line."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from heapwalk.common.errors import HeapwalkError
from heapwalk.gtcmalloc.layout import LAYOUTS, PAGE, GtcLayout
from heapwalk.gtcmalloc.pagemap import find_root
from heapwalk.inferior.elf import ElfImage, writable_words
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["GtcUnknown", "Located", "locate"]


class GtcUnknown(HeapwalkError):
    """Google's tcmalloc is there, and heapwalk cannot decode it (a build it has no layout of, state it cannot
    find, or parts it does not decode)."""


@dataclass(frozen=True)
class Located:
    """Google's tcmalloc's static objects in one target, by the layout whose shapes they show."""

    layout: GtcLayout
    transfer: int                 # the transfer caches (Static::transfer_cache_)
    page_allocator: int           # Static::page_allocator_
    cpu_cache: int | None         # Static::cpu_cache_, when its slabs are allocated (per-CPU caches on)
    sharded: int | None           # Static::sharded_transfer_cache_
    pagemap: int | None           # the page map's root (Static::pagemap_), None when no page bore it out
    probes: tuple = ()            # the (page, size class) pairs it was searched by
    allocators: tuple = ()        # its metadata allocators (Spans', thread caches', ...): each {arena, lock, free list,
    #                               in use, total}
    arena: int | None = None      # the metadata arena they share (Static::arena_)
    #: the addresses in the object's data that hold a value (a static pointer to something found elsewhere)
    holders: Callable[[int], list[int]] = field(default=lambda value: [], compare=False, repr=False)


def locate(mem: Memory, image: ElfImage) -> Located:
    """The static objects of the tcmalloc IMAGE holds; GtcUnknown, saying what was not found, when no measured
    layout fits."""
    lo, words = writable_words(mem, image)
    if not len(words):
        raise GtcUnknown(f"heapwalk: {image.path} has no data to find Google's tcmalloc's state in")
    addresses = np.uint64(lo) + np.uint64(8) * np.arange(len(words), dtype=np.uint64)
    for layout in LAYOUTS:
        transfer = _transfer(words, addresses, layout, lo)
        pages = _page_allocator(words, addresses, layout)
        if transfer is None or pages is None:
            continue
        probes = tuple(_probes(mem, layout, transfer))
        return Located(layout, transfer, pages, _cpu_cache(mem, words, addresses, layout),
                       _sharded(words, addresses, layout, transfer), find_root(mem, words, lo, list(probes)), probes,
                       *_allocators(words, addresses, lo),
                       lambda value: [int(a) for a in addresses[words == np.uint64(value)]])
    raise GtcUnknown(f"heapwalk: the Google tcmalloc in {image.path} is a build whose layout heapwalk has not "
                     f"measured (it knows {', '.join(l.name for l in LAYOUTS)}): its transfer caches and page "
                     "allocator are not where those builds keep them (docs/gtcmalloc.md says how to add one)")


def _transfer(words: np.ndarray, addresses: np.ndarray, layout: GtcLayout, lo: int) -> int | None:
    """The transfer caches' start: the word at owner's offset in the first equal to that start, and so at every
    stride after it, for every size class."""
    firsts = np.nonzero(words == addresses - np.uint64(layout.tc_owner))[0]
    for index in firsts:
        start = int(addresses[index]) - layout.tc_owner
        at = (start - lo + layout.tc_owner) // 8 + np.arange(layout.classes) * (layout.tc_stride // 8)
        if at[-1] < len(words) and bool(np.all(words[at] == np.uint64(start))):
            return start
    return None


def _page_allocator(words: np.ndarray, addresses: np.ndarray, layout: GtcLayout) -> int | None:
    """The page allocator's start: the word after its huge-page-aware allocators that points at the first of
    them, followed by the one that points at the second."""
    span = layout.hpaa_size * layout.hpaa_choices
    for index in np.nonzero(words == addresses - np.uint64(span))[0]:
        start = int(addresses[index]) - span
        if index + 1 < len(words) and int(words[index + 1]) == start + layout.hpaa_size:
            return start
    return None


def _cpu_cache(mem: Memory, words: np.ndarray, addresses: np.ndarray, layout: GtcLayout) -> int | None:
    """The per-CPU caches' object, when its slabs are allocated: a page-aligned address with a shift in its low
    byte, whose begin offsets (three words on) increase from past the headers."""
    low = words & np.uint64(0xFFF)
    for index in np.nonzero((low >= 8) & (low <= 30) & (words > np.uint64(1 << 20)))[0]:
        if index + 3 >= len(words) or not words[index + 2] or not words[index + 3]:
            continue
        try:
            begins = struct.unpack(f"<{layout.classes}H", mem.read(int(words[index + 2]), 2 * layout.classes))
        except ReadError:
            continue
        if begins[1] >= layout.classes // 2 and all(begins[c] <= begins[c + 1] for c in range(1, layout.classes - 1)):
            return int(addresses[index]) - layout.cpu_slabs
    return None


def _probes(mem: Memory, layout: GtcLayout, transfer: int) -> list[tuple[int, int]]:
    """(page, size class) of the first object each transfer cache holds and of the first page of the first span on
    each central free list: pages the page map must say are of that class."""
    out = []
    q = lambda at: struct.unpack("<Q", mem.read(at, 8))[0]        # noqa: E731
    for index in range(1, layout.classes):
        entry = transfer + index * layout.tc_stride
        try:
            if struct.unpack("<i", mem.read(entry + layout.tc_used, 4))[0] > 0:
                out.append((q(q(entry + layout.tc_slots)) // PAGE, index))
            for k in range(layout.cfl_list_count):
                head = entry + layout.tc_central + layout.cfl_lists + 16 * k
                if q(head) not in (0, head):
                    out.append((q(q(head) + layout.span_first_page) & ((1 << 35) - 1), index))
                    break
        except ReadError:
            continue
    return out


def _allocators(words: np.ndarray, addresses: np.ndarray, lo: int) -> tuple[tuple[int, ...], int | None]:
    """The metadata allocators and their arena: static objects side by side, 64 bytes apart, each starting with
    the address of the one arena they all take memory from (a word of this data), then a lock, a free list, and
    the counts of objects in use and made (in use no more than made)."""
    hi = lo + 8 * len(words)
    inside = (words >= np.uint64(lo)) & (words < np.uint64(hi))
    values, counts = np.unique(words[inside], return_counts=True)
    by_arena: dict[int, list[int]] = {}
    for value in values[counts >= 3].tolist():
        at = np.nonzero(words == np.uint64(value))[0]
        if int((np.diff(at) == 8).sum()) < 2:
            continue
        for index in at.tolist():
            if index + 4 < len(words) and words[index + 3] <= words[index + 4] < np.uint64(1 << 40) \
                    and not int(words[index + 2]) % 8:
                by_arena.setdefault(value, []).append(int(addresses[index]))
    arena = max(by_arena, key=lambda v: len(by_arena[v]), default=None)
    return tuple(a for found in by_arena.values() for a in found), arena


def _sharded(words: np.ndarray, addresses: np.ndarray, layout: GtcLayout, transfer: int) -> int | None:
    """The sharded transfer caches: the word outside the transfer caches that holds their address."""
    end = transfer + layout.classes * layout.tc_stride
    for index in np.nonzero(words == np.uint64(transfer))[0]:
        at = int(addresses[index])
        if not transfer <= at < end:
            return at - layout.sharded_owner
    return None
