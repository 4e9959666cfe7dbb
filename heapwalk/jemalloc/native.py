"""jemalloc's slabs read in C when `pip install` built its small library (`_native.c`, loaded with ctypes: no
Python headers), in numpy otherwise (`jemalloc.blocks`); the tests hold the two equal.  HEAPWALK_PURE=1 in the
environment turns the library off."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from heapwalk.inferior.clib import built_library

__all__ = ["slab_regions", "slab_regions_compact", "compact_edit", "NATIVE"]


def _load():
    """The built library with its function's types declared, or None (see `inferior.clib`)."""
    lib = built_library(Path(__file__).parent, "_native", ("hw_slab_bitmap_regions", "hw_slab_regions_compact",
                                                           "hw_compact_edit", "hw_jemalloc_abi"))
    if lib is not None and lib.hw_jemalloc_abi() != 4:       # built from older sources: other arguments
        return None
    if lib is not None:
        for f in (lib.hw_slab_bitmap_regions, lib.hw_slab_regions_compact):
            f.restype = ctypes.c_int64
            f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 10
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.hw_compact_edit.restype = i64
        lib.hw_compact_edit.argtypes = [p, p, p, i64, p, i64, p, p, p, i64]
    return lib


_LIB = _load()
#: whether the slabs are read in C
NATIVE = _LIB is not None


def _arguments(bitmaps, nregs, size, nfree, readable, address, last, last_type) -> tuple:
    """The arrays both C functions take first, in the types they take (LAST: the arena numbers or the tags, of
    LAST_TYPE), kept alive by the caller while the call runs; and the bitmaps' stride."""
    c = np.ascontiguousarray
    arrays = (c(bitmaps, dtype=np.uint8), c(nregs, dtype=np.int64), c(size, dtype=np.uint64),
              c(nfree, dtype=np.int32), c(readable, dtype=np.uint8), c(address, dtype=np.uint64),
              c(last, dtype=last_type))
    return arrays, (arrays[0].shape[1] if arrays[0].ndim == 2 else 64)


def _call(f, arrays: tuple, stride: int, *out) -> int:
    """F (a C function of `_LIB`) on ARRAYS (`_arguments`) and the output arrays OUT (or None)."""
    bitmaps, *rest = arrays
    return f(bitmaps.ctypes.data, stride, len(arrays[1]), *(a.ctypes.data for a in rest),
             *(None if o is None else o.ctypes.data for o in out))


def slab_regions(bitmaps: np.ndarray, nregs: np.ndarray, size: np.ndarray, nfree: np.ndarray, readable: np.ndarray,
                 address: np.ndarray, arena: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """The regions slabs hand out, from their bitmaps (BITMAPS: uint8, a row a slab; a set bit is a free region),
    in one C loop (`hw_slab_bitmap_regions`; `blocks` has the numpy form): starts, ends, arenas, and whether
    each slab's bitmap was readable and counted its NFREE; None when the library is not built."""
    if _LIB is None:
        return None
    arrays, stride = _arguments(bitmaps, nregs, size, nfree, readable, address, arena, np.int32)
    good = np.empty(len(arrays[1]), dtype=np.uint8)
    room = _call(_LIB.hw_slab_bitmap_regions, arrays, stride, None, None, None, good)      # counted first
    starts, ends, arenas = np.empty(room, dtype=np.uint64), np.empty(room, dtype=np.uint64), np.empty(room, np.int32)
    count = _call(_LIB.hw_slab_bitmap_regions, arrays, stride, starts, ends, arenas, good)
    return starts[:count], ends[:count], arenas[:count], good.view(bool)


def slab_regions_compact(bitmaps: np.ndarray, nregs: np.ndarray, size: np.ndarray, nfree: np.ndarray,
                         readable: np.ndarray, address: np.ndarray, tag: np.ndarray, room: int = 0
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray] | None:
    """`slab_regions` as the leak scan keeps blocks (`hw_slab_regions_compact`): starts, lengths in 8-byte units
    (every SIZE a multiple of 8, below 32 GiB) and each slab's TAG (uint8: its arena's index), in arrays with ROOM
    more entries at their end (for the large allocations, merged in place), how many regions they hold, and
    whether each slab's bitmap was readable and counted its NFREE; None when the library is not built."""
    if _LIB is None:
        return None
    arrays, stride = _arguments(bitmaps, nregs, size, nfree, readable, address, tag, np.uint8)
    good = np.empty(len(arrays[1]), dtype=np.uint8)
    count = _call(_LIB.hw_slab_regions_compact, arrays, stride, None, None, None, good)    # counted first
    starts, lengths = np.empty(count + room, dtype=np.uint64), np.empty(count + room, dtype=np.uint32)
    tags = np.empty(count + room, dtype=np.uint8)
    count = _call(_LIB.hw_slab_regions_compact, arrays, stride, starts, lengths, tags, good)
    return starts, lengths, tags, count, good.view(bool)


def compact_edit(columns: tuple[np.ndarray, np.ndarray, np.ndarray], n: int, excluded: np.ndarray,
                 other: tuple[np.ndarray, np.ndarray, np.ndarray]) -> int:
    """COLUMNS' first N blocks (`slab_regions_compact`'s starts, lengths and tags, strictly ascending) less those
    starting at one of EXCLUDED (ascending), with OTHER's (ascending, apart from theirs; the columns have room for
    them) merged in, in address order, in place in one C pass (`hw_compact_edit`): how many blocks there are
    then.  Only where the library is built (`slab_regions_compact` gave the columns)."""
    starts, lengths, tags = columns
    c = np.ascontiguousarray
    excluded = c(excluded, dtype=np.uint64)
    o_starts, o_lengths, o_tags = c(other[0], dtype=np.uint64), c(other[1], dtype=np.uint32), c(other[2], np.uint8)
    return int(_LIB.hw_compact_edit(starts.ctypes.data, lengths.ctypes.data, tags.ctypes.data, n,
                                    excluded.ctypes.data, len(excluded), o_starts.ctypes.data,
                                    o_lengths.ctypes.data, o_tags.ctypes.data, len(o_starts)))
