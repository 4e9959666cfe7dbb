"""tcmalloc's spans as columns: the Span headers the page map names read into `Spans` as the page heap walks
them (a span's own first page names it; pages inside a free span that still name the spans merged into it are
passed by; an unreadable or impossible header names none), the bit fields decoded, and the columns reading as a
sequence of `TcSpan`s equal to the ones they were made from."""

from __future__ import annotations

import struct

import numpy as np

from heapwalk.inferior.image import ImageMemory
from heapwalk.tcmalloc.layout import SPAN
from heapwalk.tcmalloc.spans import Spans, TcSpan, columns, read_spans

HEADERS = 0x40000000


def header(start: int, length: int, objects: int, refcount: int, size_class: int, location: int,
           sampled: bool) -> bytes:
    """A Span's first 48 bytes: start, length, next, prev, objects, then the bit fields."""
    return struct.pack("<5QHBB4x", start, length, 0, 0, objects, refcount, size_class,
                       location | (4 if sampled else 0))


def memory(spans: list[bytes]) -> ImageMemory:
    mem = ImageMemory()
    mem.add(HEADERS, bytearray(b"".join(spans)))
    return mem


def at(i: int) -> int:
    return HEADERS + i * SPAN


def test_each_field_is_read_from_its_bits():
    mem = memory([header(100, 1, 0xABC0, 7, 3, 0, False), header(101, 4, 0, 0, 0, 2, False),
                  header(105, 1, 0, 1, 9, 0, True)])
    spans = read_spans(mem, np.array([100, 101, 102, 103, 104, 105]),
                       np.array([at(0), at(1), at(1), at(1), at(1), at(2)]))
    assert list(spans) == [TcSpan(100, 1, 0, 3, 7, 0xABC0, False, at(0)), TcSpan(101, 4, 2, 0, 0, 0, False, at(1)),
                           TcSpan(105, 1, 0, 9, 1, 0, True, at(2))]
    assert spans[1] == TcSpan(101, 4, 2, 0, 0, 0, False, at(1)) and spans[-1].sampled is True
    assert spans[1:] == (spans[1], spans[2]) and len(spans) == 3 and spans == list(spans)


def test_a_page_that_names_a_span_starting_elsewhere_or_inside_the_last_one_is_passed_by():
    """A free span of 8 pages at 200 whose inner page 202 still names a span of 2 pages said to start there
    (merged into it): the walk goes on past the free span's last page, and 202 is no span."""
    mem = memory([header(200, 8, 0, 0, 0, 1, False), header(202, 2, 0, 0, 0, 0, False),
                  header(300, 1, 0, 0, 0, 0, False)])
    spans = read_spans(mem, np.array([200, 202, 207, 300, 301]), np.array([at(0), at(1), at(0), at(2), at(2)]))
    assert [s.page for s in spans] == [200, 300]


def test_an_unreadable_or_impossible_header_names_no_span():
    mem = memory([header(10, 0, 0, 0, 0, 0, False), header(11, 1 << 40, 0, 0, 0, 0, False),
                  header(12, 1, 0, 0, 0, 0, False)])
    spans = read_spans(mem, np.array([10, 11, 12, 13]), np.array([at(0), at(1), at(2), 0x7000_0000]))
    assert [s.page for s in spans] == [12]


def test_columns_of_named_tuples_and_of_nothing():
    rows = (TcSpan(1, 2, 0, 5, 3, 0x10, False, 0x20), TcSpan(9, 1, 1))
    spans = columns(rows)
    assert isinstance(spans, Spans) and spans == rows and columns(spans) is spans
    starts, ends = spans.starts_ends(8192)
    assert starts.tolist() == [8192, 9 * 8192] and ends.tolist() == [3 * 8192, 10 * 8192]
    empty = Spans.of(())
    assert len(empty) == 0 and not empty and list(empty) == [] and empty.starts_ends(4096)[0].dtype == np.uint64
