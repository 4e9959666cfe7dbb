"""Google's tcmalloc's page map: for every page of its heap that a span holds, the span and its size class.  On a
64-bit target with 8 KiB pages it is a two-level radix tree: a root of 2^20 leaf pointers in the program's data
(8 MiB, mostly zeros), each leaf covering 2^15 pages (256 MiB) with a byte of size class per page, then a word
per page (the span's address, its size class in the top 16 bits), then a word per hugepage.

The root is found without symbols from pages whose size class is known: an object a transfer cache holds lies in
a page of its class, so the root is where a word points at a leaf whose entry for that page says that class.
Every span is then read from the leaves, as tcmalloc's own walks read them."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from heapwalk.common.arrays import distinct
from heapwalk.gtcmalloc.layout import GtcLayout
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["Spans", "find_root", "read_spans", "LEAF_BITS", "ROOT_LENGTH"]

#: pages per leaf, leaves in the root, bytes of a leaf's size classes, and where its spans' words start
LEAF_BITS, ROOT_LENGTH = 15, 1 << 20
LEAF_PAGES = 1 << LEAF_BITS
LEAF_SPANS = LEAF_PAGES                      # after one size-class byte per page
LEAF_SIZE = LEAF_PAGES + 8 * LEAF_PAGES + 8 * 128
SPAN_MASK = (1 << 48) - 1


@dataclass(frozen=True)
class Spans:
    """Every span the page map holds (arrays, one entry per span, by address): its first page and length in
    pages, its size class (0: a large allocation), its objects in use (small spans), whether it is sampled."""

    root: int
    leaves: np.ndarray           # the leaves' addresses
    address: np.ndarray
    first_page: np.ndarray
    pages: np.ndarray
    size_class: np.ndarray
    allocated: np.ndarray
    sampled: np.ndarray

    def __len__(self) -> int:
        return len(self.address)


def find_root(mem: Memory, words: np.ndarray, lo: int, probes: list[tuple[int, int]]) -> int | None:
    """The root's address in the data of WORDS (from LO): where a word points at a leaf whose entry for a probed
    page (PROBES: (page, size class)) says that class, at that leaf's index; the first probe that leads to one
    whose other probes, where their leaves can be read, agree with it."""
    values = distinct(words[(words != 0) & (words % np.uint64(8) == 0)]).tolist()
    for page, size_class in probes[:16]:
        leaf_index, slot = page >> LEAF_BITS, page & (LEAF_PAGES - 1)
        for value in values:
            if not _says(mem, value, slot, size_class):
                continue
            for at in np.nonzero(words == np.uint64(value))[0].tolist():
                root = lo + 8 * at - 8 * leaf_index
                if root >= lo and all(_probe(mem, root, p, c) is not False for p, c in probes[:16]):
                    return root
    return None


def _says(mem: Memory, leaf: int, slot: int, size_class: int) -> bool:
    """Whether LEAF's entry SLOT holds a span of SIZE_CLASS."""
    try:
        if mem.read(leaf + slot, 1)[0] != size_class:
            return False
        packed = struct.unpack("<Q", mem.read(leaf + LEAF_SPANS + 8 * slot, 8))[0]
    except ReadError:
        return False
    return packed >> 48 == size_class and packed & SPAN_MASK != 0


def _probe(mem: Memory, root: int, page: int, size_class: int) -> bool | None:
    """Whether ROOT's leaf for PAGE says SIZE_CLASS; None when that leaf cannot be read."""
    try:
        leaf = struct.unpack("<Q", mem.read(root + 8 * (page >> LEAF_BITS), 8))[0]
        mem.read(leaf + (page & (LEAF_PAGES - 1)), 1)
    except ReadError:
        return None
    return bool(leaf) and _says(mem, leaf, page & (LEAF_PAGES - 1), size_class)


def read_spans(mem: Memory, layout: GtcLayout, root: int, root_words: np.ndarray,
               freed: set[int]) -> tuple[Spans, list[int], list[int]]:
    """Every live span the leaves name (ROOT_WORDS: the root's words), and the leaves and spans that could not be
    read.  The page map is not cleared when a span goes: a span is live when its Span is not one of FREED (the
    metadata allocators' free objects) and the entry of its own first page names it (an entry elsewhere may be
    left from a span since freed whose Span was made again for other pages); its size class is that entry's."""
    leaves = np.nonzero(root_words)[0]
    entries, unread = {}, []
    for index in leaves.tolist():
        leaf = int(root_words[index])
        try:
            entries[index] = np.frombuffer(mem.read(leaf + LEAF_SPANS, 8 * LEAF_PAGES), dtype=np.uint64)
        except ReadError:
            unread.append(leaf)
    named = [packed[packed != 0] & np.uint64(SPAN_MASK) for packed in entries.values()]
    address = distinct(np.concatenate(named)) if named else np.zeros(0, dtype=np.uint64)
    address = address[~np.isin(address, np.array(sorted(freed), dtype=np.uint64))]
    fields = [_span(mem, layout, int(a)) for a in address.tolist()]
    lost = [int(a) for a, f in zip(address.tolist(), fields) if f is None]
    table = np.array([f or (0, 0, 0, 0) for f in fields], dtype=np.uint64).reshape(-1, 4)
    own = np.array([_entry(entries, int(first)) for first in table[:, 0].tolist()], dtype=np.uint64)
    live = (own & np.uint64(SPAN_MASK)) == address
    table, address = table[live], address[live]
    return Spans(root, root_words[leaves], address, table[:, 0], table[:, 1],
                 (own[live] >> np.uint64(48)).astype(np.uint16), table[:, 2].astype(np.uint16),
                 table[:, 3].astype(bool)), unread, lost


def _entry(entries: dict, page: int) -> int:
    """The page map's word for PAGE (0 when its leaf is not there)."""
    packed = entries.get(page >> LEAF_BITS)
    return 0 if packed is None else int(packed[page & (LEAF_PAGES - 1)])


def _span(mem: Memory, layout: GtcLayout, at: int) -> tuple[int, int, int, int] | None:
    """A span's first page, pages, objects in use and whether sampled (None when it cannot be read)."""
    try:
        raw = mem.read(at, 64)
    except ReadError:
        return None
    allocated = struct.unpack_from("<H", raw, layout.span_allocated)[0]
    word = struct.unpack_from("<Q", raw, layout.span_first_page)[0]
    first, large, sampled = word & ((1 << 35) - 1), word >> 61 & 1, word >> 62 & 1
    length = struct.unpack_from("<Q", raw, layout.span_first_page + 8)[0]
    return first, length if large or sampled else length & 63, allocated, sampled
