"""The in-use tables' and the leak totals' passes over every block, in C when `pip install` built heapwalk's small
library (`_reach.c`: `hw_tally`, `hw_signatures`), in numpy otherwise.

Each is one loop over millions of blocks.  numpy needs several passes for it, each making an array of a block
each (the sizes as doubles for bincount's weights, the buckets' keys, the images' bounds of each word), and a
fresh array is paid for again as the kernel clears its pages.  Both forms give the same numbers
(tests/unit/analysis/test_inuse.py); HEAPWALK_PURE=1 in the environment turns the library off.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from heapwalk.analysis.lookup import ABI
from heapwalk.common.view import BlockSizes
from heapwalk.inferior.clib import built_library

__all__ = ["tally", "signature_words", "NATIVE"]


def _load():
    """The built library with the two functions declared, or None (see `inferior.clib`)."""
    lib = built_library(Path(__file__).parent, "_reach", ("hw_tally", "hw_signatures", "hw_reach_abi"))
    if lib is not None and lib.hw_reach_abi() != ABI:
        return None
    if lib is not None:
        lib.hw_tally.restype = None
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.hw_tally.argtypes = [p, i64, p, p, i64, i64, p, i64, i64, p, p, p, p]
        lib.hw_signatures.restype = None
        lib.hw_signatures.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                      ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    return lib


#: the groups `hw_tally` reads as they are (any other is made int32 first)
_WIDTHS = (np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.int32))

_LIB = _load()
#: whether the C loops are in use
NATIVE = _LIB is not None


def tally(sizes: np.ndarray | BlockSizes, group: np.ndarray | None, slots: int, leaked: np.ndarray | None = None,
          by_exponent: bool = False) -> tuple[np.ndarray, ...]:
    """The blocks of SIZES (int64, or `view.BlockSizes`: read from the lengths, no array made) counted and summed by
    key (int64 arrays of SLOTS each): the key is GROUP's (uint8, uint16 or int32, each below SLOTS; None: 0), or
    with BY_EXPONENT GROUP's times 64 plus the size's power-of-two bucket (the exponent of its low end, 5 at least:
    [32, 64)).  Gives the count and bytes of each key, and the count and bytes of the blocks LEAKED (a mask; None:
    none) marks."""
    n = len(sizes)
    if _LIB is None:
        return _tally_numpy(np.asarray(sizes, dtype=np.int64), group, slots, leaked, by_exponent)
    given = sizes if isinstance(sizes, BlockSizes) else None
    lengths = None if given is None else np.ascontiguousarray(given.lengths)
    sizes = None if given is not None else np.ascontiguousarray(sizes, dtype=np.int64)
    if group is not None and len(group) and group.strides == (0,) and not group[0]:
        group = None                    # one key, 0, seen as many (`view.Blocks.arena_index`): no array made
    if group is not None and group.dtype not in _WIDTHS:
        group = group.astype(np.int32)
    group = None if group is None else np.ascontiguousarray(group)
    mask = None if leaked is None else np.ascontiguousarray(leaked, dtype=bool).view(np.uint8)
    out = np.zeros((4, slots), dtype=np.int64)
    _LIB.hw_tally(None if group is None else group.ctypes.data, 0 if group is None else group.itemsize,
                  None if sizes is None else sizes.ctypes.data, None if lengths is None else lengths.ctypes.data,
                  0 if given is None else given.shift, 0 if given is None else given.adjust,
                  None if mask is None else mask.ctypes.data, n, int(by_exponent), out[0].ctypes.data,
                  out[1].ctypes.data, out[2].ctypes.data, out[3].ctypes.data)
    return out[0], out[1], out[2], out[3]


def _tally_numpy(sizes: np.ndarray, group: np.ndarray | None, slots: int, leaked: np.ndarray | None,
                 by_exponent: bool) -> tuple[np.ndarray, ...]:
    """`tally` with bincount and add.at (the sums in integers: exact, as in C)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    key = np.zeros(len(sizes), dtype=np.int64) if group is None else np.asarray(group, dtype=np.int64)
    if by_exponent:
        key = key * 64 + _exponents(sizes) if len(sizes) else key
    counts = np.bincount(key, minlength=slots)
    total = np.zeros(slots, dtype=np.int64)
    np.add.at(total, key, sizes)
    gone, gone_bytes = np.zeros(slots, dtype=np.int64), np.zeros(slots, dtype=np.int64)
    if leaked is not None and leaked.any():
        gone = np.bincount(key[leaked], minlength=slots)
        np.add.at(gone_bytes, key[leaked], sizes[leaked])
    return counts, total, gone, gone_bytes


def _exponents(sizes: np.ndarray) -> np.ndarray:
    """Each size's power-of-two bucket, as the exponent of its low end (5 at least: [32, 64))."""
    exponent = sizes.astype(np.float64).view(np.int64)   # sizes are exact in a double: its exponent bits
    exponent >>= 52
    exponent -= 1023
    return np.maximum(exponent, 5, out=exponent)


def signature_words(first_words: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                    loads: np.ndarray) -> np.ndarray | None:
    """`leaks.signatures` in one C loop: each of FIRST_WORDS (uint64) itself when it lies in the range of the last
    image of STARTS and ENDS (sorted by start) starting at or below it and is none of LOADS (sorted), else 1 when
    it begins with text, else 0; None when the library is not built."""
    if _LIB is None:
        return None
    c = np.ascontiguousarray
    words, starts, ends, loads = (c(a, dtype=np.uint64) for a in (first_words, starts, ends, loads))
    out = np.empty(len(words), dtype=np.uint64)
    _LIB.hw_signatures(words.ctypes.data, len(words), starts.ctypes.data, ends.ctypes.data, len(starts),
                       loads.ctypes.data, len(loads), out.ctypes.data)
    return out
