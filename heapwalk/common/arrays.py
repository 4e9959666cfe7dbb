"""Array operations numpy has, made the way that stays fast on millions of values."""

from __future__ import annotations

import numpy as np

__all__ = ["distinct", "staggered", "STAGGER"]

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


def staggered(n: int, dtype, k: int) -> np.ndarray:
    """np.empty(N, DTYPE) for the K-th of arrays a loop writes or reads side by side at the same index, starting
    K * STAGGER bytes after where it would.  Arrays made one after another, or of the same power-of-two size,
    otherwise start at the same offset from a page, and the same index of each falls in the same cache set: a
    loop over four such columns ran five times slower (the glibc sweep, measured on the huge bench core)."""
    pad = -(-k * STAGGER // np.dtype(dtype).itemsize)
    return np.empty(n + pad, dtype=dtype)[pad:]
