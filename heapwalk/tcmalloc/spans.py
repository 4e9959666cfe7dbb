"""The page heap's spans as columns: a hundred thousand spans of a gigabyte heap cost 37 bytes each here, where
a tuple of named tuples cost 200 (23 MiB on the large bench core, kept for the whole command).  `Spans` still
reads as a sequence of `TcSpan`s, made as they are asked for; the walks over every span use the columns."""

from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from heapwalk.inferior.memory import Memory
from heapwalk.inferior.records import read_records
from heapwalk.tcmalloc.layout import SPAN

__all__ = ["TcSpan", "Spans", "columns", "read_spans"]

#: spans made into `TcSpan`s at a time when iterated
_CHUNK = 4096
#: a span this long or longer is damage, not a span
_LONGEST = 1 << 40


class TcSpan(NamedTuple):
    """One span of the page heap: its first page, its pages, where it is (IN_USE, NORMAL, RETURNED); in use, its
    size class (0: one large allocation), the objects taken out of it (refcount), the head of its list of free
    objects, whether heap sampling took it (one small allocation), and where its header is."""

    page: int
    pages: int
    location: int
    size_class: int = 0
    refcount: int = 0
    objects: int = 0
    sampled: bool = False
    header: int = 0


#: each column's type, in TcSpan's order
_TYPES = (np.uint64, np.uint64, np.uint8, np.uint8, np.uint16, np.uint64, np.bool_, np.uint64)


class Spans(Sequence):
    """Spans in page order, a numpy column for each of `TcSpan`'s fields (PAGE, PAGES, ...)."""

    def __init__(self, *columns: np.ndarray):
        for name, column, kind in zip(TcSpan._fields, columns, _TYPES):
            setattr(self, name, np.ascontiguousarray(column, dtype=kind))

    @classmethod
    def of(cls, spans: Iterable[TcSpan]) -> "Spans":
        """SPANS (TcSpans) as columns."""
        rows = list(spans)
        return cls(*(np.array([getattr(s, name) for s in rows], dtype=kind)
                     for name, kind in zip(TcSpan._fields, _TYPES)))

    def fields(self) -> tuple[np.ndarray, ...]:
        """The columns, in TcSpan's order."""
        return tuple(getattr(self, name) for name in TcSpan._fields)

    def __len__(self) -> int:
        return len(self.page)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        return TcSpan._make(column[i].item() for column in self.fields())

    def __iter__(self) -> Iterator[TcSpan]:
        for at in range(0, len(self), _CHUNK):
            yield from map(TcSpan._make, zip(*(c[at:at + _CHUNK].tolist() for c in self.fields())))

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def starts_ends(self, page_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Each span's first byte and the byte past its last."""
        return self.page * np.uint64(page_size), (self.page + self.pages) * np.uint64(page_size)


def columns(spans: Sequence[TcSpan]) -> Spans:
    """SPANS as columns (themselves where they are)."""
    return spans if isinstance(spans, Spans) else Spans.of(spans)


def read_spans(mem: Memory, pages: np.ndarray, named: np.ndarray) -> Spans:
    """The spans the page map names (NAMED[i]: the Span at page PAGES[i], ascending), as tcmalloc walks them: at
    each page that names a span starting there, that span, then on past its last page (a free span names only
    its ends: the pages inside may still name the spans merged into it).  Each Span's header is read once;
    one that cannot be read names no span."""
    pages = np.asarray(pages, dtype=np.uint64)
    heads, inverse = np.unique(np.asarray(named, dtype=np.uint64), return_inverse=True)
    got = read_records(mem, heads, SPAN)
    words = got.data[:, :40].copy().view(np.uint64)          # start, length, next, prev, objects
    start, length, objects = words[:, 0], words[:, 1], words[:, 4]
    bits = got.data[:, 40:48].copy().view(np.uint64)[:, 0]
    row = inverse.reshape(-1)
    ok = got.readable[row] & (start[row] == pages) & (length[row] > 0) & (length[row] < np.uint64(_LONGEST))
    at, row = pages[ok], row[ok]
    ends = at + length[row]
    reach = np.maximum.accumulate(ends)
    if len(at) > 1 and np.any(at[1:] < reach[:-1]):          # damage: spans overlap; walked one by one
        keep = _walked(at.tolist(), length[row].tolist())
        at, row = at[keep], row[keep]
    w = bits[row]                       # refcount (16 bits), size class (8), location (2), sampled (1)
    return Spans(at, length[row], (w >> np.uint64(24)) & np.uint64(3), (w >> np.uint64(16)) & np.uint64(0xFF),
                 w & np.uint64(0xFFFF), objects[row], ((w >> np.uint64(26)) & np.uint64(1)) != 0, heads[row])


def _walked(pages: list[int], lengths: list[int]) -> np.ndarray:
    """Which of the spans at PAGES (ascending) of LENGTHS the walk takes: each one starting at or past the end of
    the last one taken."""
    keep, end = np.zeros(len(pages), dtype=bool), 0
    for i, (page, length) in enumerate(zip(pages, lengths)):
        if page >= end:
            keep[i], end = True, page + length
    return keep
