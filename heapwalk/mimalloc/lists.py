"""mimalloc's free lists walked: a page's free, local-free and thread-free lists (singly linked through each
block's first word, plain pointers in a release build), and each heap's list of blocks other threads freed into
its full pages (delayed).  A list that leaves its page's blocks, loops or cannot be read is a finding at the block
where it goes wrong; its page is marked damaged (which of its blocks are free is then unknown)."""

from __future__ import annotations

import bisect
from dataclasses import replace

import numpy as np

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.inferior.slots import CUT, ENDED, OUTSIDE, TWICE, slot_list, slot_lists
from heapwalk.inferior.memory import Memory, ReadError, read_once, u64
from heapwalk.inferior.window import near_windows
from heapwalk.mimalloc.layout import MiLayout
from heapwalk.mimalloc.page import LISTS

#: the mark of a block on its heap's delayed-free list (`page.LISTS`)
DELAYED = 4

__all__ = ["LIST", "walk_pages", "walk_page", "list_of", "count_delayed"]

LIST = Kind("mi_free_list", "free list that leaves its page, loops or is cut")
_MAX_WALK = 1 << 20


def walk_pages(mem: Memory, pages: list, findings: list[Finding]) -> None:
    """`walk_page` for each of PAGES: those near each other read at once (`window.near_windows`) and each of their
    three lists walked in one call (`slots.slot_lists`), their marks kept as bits in one array (`MiPage.marks`).
    A page whose lists do not all end at a null link is walked again alone, in PAGES' order, which says what is
    wrong."""
    todo = sorted((p for p in pages if any(p.heads) and p.cut > 0), key=lambda p: p.start)
    starts = np.array([p.start for p in todo], dtype=np.uint64)
    sizes = np.array([p.block_size for p in todo], dtype=np.int64)
    counts = np.array([p.cut for p in todo], dtype=np.int64)
    heads = np.array([p.heads for p in todo], dtype=np.uint64).reshape(-1, 3)
    offsets = np.zeros(len(todo) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    marks = np.zeros(int(offsets[-1]), dtype=np.uint8)
    found, clean = np.zeros((len(todo), 3), dtype=np.int64), np.ones(len(todo), dtype=bool)
    for k, j, base, data in near_windows(mem, starts.tolist(), (counts * sizes).tolist()):
        data = data if isinstance(data, bytes) else bytes(data)         # one copy for the three calls, not three
        for column in range(3):
            got, stops, _ = slot_lists(data, base, starts[k:j], sizes[k:j], counts[k:j], heads[k:j, column],
                                       offsets[k:j], marks, column + 1)
            found[k:j, column] = got
            clean[k:j] &= stops == ENDED
    again = set()
    for k in np.flatnonzero(~clean).tolist():
        marks[offsets[k]:offsets[k + 1]] = 0
        again.add(id(todo[k]))
    bits = np.packbits(marks != 0, bitorder="little")      # a bit a block kept, not a byte
    del marks
    for k in np.flatnonzero(clean).tolist():
        page = todo[k]
        page.free, page.local_free, page.thread_free = found[k].tolist()
        page.marks, page.marks_at = bits, int(offsets[k])
    for page in pages:
        if id(page) in again or (any(page.heads) and page.cut <= 0):
            walk_page(mem, page, findings)


def walk_page(mem: Memory, page, findings: list[Finding]) -> None:
    """Counts the blocks on PAGE's three lists, reading its blocks once (`slots.slot_list`), and marks those they
    hold in PAGE.freed; a list that leaves the page's blocks, loops or cannot be read is a finding at the block
    where it goes wrong, and counts up to there."""
    if not any(page.heads):
        return
    counts, marks = _lists(mem, page, findings)
    page.free, page.local_free, page.thread_free = counts
    if any(counts):
        page.freed = marks


def list_of(mem: Memory, page, block: int) -> str | None:
    """Which list holds BLOCK of PAGE ("free", "local free", "thread free", "delayed"), or None (the program
    holds it, or it is not one of PAGE's blocks): the page keeps a bit a block, its lists walked again to say
    which."""
    offset = block - page.start
    freed = page.freed
    i = offset // page.block_size if offset >= 0 and not offset % page.block_size else len(freed)
    if i >= len(freed) or not freed[i]:
        return None
    marks = _lists(mem, replace(page), [])[1]       # its walk's findings were made when it was decoded
    return LISTS[int(marks[i]) or DELAYED]


def _lists(mem: Memory, page, findings: list[Finding]) -> tuple[list[int], np.ndarray]:
    """PAGE's three lists walked: how many blocks each holds, and a byte a block it cut, which list holds it
    (`page.LISTS`), 0 for none."""
    count = page.cut
    try:
        data = read_once(mem, page.start, count * page.block_size)
    except ReadError:
        data = b""                  # each link then read on its own (`_walk`)
    marks = np.zeros(count, dtype=np.uint8)        # the walks mark each slot 1; then its list's own mark
    counts = []
    for mark, head in zip((1, 2, 3), page.heads):
        got = _walk(mem, page, data, head, marks, LISTS[mark], findings)
        marks[got] = mark
        counts.append(len(got))
    return counts, marks


def _walk(mem: Memory, page, data: bytes, head: int, seen: np.ndarray, name: str,
          findings: list[Finding]) -> np.ndarray:
    """The slots of PAGE's list NAME from HEAD (indexes), as far as it is whole; a finding where it breaks."""
    parts, at = [], head
    while True:
        walked = slot_list(data, page.start, page.block_size, page.cut, at, seen)
        parts.append(walked.slots)
        if walked.stop == ENDED:
            break
        page.damaged = page.damaged or walked.stop != CUT
        if walked.stop == OUTSIDE:
            findings.append(Finding(Severity.ERROR, walked.at, "mi_page_t", f"the {name} list of the page at "
                                    f"{page.address:#x} ({page.block_size}-byte blocks from {page.start:#x}) "
                                    f"holds {walked.at:#x}, which is not one of its blocks", LIST))
            break
        if walked.stop == TWICE:
            findings.append(Finding(Severity.ERROR, walked.at, "mi_page_t", f"the block {walked.at:#x} is twice on "
                                    f"the lists of the page at {page.address:#x} (its {name} list loops or "
                                    "crosses another)", LIST))
            break
        try:                        # CUT: the page could not be read whole; this block's link read alone
            at = u64(mem, walked.at)
        except ReadError as exc:
            page.damaged = True
            findings.append(Finding(Severity.ERROR, walked.at, "mi_page_t", f"the {name} list of the page at "
                                    f"{page.address:#x} is cut: {exc}", LIST))
            break
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def count_delayed(mem: Memory, lay: MiLayout, heaps: list[int], pages: list, findings: list[Finding]
                  ) -> dict[int, int]:
    """Counts the delayed-free list of each heap of HEAPS into the PAGES its blocks lie in; heap -> its count."""
    pages = sorted(((p.start, p) for p in pages), key=lambda x: x[0])
    starts = [a for a, _ in pages]
    counts = dict.fromkeys(heaps, 0)
    delayed: dict[int, tuple] = {}         # id(page) -> (page, its slots on a delayed list)
    for heap in heaps:
        try:
            at = u64(mem, heap + lay.heap_delayed_free)
        except ReadError:
            continue
        seen: set[int] = set()
        while at and at not in seen and len(seen) < _MAX_WALK:
            seen.add(at)
            i = bisect.bisect_right(starts, at) - 1
            page = pages[i][1] if i >= 0 else None
            if page is None or at >= page.start + page.cut * page.block_size:
                if page is not None:
                    page.damaged = True
                findings.append(Finding(Severity.ERROR, at, "mi_heap_t", f"the delayed-free list of the heap at "
                                        f"{heap:#x} holds {at:#x}, which is in no page", LIST))
                break
            page.delayed += 1
            if not (at - page.start) % page.block_size:
                delayed.setdefault(id(page), (page, []))[1].append((at - page.start) // page.block_size)
            counts[heap] += 1
            try:
                at = u64(mem, at)
            except ReadError:
                break
    for page, slots in delayed.values():
        freed = page.freed                      # its own bytes (unpacked from the bits), or none
        freed = freed if len(freed) else np.zeros(page.cut, dtype=np.uint8)
        slots = np.array(slots, dtype=np.int64)
        freed[slots[slots < len(freed)]] = 1
        page.freed = freed
    return counts
