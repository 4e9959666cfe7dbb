"""tcmalloc's state found in the writable memory of the object that holds it, without symbols, by shapes no
other data has:

- the size map: its array of class sizes (0, 8, 16, 32, 48, 64... as 4-byte integers), with the objects moved
  at once per class before it and the pages per class's span after it, and the count of classes;
- the page heap: its free lists, one pair (normal, returned) of list heads per span length up to its largest
  (``kMaxPages``, indexed by length less one), every empty one a head whose next and previous point to itself,
  every other one a head its first and last span link back to: a run of such pairs 96 bytes apart, whose length
  gives the page size (``kMaxPages`` is 1 MiB of pages); its statistics follow them;
- the central free lists: one per class, ``central_stride`` bytes apart, each holding its class at
  ``central_size_class`` and two list heads (empty and non-empty spans);
- the thread caches: the list the exported ``ThreadCache::thread_heaps_`` starts, else the cache whose thread
  is each thread of the target (its ``tid_``) found among the object's words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from heapwalk.errors import CannotDecode
from heapwalk.inferior.elf import readable_runs
from heapwalk.inferior.x86 import MOV, rip_loads
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.tcmalloc.find import TcImage
from heapwalk.tcmalloc.layout import LAYOUTS, SPAN, TcLayout

__all__ = ["TcDiscovery", "discover_tcmalloc", "TcmallocUnknown"]

_THREAD_HEAPS = "_ZN8tcmalloc11ThreadCache13thread_heaps_E"
_OVERALL = "_ZN8tcmalloc11ThreadCache26overall_thread_cache_size_E"
_METADATA = "_ZN8tcmalloc21metadata_system_bytesEv"
_FIRST_SIZES = (0, 8, 16, 32)


class TcmallocUnknown(CannotDecode):
    """tcmalloc is mapped, but its state does not show the shapes of any build heapwalk knows."""


@dataclass(frozen=True)
class TcDiscovery:
    """Where tcmalloc's state is, with how each part was found."""

    layout: TcLayout
    version: str
    library: str
    sizemap: int                 # class_to_size_[0]
    free_lists: int              # the page heap's free_[0]
    max_pages: int               # kMaxPages
    page_size: int
    stats: int                   # the page heap's stats_
    central: int                 # central_cache_[0]
    classes: int                 # num_size_classes
    thread_heaps: int | None     # the first ThreadCache (None: none)
    facts: tuple[tuple[str, str], ...] = ()
    metadata: int | None = None  # the counter of metadata bytes (metadata_system_bytes_), when found
    overall: int | None = None   # ThreadCache::overall_thread_cache_size_, when exported


def discover_tcmalloc(mem: Memory, found: TcImage, fs_bases: Sequence[int] = ()) -> TcDiscovery:
    """tcmalloc's state in the object FOUND names; TcmallocUnknown when its shapes are not there."""
    base, words = _writable_words(mem, found)
    layout = LAYOUTS[0]
    sizemap, classes = _sizemap(base, words, layout)
    free_lists, max_pages = _free_lists(mem, base, words)
    central = _central(base, words, layout, classes)
    heaps, how = _thread_heaps(mem, found, base, words, layout, fs_bases)
    page_size = (1 << 20) // max_pages
    facts = (("size map", f"class sizes at {sizemap:#x} ({classes} classes)"),
             ("page heap", f"free lists at {free_lists:#x} ({max_pages} lengths: pages of {page_size} bytes)"),
             ("central free lists", f"at {central:#x}"), ("thread caches", how))
    metadata, overall = _metadata(mem, found), found.image.dynamic_symbol(_OVERALL)
    return TcDiscovery(layout, found.version, found.path, sizemap, free_lists, max_pages, page_size,
                       free_lists + max_pages * layout.free_list_pair, central, classes, heaps, facts, metadata,
                       overall)


def _metadata(mem: Memory, found: TcImage) -> int | None:
    """The counter of metadata bytes: what the exported metadata_system_bytes() loads (its first instruction,
    a RIP-relative mov), or None."""
    at = found.image.dynamic_symbol(_METADATA)
    if at is None:
        return None
    try:
        loads = rip_loads(mem.read(at, 16), at)
    except ReadError:
        return None
    return loads[0].target if loads and loads[0].offset == 0 and loads[0].opcode == MOV else None


def _writable_words(mem: Memory, found: TcImage) -> tuple[int, np.ndarray]:
    """The object's writable segments (its data and bss) as one array of words from their start (what cannot
    be read as zeros)."""
    segments = found.image.writable()
    if not segments:
        raise TcmallocUnknown(f"{found.path} has no writable segment")
    lo = min(s.address for s in segments) & ~7
    hi = max(s.end for s in segments)
    data = bytearray(hi - lo)
    for s in segments:
        for at, chunk in readable_runs(mem, s.address, s.memsz):
            data[at - lo:at - lo + len(chunk)] = chunk
    return lo, np.frombuffer(bytes(data[:len(data) // 8 * 8]), dtype=np.uint64)


def _heads(base: int, words: np.ndarray) -> np.ndarray:
    """The addresses of the empty list heads: Spans whose next and previous both point to themselves."""
    at = base + np.arange(len(words), dtype=np.uint64) * np.uint64(8)
    nxt = np.flatnonzero((words[2:-1] == at[:-3]) & (words[3:] == at[:-3]))
    return (at[nxt]).astype(np.int64)


def _sizemap(base: int, words: np.ndarray, layout: TcLayout) -> tuple[int, int]:
    """(address of class_to_size_, num_size_classes): the 4-byte array 0, 8, 16, 32, ... increasing to its
    last class, zeros after it, with the count of classes where the layout puts it."""
    ints = words.view(np.int32)
    first = np.flatnonzero((ints[:-3] == 0) & (ints[1:-2] == 8) & (ints[2:-1] == 16) & (ints[3:] == 32))
    for i in first.tolist():
        sizes = ints[i:i + layout.classes_max]
        if len(sizes) < layout.classes_max:
            continue
        count = 1 + int(np.argmax(sizes[1:] == 0)) if (sizes[1:] == 0).any() else layout.classes_max
        if not (np.diff(sizes[:count]) > 0).all() or (sizes[count:] != 0).any():
            continue
        address = base + 4 * i
        pages = (address + layout.sizemap_pages_after + 7) & ~7
        classes = int(words[(pages + 8 * layout.classes_max - base) // 8])
        if classes == count:
            return address, count
    raise TcmallocUnknown("tcmalloc's size map was not found in its data")


def _free_lists(mem: Memory, base: int, words: np.ndarray) -> tuple[int, int]:
    """(address of the page heap's free_[0], kMaxPages): the longest run of list pairs (normal, returned) 96
    bytes apart, each list empty (a head linked to itself) or holding spans (its first and last span link back
    to it), kMaxPages a power of two."""
    present = set(_heads(base, words).tolist())

    def is_list(head: int) -> bool:
        return head in present or _holds_spans(mem, base, words, head)

    def is_pair(at: int) -> bool:
        return is_list(at) and is_list(at + SPAN)
    best = (0, 0)
    for start in sorted({x for h in present for x in (h, h - SPAN)}):
        if not is_pair(start) or is_pair(start - 2 * SPAN):
            continue
        count = 1
        while count < 1 << 12 and is_pair(start + 2 * SPAN * count):
            count += 1
        if count > best[1]:
            best = (start, count)
    start, count = best
    if count < 16 or count & (count - 1):
        raise TcmallocUnknown(f"tcmalloc's page heap was not found in its data (the longest run of free lists "
                              f"holds {count} pairs, not a power of two)")
    return start, count


def _holds_spans(mem: Memory, base: int, words: np.ndarray, head: int) -> bool:
    """Whether the list head at HEAD (in the object's data) holds spans: its first span's previous and its last
    span's next are HEAD (a doubly linked list)."""
    i = (head - base) // 8
    if i < 0 or i + 4 > len(words):
        return False
    first, last = int(words[i + 2]), int(words[i + 3])
    if not first or not last or first == head:
        return False
    try:
        return int.from_bytes(mem.read(first + 24, 8), "little") == head and \
            int.from_bytes(mem.read(last + 16, 8), "little") == head
    except ReadError:
        return False


def _central(base: int, words: np.ndarray, layout: TcLayout, classes: int) -> int:
    """central_cache_[0]: the array whose entry k holds class k, for every class."""
    stride = layout.central_stride // 8
    for h in _heads(base, words).tolist():
        entry = h - layout.central_empty
        i = (entry - base) // 8
        last = i + (classes - 1) * stride + layout.central_size_class // 8
        if i < 0 or last >= len(words) or int(words[i + layout.central_size_class // 8]) != 0:
            continue
        held = words[i + layout.central_size_class // 8: last + 1: stride]
        if len(held) == classes and (held == np.arange(classes, dtype=np.uint64)).all():
            return entry
    raise TcmallocUnknown("tcmalloc's central free lists were not found in its data")


def _thread_heaps(mem: Memory, found: TcImage, base: int, words: np.ndarray, layout: TcLayout,
                  fs_bases: Sequence[int]) -> tuple[int | None, str]:
    """The first thread cache of tcmalloc's list, and how it was found."""
    at = found.image.dynamic_symbol(_THREAD_HEAPS)
    if at is not None:
        try:
            return int.from_bytes(mem.read(at, 8), "little") or None, "ThreadCache::thread_heaps_ (exported)"
        except ReadError:
            pass
    threads = {int(f) for f in fs_bases if f}
    for i in np.flatnonzero(words > np.uint64(0x10000)).tolist():
        pointer = int(words[i])
        try:
            tid = int.from_bytes(mem.read(pointer + layout.thread_tid, 8), "little")
            prev = int.from_bytes(mem.read(pointer + layout.thread_prev, 8), "little")
        except ReadError:
            continue
        if tid in threads and prev == 0:
            return pointer, f"the list's head at {base + 8 * i:#x} (its first cache's thread is one of the target's)"
    return None, "none found"
