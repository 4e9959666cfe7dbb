"""Free lists through a page's slots (`heapwalk.inferior.slots`): the C library `pip install` builds is in use, and
it gives exactly what the Python fallback gives, on lists made to end in every way they can (a null link, a link
that is no slot, a slot met again, bytes that end), one page at a time and many in one call."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

from heapwalk.inferior import slots
from heapwalk.inferior.slots import CUT, ENDED, OUTSIDE, TWICE, slot_list, slot_lists


def test_the_library_is_built_and_loaded():
    assert slots.NATIVE or os.environ.get("HEAPWALK_PURE"), "make venv builds heapwalk/inferior/_slots*.so"


def _page(rng: random.Random, start: int) -> tuple[bytearray, int, int, int]:
    """A page of slots with a list through some of them, its end made one of the ways a list ends:
    (bytes, size, count, head)."""
    size, count = rng.choice((8, 16, 24, 48, 96, 4096)), rng.choice((1, 2, 7, 64, 300))
    data = bytearray(rng.getrandbits(8) for _ in range(size * count))
    order = rng.sample(range(count), rng.randint(0, count))
    links = [start + i * size for i in order]
    ending = rng.choice(("null", "outside", "misaligned", "twice", "cut"))
    last = {"null": 0, "outside": start + count * size, "misaligned": start + 4,
            "twice": links[0] if links else 0, "cut": 0}[ending]
    for here, there in zip(order, links[1:] + [last]):
        data[here * size:here * size + 8] = there.to_bytes(8, "little")
    if ending == "cut" and order:
        data = data[:order[-1] * size + 4]
    return data, size, count, links[0] if links else rng.choice((0, start - 8))


@pytest.mark.parametrize("seed", range(60))
def test_a_list_is_the_same_in_c_and_python(seed, monkeypatch):
    rng = random.Random(seed)
    start = 0x7f0000010000
    data, size, count, head = _page(rng, start)
    seen = np.zeros(count, dtype=np.uint8)
    seen[rng.randrange(count)] = rng.random() < 0.2              # a slot another list of the page holds
    seen_python = seen.copy()
    got = slot_list(bytes(data), start, size, count, head, seen)
    monkeypatch.setattr(slots, "_LIB", None)
    want = slot_list(bytes(data), start, size, count, head, seen_python)
    assert (got.slots.tolist(), got.stop, got.at) == (want.slots.tolist(), want.stop, want.at)
    assert seen.tolist() == seen_python.tolist()


def test_each_way_a_list_ends(monkeypatch):
    start, size = 0x1000, 16
    data = bytearray(64)
    data[0:8] = (start + 32).to_bytes(8, "little")        # slot 0 -> slot 2 -> null
    for native in (True, False):
        if not native:
            monkeypatch.setattr(slots, "_LIB", None)
        got = slot_list(bytes(data), start, size, 4, start, np.zeros(4, dtype=np.uint8))
        assert (got.slots.tolist(), got.stop, got.at) == ([0, 2], ENDED, 0)
        data[32:40] = (start + 8).to_bytes(8, "little")   # slot 2 -> the middle of slot 0
        got = slot_list(bytes(data), start, size, 4, start, np.zeros(4, dtype=np.uint8))
        assert (got.slots.tolist(), got.stop, got.at) == ([0, 2], OUTSIDE, start + 8)
        data[32:40] = start.to_bytes(8, "little")         # slot 2 -> slot 0 again
        got = slot_list(bytes(data), start, size, 4, start, np.zeros(4, dtype=np.uint8))
        assert (got.slots.tolist(), got.stop, got.at) == ([0, 2], TWICE, start)
        got = slot_list(bytes(data[:36]), start, size, 4, start, np.zeros(4, dtype=np.uint8))
        assert (got.slots.tolist(), got.stop, got.at) == ([0, 2], CUT, start + 32)
        data[32:40] = bytes(8)


@pytest.mark.parametrize("seed", range(20))
def test_many_pages_in_one_call_are_each_page_alone(seed, monkeypatch):
    rng = random.Random(seed)
    base, at, pages = 0x7f0000000000, 0x7f0000000000, []
    for _ in range(rng.randint(1, 12)):
        at += rng.choice((0, 16, 4096))
        data, size, count, head = _page(rng, at)
        pages.append((at, data, size, count, head))
        at += size * count
    image = bytearray(at - base)
    for start, data, *_ in pages:
        image[start - base:start - base + len(data)] = data
    image = bytes(image[:len(image) - rng.choice((0, 0, 8, 100))])
    starts = np.array([p[0] for p in pages], dtype=np.uint64)
    sizes, counts = (np.array([p[i] for p in pages], dtype=np.int64) for i in (2, 3))
    heads = np.array([p[4] for p in pages], dtype=np.uint64)
    offsets = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
    seen = np.zeros(int(counts.sum()), dtype=np.uint8)
    got = slot_lists(image, base, starts, sizes, counts, heads, offsets, seen)
    monkeypatch.setattr(slots, "_LIB", None)
    seen_python = np.zeros_like(seen)
    want = slot_lists(image, base, starts, sizes, counts, heads, offsets, seen_python)
    assert all(a.tolist() == b.tolist() for a, b in zip(got, want)) and seen.tolist() == seen_python.tolist()
    for k, (start, data, size, count, head) in enumerate(pages):
        if start + size * count > base + len(image):
            assert (want[0][k], want[1][k], want[2][k]) == (0, CUT, start)
            continue
        alone = slot_list(image[start - base:start - base + size * count], start, size, count, head,
                          np.zeros(count, dtype=np.uint8))
        assert (want[0][k], want[1][k], want[2][k]) == (len(alone.slots), alone.stop, alone.at)


def test_each_list_marks_its_slots_with_its_own_mark_and_meets_another_lists_slot(monkeypatch):
    """Two lists through the same two pages, walked in one call each with marks 2 and 3: each slot carries its
    list's mark; the second list, reaching a slot of the first, stops there (TWICE); C and Python alike."""
    base, size = 0x4000, 16
    image = bytearray(2 * 4 * size)
    link = lambda at, to: image.__setitem__(slice(at - base, at - base + 8), to.to_bytes(8, "little"))  # noqa: E731
    link(0x4000, 0x4020)                    # page 0: 0 -> 2 -> null; then 1 -> 3 -> 2 (the first list's)
    link(0x4010, 0x4030)
    link(0x4030, 0x4020)
    link(0x4040, 0x4070)                    # page 1: 0 -> 3 -> null; then 1 -> null
    answers = []
    for native in (True, False):
        if not native:
            monkeypatch.setattr(slots, "_LIB", None)
        args = (np.array([0x4000, 0x4040], dtype=np.uint64), np.array([size] * 2), np.array([4, 4]))
        seen = np.zeros(8, dtype=np.uint8)
        first = slot_lists(bytes(image), base, *args, np.array([0x4000, 0x4040], dtype=np.uint64),
                           np.array([0, 4]), seen, mark=2)
        second = slot_lists(bytes(image), base, *args, np.array([0x4010, 0x4050], dtype=np.uint64),
                            np.array([0, 4]), seen, mark=3)
        answers.append([a.tolist() for a in (*first, *second, seen)])
    assert answers[0] == answers[1]
    assert answers[0][3:] == [[2, 1], [TWICE, ENDED], [0x4020, 0], [2, 3, 2, 3, 2, 3, 0, 2]]


def test_slot_marks_mark_and_say_only_slot_starts_and_make_the_unmarked_blocks():
    """Two pages (3 slots of 16 bytes at 0x1000, 2 of 48 at 0x2000): an address inside a slot, past a page or
    before the first marks nothing; the unmarked slots come out in address order with a large block merged in,
    tagged by page."""
    marks = slots.SlotMarks(np.array([0x1000, 0x2000], dtype=np.uint64), np.array([16, 48]), np.array([3, 2]))
    marks.mark(np.array([0x1010, 0x1008, 0x1030, 0x0ff0, 0x2030], dtype=np.uint64))
    assert marks.marks.tolist() == [0, 1, 0, 0, 1]
    assert marks.marked(np.array([0x1010, 0x1018, 0x2030, 0x2000, 0x9000], dtype=np.uint64)).tolist() == \
        [True, False, True, False, False]
    made = marks.blocks(np.array([7, 9], dtype=np.uint8),
                        (np.array([0x1800], dtype=np.uint64), np.array([0x400], dtype=np.uint64),
                         np.array([5], dtype=np.uint8)))
    assert made.starts.tolist() == [0x1000, 0x1020, 0x1800, 0x2000]
    assert made.lengths.tolist() == [2, 2, 0x80, 6] and made.tags.tolist() == [7, 7, 5, 9] and made.ends is None


def test_blocks_of_one_tag_keep_no_byte_a_block():
    """Every page and the large block of one tag: the blocks' tags are that tag seen as many (no array of a byte a
    block), the same values as a tag each."""
    marks = slots.SlotMarks(np.array([0x1000, 0x2000], dtype=np.uint64), np.array([16, 48]), np.array([3, 2]))
    made = marks.blocks(np.array([4, 4], dtype=np.uint8),
                        (np.array([0x1800], dtype=np.uint64), np.array([0x400], dtype=np.uint64),
                         np.array([4], dtype=np.uint8)))
    assert made.starts.tolist() == [0x1000, 0x1010, 0x1020, 0x1800, 0x2000, 0x2030]
    assert made.tags.tolist() == [4] * 6 and made.tags.strides == (0,) and made.tags.dtype == np.uint8
    two = slots.SlotMarks(np.array([0x1000], dtype=np.uint64), np.array([16]), np.array([2])).blocks(
        np.array([4], dtype=np.uint8), (np.array([0x1800], dtype=np.uint64), np.array([0x400], dtype=np.uint64),
                                        np.array([5], dtype=np.uint8)))
    assert two.tags.tolist() == [4, 4, 5] and two.tags.strides != (0,)


@pytest.mark.parametrize("step", [1, 3, 1 << 16])
def test_unmarked_counts_are_the_blocks_each_page_makes(step, monkeypatch):
    """Each page's slots left unmarked, a page of no slots and a page wholly marked among them, counted a step at a
    time: as many as `blocks` makes of each page, in its order."""
    monkeypatch.setattr(slots, "_STEP", step)
    marks = slots.SlotMarks(np.array([0x1000, 0x2000, 0x3000, 0x4000], dtype=np.uint64), np.array([16, 48, 32, 16]),
                            np.array([5, 0, 2, 3]))
    marks.mark(np.array([0x1000, 0x1030, 0x3000, 0x3020, 0x4010], dtype=np.uint64))
    assert marks.unmarked_counts().tolist() == [3, 0, 0, 2]
    made = marks.blocks(np.zeros(4, dtype=np.uint8))
    assert made.starts.tolist() == [0x1010, 0x1020, 0x1040, 0x4000, 0x4020]
