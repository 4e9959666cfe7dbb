"""jemalloc's slabs read in C when `pip install` built its small library (`_native.c`, loaded with ctypes: no
Python headers), in numpy otherwise (`jemalloc.blocks`); the tests hold the two equal.  HEAPWALK_PURE=1 in the
environment turns the library off."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from heapwalk.inferior.clib import built_library

__all__ = ["slab_regions", "slab_regions_compact", "NATIVE"]


def _load():
    """The built library with its function's types declared, or None (see `inferior.clib`)."""
    lib = built_library(Path(__file__).parent, "_native", ("hw_slab_bitmap_regions", "hw_slab_regions_compact",
                                                           "hw_jemalloc_abi"))
    if lib is not None and lib.hw_jemalloc_abi() != 3:       # built from older sources: other arguments
        return None
    if lib is not None:
        for f in (lib.hw_slab_bitmap_regions, lib.hw_slab_regions_compact):
            f.restype = ctypes.c_int64
            f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 10
    return lib


_LIB = _load()
#: whether the slabs are read in C
NATIVE = _LIB is not None


def slab_regions(bitmaps: np.ndarray, nregs: np.ndarray, size: np.ndarray, nfree: np.ndarray, readable: np.ndarray,
                 address: np.ndarray, arena: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """The regions slabs hand out, from their bitmaps (BITMAPS: uint8, a row a slab; a set bit is a free region),
    in one C loop (`hw_slab_bitmap_regions`; `blocks` has the numpy form): starts, ends, arenas, and whether
    each slab's bitmap was readable and counted its NFREE; None when the library is not built."""
    if _LIB is None:
        return None
    c = np.ascontiguousarray
    bitmaps, nregs, size = c(bitmaps, dtype=np.uint8), c(nregs, dtype=np.int64), c(size, dtype=np.uint64)
    nfree, readable = c(nfree, dtype=np.int32), c(readable, dtype=np.uint8)
    address, arena = c(address, dtype=np.uint64), c(arena, dtype=np.int32)
    stride = bitmaps.shape[1] if bitmaps.ndim == 2 else 64
    good = np.empty(len(nregs), dtype=np.uint8)
    room = _LIB.hw_slab_bitmap_regions(bitmaps.ctypes.data, stride, len(nregs), nregs.ctypes.data, size.ctypes.data,
                                       nfree.ctypes.data, readable.ctypes.data, address.ctypes.data,
                                       arena.ctypes.data, None, None, None, good.ctypes.data)   # counted first
    starts, ends = np.empty(room, dtype=np.uint64), np.empty(room, dtype=np.uint64)
    arenas = np.empty(room, dtype=np.int32)
    count = _LIB.hw_slab_bitmap_regions(bitmaps.ctypes.data, stride, len(nregs), nregs.ctypes.data, size.ctypes.data,
                                 nfree.ctypes.data, readable.ctypes.data, address.ctypes.data, arena.ctypes.data,
                                 starts.ctypes.data, ends.ctypes.data, arenas.ctypes.data, good.ctypes.data)
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
    c = np.ascontiguousarray
    bitmaps, nregs, size = c(bitmaps, dtype=np.uint8), c(nregs, dtype=np.int64), c(size, dtype=np.uint64)
    nfree, readable = c(nfree, dtype=np.int32), c(readable, dtype=np.uint8)
    address, tag = c(address, dtype=np.uint64), c(tag, dtype=np.uint8)
    stride = bitmaps.shape[1] if bitmaps.ndim == 2 else 64
    good = np.empty(len(nregs), dtype=np.uint8)
    args = (bitmaps.ctypes.data, stride, len(nregs), nregs.ctypes.data, size.ctypes.data, nfree.ctypes.data,
            readable.ctypes.data, address.ctypes.data, tag.ctypes.data)
    count = _LIB.hw_slab_regions_compact(*args, None, None, None, good.ctypes.data)     # counted first
    starts, lengths = np.empty(count + room, dtype=np.uint64), np.empty(count + room, dtype=np.uint32)
    tags = np.empty(count + room, dtype=np.uint8)
    count = _LIB.hw_slab_regions_compact(*args, starts.ctypes.data, lengths.ctypes.data, tags.ctypes.data,
                                         good.ctypes.data)
    return starts, lengths, tags, count, good.view(bool)
