"""mimalloc's page lists walked many pages at once (`lists.walk_pages`) give what each page walked alone gives
(`lists.walk_page`): the counts, the blocks each list holds, the damage and the findings, in the same order; in C and
in Python; on lists that end in every way they can, pages near each other and far apart, pages past readable
memory."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from heapwalk.inferior import slots
from heapwalk.inferior.memory import ReadError
from heapwalk.mimalloc.lists import count_delayed, list_of, walk_page, walk_pages
from heapwalk.mimalloc.page import MiPage

BASE = 0x7f0000000000


class _Memory:
    """Bytes from BASE, as a target's memory."""

    def __init__(self, data: bytes):
        self.data = data

    def read(self, address: int, size: int) -> bytes:
        lo = address - BASE
        if lo < 0 or lo + size > len(self.data):
            raise ReadError(address, size, "not in the test's memory")
        return self.data[lo:lo + size]


def _pages(rng: random.Random) -> tuple[list[MiPage], bytes]:
    """Pages of random block sizes at random distances, their three lists each ending one of the ways a list
    ends (a null link, a link that is no block, a block met again, a block of another list), and the image of
    their memory, cut short at times."""
    image, pages, at = bytearray(), [], BASE
    for _ in range(rng.randint(1, 14)):
        at += rng.choice((0, 64, 65536, 3 << 20))
        size, cut = rng.choice((16, 48, 64, 1024)), rng.choice((0, 1, 5, 60, 400))
        start = at + 64
        end = start + cut * size
        image.extend(bytes(end - BASE - len(image)))
        order = rng.sample(range(cut), rng.randint(0, cut))
        cuts = sorted(rng.randint(0, len(order)) for _ in range(2))
        heads = []
        for part in (order[:cuts[0]], order[cuts[0]:cuts[1]], order[cuts[1]:]):
            links = [start + i * size for i in part]
            ending = rng.choice(("null", "null", "null", "outside", "twice", "other"))
            last = {"null": 0, "outside": start + 8, "twice": links[0] if links else 0,
                    "other": start + order[0] * size if order else 0}[ending]
            for here, there in zip(links, links[1:] + [last]):
                image[here - BASE:here - BASE + 8] = there.to_bytes(8, "little")
            heads.append(links[0] if links else rng.choice((0, 0, 0, start - 8)))
        slices = -(-(end - at) // 65536) or 1
        pages.append(MiPage(at, 0, at, slices, start, size, cut, cut, cut, 0x1000, False, tuple(heads)))
        at += slices * 65536
    if rng.random() < 0.3:
        image = image[:rng.randrange(len(image) + 1)]
    rng.shuffle(pages)
    return pages, bytes(image)


def _copy(pages: list[MiPage]) -> list[MiPage]:
    return [MiPage(p.segment, p.index, p.address, p.slices, p.start, p.block_size, p.capacity, p.reserved, p.used,
                   p.heap, p.in_full, p.heads) for p in pages]


def _seen(pages: list[MiPage], findings) -> tuple:
    return ([(p.free, p.local_free, p.thread_free, p.damaged, p.freed.tolist()) for p in pages],
            [(f.address, f.message) for f in findings])


@pytest.mark.parametrize("seed", range(40))
def test_many_pages_walked_at_once_are_each_page_walked_alone(seed, monkeypatch):
    pages, image = _pages(random.Random(seed))
    mem = _Memory(image)
    alone, alone_findings = _copy(pages), []
    for page in alone:
        walk_page(mem, page, alone_findings)
    want = _seen(alone, alone_findings)
    at_once, findings = _copy(pages), []
    walk_pages(mem, at_once, findings)
    assert _seen(at_once, findings) == want
    monkeypatch.setattr(slots, "_LIB", None)
    at_once, findings = _copy(pages), []
    walk_pages(mem, at_once, findings)
    assert _seen(at_once, findings) == want


def test_the_pages_share_one_array_of_marks_and_each_sees_its_own():
    """Two pages side by side, one list each: one array holds both pages' marks; each page's `freed` is its
    blocks' part, and a page no list holds a block of has none."""
    size, image = 16, bytearray(0x30000)
    first, second = BASE + 64, BASE + 0x10000 + 64
    image[64:72] = (first + 32).to_bytes(8, "little")                       # 0 -> 2
    image[0x10000 + 64 + 16:0x10000 + 64 + 24] = (second).to_bytes(8, "little")  # 1 -> 0 (local free)
    pages = [MiPage(BASE, 0, BASE, 1, first, size, 4, 4, 4, 1, False, (first, 0, 0)),
             MiPage(BASE + 0x10000, 0, BASE + 0x10000, 1, second, size, 4, 4, 4, 1, False, (0, second + 16, 0)),
             MiPage(BASE + 0x20000, 0, BASE + 0x20000, 1, BASE + 0x20040, size, 4, 4, 4, 1, False)]
    walk_pages(_Memory(bytes(image)), pages, [])
    assert pages[0].marks is pages[1].marks and pages[2].marks is None
    assert len(pages[0].marks) == 1                         # a bit a block: the two pages' eight in one byte
    assert [p.freed.tolist() for p in pages] == [[1, 0, 1, 0], [1, 1, 0, 0], []]
    assert [(p.free, p.local_free) for p in pages] == [(2, 0), (0, 2), (0, 0)]
    mem = _Memory(bytes(image))
    assert [list_of(mem, pages[0], first + i * size) for i in range(4)] == ["free", None, "free", None]
    assert [list_of(mem, pages[1], second + i * size) for i in range(4)] == ["local free"] * 2 + [None] * 2
    assert list_of(mem, pages[0], first + 8) is None and list_of(mem, pages[2], BASE + 0x20040) is None


def test_a_heaps_delayed_blocks_are_marked_and_named_so():
    """A heap's delayed-free list counts into its pages: a block only it holds is named "delayed"; one a list of
    its page holds as well keeps that list's name; a page no list held a block of is given bits of its own."""
    size, image = 16, bytearray(0x30000)
    first, second = BASE + 64, BASE + 0x10000 + 64
    heap = BASE + 0x20000
    image[64:72] = (first + 32).to_bytes(8, "little")                       # free: 0 -> 2
    image[0x20000:0x20008] = (first + 16).to_bytes(8, "little")             # delayed: 1 -> 2 -> second + 48
    image[80:88] = (first + 32).to_bytes(8, "little")
    image[0x10000 + 64 + 48:0x10000 + 64 + 56] = bytes(8)
    image[96:104] = (second + 48).to_bytes(8, "little")
    pages = [MiPage(BASE, 0, BASE, 1, first, size, 4, 4, 4, heap, False, (first, 0, 0)),
             MiPage(BASE + 0x10000, 0, BASE + 0x10000, 1, second, size, 4, 4, 4, heap, False)]
    mem = _Memory(bytes(image))
    walk_pages(mem, pages, [])
    findings = []
    assert count_delayed(mem, SimpleNamespace(heap_delayed_free=0), [heap], pages, findings) == {heap: 3}
    assert not findings and [p.delayed for p in pages] == [2, 1]
    assert [p.freed.tolist() for p in pages] == [[1, 1, 1, 0], [0, 0, 0, 1]]
    assert [list_of(mem, pages[0], first + i * size) for i in range(4)] == ["free", "delayed", "free", None]
    assert list_of(mem, pages[1], second + 48) == "delayed"
