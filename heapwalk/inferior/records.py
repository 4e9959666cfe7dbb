"""Many small records read at once: the same few bytes at each of thousands of addresses (jemalloc's extent
headers and slab bitmaps, which sit together in its base blocks), one read per stretch of nearby addresses
instead of one per record, gathered into one array."""

from __future__ import annotations

import numpy as np

from heapwalk.inferior.memory import Memory, ReadError, read_once

__all__ = ["Records", "read_records"]

#: the most bytes read at once for a stretch of records
SPAN = 1 << 16


class Records:
    """SIZE bytes at each address asked for: `data` (uint8, one row each, zeros where unreadable), `readable`
    (bool), and for each unreadable row its ReadError (`errors`, by row)."""

    def __init__(self, count: int, size: int):
        self.data = np.zeros((count, size), dtype=np.uint8)
        self.readable = np.zeros(count, dtype=bool)
        self.errors: dict[int, ReadError] = {}


def read_records(mem: Memory, addresses: np.ndarray, size: int, span: int = SPAN) -> Records:
    """SIZE bytes at each of ADDRESSES (uint64, any order, repeats allowed): the records that lie within SPAN
    bytes of the first of a stretch are read in one piece, past MEM's cache (`read_once`: the records are copied
    out, and the blocks a walk reads a field at a time stay cached); where that fails, each of its records
    alone."""
    addresses = np.asarray(addresses, dtype=np.uint64)
    ordered, inverse = np.unique(addresses, return_inverse=True)
    got = Records(len(ordered), size)
    columns = np.arange(size, dtype=np.int64)
    i = 0
    while i < len(ordered):
        first = int(ordered[i])
        last = min(first + max(span - size, 0), (1 << 64) - 1)
        j = max(i + 1, int(np.searchsorted(ordered, np.uint64(last), side="right")))
        try:
            data = np.frombuffer(read_once(mem, first, int(ordered[j - 1]) - first + size), dtype=np.uint8)
            got.data[i:j] = data[(ordered[i:j] - np.uint64(first)).astype(np.int64)[:, None] + columns]
            got.readable[i:j] = True
        except ReadError:
            for k in range(i, j):
                _read_one(mem, got, k, int(ordered[k]), size)
        i = j
    out = Records(len(addresses), size)
    out.data, out.readable = got.data[inverse], got.readable[inverse]
    out.errors = {row: got.errors[k] for row, k in enumerate(inverse.tolist()) if k in got.errors} \
        if got.errors else {}
    return out


def _read_one(mem: Memory, got: Records, row: int, address: int, size: int) -> None:
    try:
        got.data[row] = np.frombuffer(mem.read(address, size), dtype=np.uint8)
        got.readable[row] = True
    except ReadError as exc:
        got.errors[row] = exc
