"""Array operations numpy has, made the way that stays fast on millions of values."""

from __future__ import annotations

import numpy as np

__all__ = ["distinct", "counted", "ordered", "staggered", "STAGGER", "COUNTED_BELOW"]

#: bytes between the starts of arrays a loop goes through side by side (`staggered`): nine cache lines, so that
#: neither the same offset from a page nor from a power of two puts their entries in the same cache sets
STAGGER = 576


def distinct(values) -> np.ndarray:
    """The values of VALUES (a numpy array, or what makes one), each once, ascending, as np.unique gives them.
    numpy from 2.3 finds them with a hash table, some fifty times slower than a sort on millions of values (3 M
    addresses: 2.9 s against 0.04 s): runs of a value are cut to one, then the rest sorted and cut again."""
    a = np.asarray(values).ravel()
    if len(a) < 2:
        return a.copy()
    a = a[np.flatnonzero(np.concatenate(([True], a[1:] != a[:-1])))]
    a.sort()
    return a[np.flatnonzero(np.concatenate(([True], a[1:] != a[:-1])))]


#: values below this are counted in one array of as many counters (8 MiB): sizes of chunks, mostly
COUNTED_BELOW = 1 << 20


def counted(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value of VALUES (unsigned integers) once, ascending, and how many times it comes, as
    np.unique(..., return_counts=True) gives them: the values below `COUNTED_BELOW` counted by their place in an
    array (17 M sizes of free chunks: 0.03 s, against 0.69 s to sort them), the others (few, in a heap) sorted."""
    a = np.asarray(values).ravel()
    if not len(a) or a.dtype.kind != "u":
        return np.unique(a, return_counts=True)
    below = a < COUNTED_BELOW
    small = a if bool(below.all()) else a[below]
    tally = np.bincount(small.view(np.int64) if small.dtype == np.uint64 else small.astype(np.int64))
    seen = np.flatnonzero(tally)
    out_values, out_counts = seen.astype(a.dtype), tally[seen]
    if len(small) < len(a):
        big_values, big_counts = np.unique(a[~below], return_counts=True)
        out_values, out_counts = np.concatenate((out_values, big_values)), np.concatenate((out_counts, big_counts))
    return out_values, out_counts


def ordered(values: np.ndarray) -> np.ndarray:
    """np.argsort(VALUES, kind="stable") of unsigned integers: where the values' span (less the low bits all of them
    share as zeros) and their places fit in 64 bits together, as addresses do, one sort of the values with each
    one's place below it, the places then read off: numpy sorts numbers faster than it sorts their order (the free
    lists of the large bench cores, 2 M and 1.5 M chunks: 0.030 and 0.090 s, against 0.034 and 0.128 s for
    argsort's stable order and 0.135 and 0.112 s for its default)."""
    a = np.asarray(values).ravel()
    n = len(a)
    if n < 2 or a.dtype.kind != "u":
        return np.argsort(a, kind="stable")
    low = int(a.min())
    span = np.subtract(a, np.uint64(low), dtype=np.uint64)     # (one new array, the values' own left as they are)
    shift = _zero_low_bits(int(np.bitwise_or.reduce(span)))
    high = int(span.max()) >> shift
    places = max(n - 1, 1).bit_length()
    if high.bit_length() + places > 64:
        return np.argsort(a, kind="stable")
    span >>= np.uint64(shift)
    span <<= np.uint64(places)
    span |= np.arange(n, dtype=np.uint64)
    span.sort(kind="stable")          # (a merge of runs: lists hold many ascending ones)
    span &= np.uint64((1 << places) - 1)
    return span.view(np.int64) if np.dtype(np.intp) == np.int64 else span.astype(np.intp)


def _zero_low_bits(word: int) -> int:
    """How many low bits of WORD are zero (0 for 0)."""
    return (word & -word).bit_length() - 1 if word else 0


def staggered(n: int, dtype, k: int) -> np.ndarray:
    """np.empty(N, DTYPE) for the K-th of arrays a loop writes or reads side by side at the same index, starting
    K * STAGGER bytes after where it would.  Arrays made one after another, or of the same power-of-two size,
    otherwise start at the same offset from a page, and the same index of each falls in the same cache set: a
    loop over four such columns ran five times slower (the glibc sweep, measured on the huge bench core)."""
    pad = -(-k * STAGGER // np.dtype(dtype).itemsize)
    return np.empty(n + pad, dtype=dtype)[pad:]
