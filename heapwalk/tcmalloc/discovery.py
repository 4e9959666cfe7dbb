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
- the thread caches: the list the exported ``ThreadCache::thread_heaps_`` starts, else the first cache of the
  list found among the object's words: a cache's free lists carry the size map's class sizes, one per class,
  and the first has no previous.

The layout is the one of the version the object says, checked against these shapes; when the version is not
said, or its layout's shapes are not there, each known layout is tried, newest first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heapwalk.common.errors import CannotDecode
from heapwalk.inferior.elf import writable_words
from heapwalk.inferior.memory import Memory, ReadError, readable, u64
from heapwalk.tcmalloc.find import TcImage
from heapwalk.tcmalloc.layout import LAYOUTS, SPAN, TcLayout

__all__ = ["TcDiscovery", "discover_tcmalloc", "TcmallocUnknown"]

_THREAD_HEAPS = "_ZN8tcmalloc11ThreadCache13thread_heaps_E"
_OVERALL = "_ZN8tcmalloc11ThreadCache26overall_thread_cache_size_E"
_METADATA = "_ZN8tcmalloc21metadata_system_bytesEv"
_FIRST_SIZES = (0, 8, 16, 32)
_CHUNK = np.uint64(8 << 20)       # kMetadataAllocChunkSize: the metadata allocator's chunks


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


def discover_tcmalloc(mem: Memory, found: TcImage) -> TcDiscovery:
    """tcmalloc's state in the object FOUND names; TcmallocUnknown when its shapes are not there."""
    base, words = writable_words(mem, found.image)
    if not len(words):
        raise TcmallocUnknown(f"{found.path} has no writable segment")
    free_lists, max_pages = _free_lists(mem, base, words)
    page_size = (1 << 20) // max_pages
    failed: list[str] = []
    for layout in _candidates(found.version):
        try:
            sizemap, classes = _sizemap(base, words, layout)
            central = _central(base, words, layout, classes)
            sizes = np.frombuffer(mem.read(sizemap, 4 * classes), dtype=np.int32)
            heaps, how = _thread_heaps(mem, found, base, words, layout, sizes)
        except (TcmallocUnknown, ReadError) as exc:
            failed.append(f"{layout.versions}: {exc}")
            continue
        facts = (("layout", f"gperftools {layout.versions}'s" + _unmeasured(found.version, layout)),
                 ("size map", f"class sizes at {sizemap:#x} ({classes} classes)"),
                 ("page heap", f"free lists at {free_lists:#x} ({max_pages} lengths: pages of {page_size} bytes)"),
                 ("central free lists", f"at {central:#x}"), ("thread caches", how))
        metadata = _metadata(mem, found)
        if metadata is None:
            metadata = _metadata_by_shape(mem, base, words)
        overall = found.image.dynamic_symbol(_OVERALL)
        if overall is None:
            overall = _overall_by_shape(base, words, _claimed(mem, heaps, layout))
        return TcDiscovery(layout, found.version, found.path, sizemap, free_lists, max_pages, page_size,
                           free_lists + max_pages * layout.free_list_pair, central, classes, heaps, facts, metadata,
                           overall)
    said = f"gperftools {found.version}" if found.version else "a gperftools that does not say its version"
    raise TcmallocUnknown(f"{said}: no known layout fits its data ({'; '.join(failed)})")


def _unmeasured(version: str, layout: TcLayout) -> str:
    """What the layout fact adds when VERSION is not one of those LAYOUT was measured on: newer than any, or
    not said (its data matched the layout's shapes all the same)."""
    if not version:
        return " (the build does not say its version; its data has this layout's shapes)"
    last = LAYOUTS[-1].versions.split("-")[-1]
    number = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    if number > tuple(int(p) for p in last.split(".")):
        return f" (gperftools {version} is newer than any heapwalk measured, {last}; its data has these shapes)"
    return ""


def _candidates(version: str) -> list[TcLayout]:
    """The layouts to try for VERSION: its own first, then the others newest first."""
    newest = list(reversed(LAYOUTS))
    try:
        number = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        return newest
    own = next((lay for lay in newest if lay.first <= number), None)
    return [own, *(lay for lay in newest if lay is not own)] if own else newest


def _metadata(mem: Memory, found: TcImage) -> int | None:
    """The counter of metadata bytes: what the exported metadata_system_bytes() loads (its first instruction,
    past a branch-target marker, reads a global), or None."""
    at = found.image.dynamic_symbol(_METADATA)
    if at is None:
        return None
    try:
        code = mem.read(at, 16)
    except ReadError:
        return None
    return found.image.code.first_load(code, at)


def _metadata_by_shape(mem: Memory, base: int, words: np.ndarray) -> int | None:
    """The counter of metadata bytes where no symbol says: the one run of the metadata allocator's statics
    (its lock, a 4-byte spin lock word padded to 8, free at 0; the bytes left in its chunk, at most the 8 MiB a
    chunk holds; the next free byte, which with them ends a chunk on a page boundary; the counter, at least the
    bytes used of that chunk).  None unless exactly one run has that shape."""
    if len(words) < 4:
        return None
    lock, avail, at, used = words[:-3], words[1:-2], words[2:-1], words[3:]
    shaped = np.flatnonzero((lock < 3) & (avail <= _CHUNK) & (at > 0x10000) & (((at + avail) & 0xFFF) == 0)
                            & (used >= np.uint64(_CHUNK) - avail) & (used < np.uint64(1 << 44)))
    ends = [i for i in shaped.tolist() if readable(mem, int(words[i + 2]) - 8)]
    return base + 8 * (ends[0] + 3) if len(ends) == 1 else None


def _claimed(mem: Memory, head: int | None, layout: TcLayout) -> int:
    """The thread caches' limits (max_size_) summed over the list from HEAD (0 when it cannot be followed)."""
    total, seen, at = 0, set(), head
    while at and at not in seen and len(seen) < 1 << 16:
        seen.add(at)
        try:
            total += int.from_bytes(mem.read(at + layout.thread_max_size, 4), "little", signed=True)
            at = u64(mem, at + layout.thread_next)
        except ReadError:
            return 0
    return total if not at else 0


def _overall_by_shape(base: int, words: np.ndarray, claimed: int) -> int | None:
    """ThreadCache::overall_thread_cache_size_ where no symbol says: the word after unclaimed_cache_space_,
    which holds the overall limit less what the caches claimed (CLAIMED).  None unless exactly one pair of
    words is apart by CLAIMED (and none can be when no cache claims anything)."""
    if claimed <= 0 or len(words) < 2:
        return None
    unclaimed, overall = words[:-1].view(np.int64), words[1:].view(np.int64)
    pairs = np.flatnonzero((overall - unclaimed == claimed) & (overall > 0) & (overall < 1 << 44))
    return base + 8 * (int(pairs[0]) + 1) if len(pairs) == 1 else None


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
        count_at = (pages + layout.sizemap_count_after_pages - base) // 8
        classes = int(words[count_at]) if count_at < len(words) else -1
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
        return u64(mem, first + 24) == head and \
            u64(mem, last + 16) == head
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
                  sizes: np.ndarray) -> tuple[int | None, str]:
    """The first thread cache of tcmalloc's list (None: no thread has one), and how it was found;
    TcmallocUnknown when the exported head is not a first cache of LAYOUT's shape."""
    at = found.image.dynamic_symbol(_THREAD_HEAPS)
    if at is not None:
        head = u64(mem, at)
        if head and not _is_first_cache(mem, head, layout, sizes):
            raise TcmallocUnknown(f"the first thread cache at {head:#x} does not have this layout's shape")
        return head or None, "ThreadCache::thread_heaps_ (exported)"
    for i in np.flatnonzero(words > np.uint64(0x10000)).tolist():
        if _is_first_cache(mem, int(words[i]), layout, sizes):
            return int(words[i]), (f"the list's head at {base + 8 * i:#x} (a first cache whose free lists carry "
                                   f"the size map's class sizes)")
    return None, "none found (no thread has a cache)"


def _is_first_cache(mem: Memory, at: int, layout: TcLayout, sizes: np.ndarray) -> bool:
    """Whether AT holds a thread cache of LAYOUT's shape with no previous one: each class's free list carries
    its class's size, and the next cache, if any, links back to it (a cache freed when its thread exited keeps
    its shape, but no cache links back to it)."""
    try:
        data = mem.read(at, layout.thread_prev + 8)
    except ReadError:
        return False
    lists = np.frombuffer(data[:layout.classes_max * layout.thread_list_entry], dtype=np.int32).reshape(
        layout.classes_max, layout.thread_list_entry // 4)
    carried = lists[:len(sizes), layout.thread_list_class_size // 4]
    if not (carried == sizes).all() or int.from_bytes(data[layout.thread_prev:], "little") != 0:
        return False
    after = int.from_bytes(data[layout.thread_next:layout.thread_next + 8], "little")
    try:
        return not after or u64(mem, after + layout.thread_prev) == at
    except ReadError:
        return False
