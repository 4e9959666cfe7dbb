"""jemalloc's slabs read in C when `pip install` built its small library (`_native.c`, loaded with ctypes: no
Python headers), in numpy otherwise (`jemalloc.blocks`); the tests hold the two equal.  HEAPWALK_PURE=1 in the
environment turns the library off."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from heapwalk.inferior.clib import built_library

__all__ = ["slab_regions", "NATIVE"]


def _load():
    """The built library with its function's types declared, or None (see `inferior.clib`)."""
    lib = built_library(Path(__file__).parent, "_native", ("hw_slab_bitmap_regions", "hw_jemalloc_abi"))
    if lib is not None and lib.hw_jemalloc_abi() != 2:       # built from older sources: other arguments
        return None
    if lib is not None:
        lib.hw_slab_bitmap_regions.restype = ctypes.c_int64
        lib.hw_slab_bitmap_regions.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 10
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
