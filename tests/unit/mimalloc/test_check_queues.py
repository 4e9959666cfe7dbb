"""'heapwalk check' of mimalloc's heap page queues on bytes made by hand: each page's links read past the block cache
(a page's header is all the walk wants of its memory), each broken link, stray page and wrong count named."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from heapwalk.inferior.memory import CachedMemory, ReadError
from heapwalk.mimalloc.check import _queues
from heapwalk.mimalloc.layout import layout_for, queue_shape
from heapwalk.mimalloc.v3.layout import layout3_for

BASE, SIZE = 0x7F0000000000, 1 << 22
HEAP, OTHER = BASE + 0x1000, BASE + 0x3000
#: pages 64 KiB apart, as mimalloc's are: a cache of the pages read would hold one 4 KiB page each
P1, P2, P3 = BASE + 0x10000, BASE + 0x20000, BASE + 0x30000


class Flat:
    """SIZE bytes from BASE, each read counted."""

    def __init__(self):
        self.buf, self.reads = bytearray(SIZE), 0

    def read(self, address: int, size: int) -> bytes:
        self.reads += 1
        if not BASE <= address <= address + size <= BASE + SIZE:
            raise ReadError(address, size)
        return bytes(self.buf[address - BASE:address - BASE + size])

    def put(self, address: int, value: int) -> None:
        struct.pack_into("<Q", self.buf, address - BASE, value)


def _heap(lay, flat: Flat, queues: dict[int, list[int]], said: int) -> None:
    """HEAP's queues (index -> its pages in order, each page linked both ways) and its count of pages SAID."""
    words, size_word = queue_shape(lay)
    for index, chain in queues.items():
        row = HEAP + lay.heap_pages + 8 * words * index
        flat.put(row, chain[0] if chain else 0)
        flat.put(row + 8, chain[-1] if chain else 0)
        flat.put(row + 8 * size_word, 16 * (index + 1))
        for before, page, after in zip([0] + chain, chain, chain[1:] + [0]):
            flat.put(page + lay.page_prev, before)
            flat.put(page + lay.page_next, after)
    flat.put(HEAP + lay.heap_page_count, said)


LAYOUTS = [pytest.param(layout_for((2, 0, 9)), id="2.0.9"), pytest.param(layout_for((2, 1, 7)), id="2.1.7"),
           pytest.param(layout3_for((3, 0, 1)), id="3.0.1")]


def _check(lay, flat: Flat, cached: bool, heaps=None) -> list[str]:
    pages = {p: SimpleNamespace(address=p, heap=(heaps or {}).get(p, HEAP)) for p in (P1, P2, P3)}
    mem = CachedMemory(flat.read, regions=[(BASE, BASE + SIZE)]) if cached else flat
    found = [f.message for f in _queues(mem, SimpleNamespace(layout=lay), HEAP, pages)]
    if cached:                         # the heap's own block only: no page's
        assert set(mem._blocks) <= {HEAP & ~(CachedMemory.BLOCK - 1)}, "the walk cached the pages' memory"
    return found


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("lay", LAYOUTS)
def test_sound_queues_say_nothing_and_cache_nothing(lay, cached):
    flat = Flat()
    _heap(lay, flat, {0: [P1, P2], 5: [P3]}, 3)
    assert _check(lay, flat, cached) == []


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("lay", LAYOUTS)
def test_each_broken_queue_is_named(lay, cached):
    flat = Flat()
    _heap(lay, flat, {0: [P1, P2], 5: [P3]}, 3)
    flat.put(P2 + lay.page_prev, P3)
    assert _check(lay, flat, cached) == [f"the page at {P2:#x} links back to {P3:#x}, not to {P1:#x}, in a queue "
                                         f"of the heap at {HEAP:#x}"]
    flat = Flat()
    _heap(lay, flat, {0: [P1, P2], 5: [P3]}, 3)
    assert _check(lay, flat, cached, {P3: OTHER}) == [
        f"a page queue of the heap at {HEAP:#x} (blocks of 96 bytes) holds {P3:#x}, which belongs to the heap "
        f"{OTHER:#x}"]
    flat = Flat()
    _heap(lay, flat, {0: [P1, P2], 5: [P3]}, 4)
    assert _check(lay, flat, cached) == [f"the heap at {HEAP:#x} counts 4 pages, and its queues hold 3"]
    flat = Flat()
    _heap(lay, flat, {0: [P1, P2]}, 2)
    flat.put(P2 + lay.page_next, BASE + SIZE + 0x10000)      # on into memory the core lacks: the walk stops there
    assert _check(lay, flat, cached) == [
        f"a page queue of the heap at {HEAP:#x} (blocks of 16 bytes) holds {BASE + SIZE + 0x10000:#x}, which is no "
        "page of a live segment"]
