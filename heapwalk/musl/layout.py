"""mallocng's structures on a 64-bit target, the same in every release from 1.2.1 to 1.2.5 (measured on Debian's
musl 1.2.3: its context is 928 bytes, __malloc_lock right after it).

A *meta area* is a 4 KiB-aligned page: a check word (the context's secret), the next area, its slot count, then
that many *metas* of 40 bytes.  A meta describes one *group*: up to 32 *slots* of one size class (or one slot
mapped on its own), with two masks, the slots available and the slots freed, and a word of bit fields.  A group
starts with a 16-byte header (its meta, its highest activated slot) and its slots follow; the 4 bytes before
each slot's user address hold its index, how many of its bytes are reserved past the request, and its offset
from the group's storage in 16-byte units."""

from __future__ import annotations

import numpy as np

__all__ = ["UNIT", "IB", "SIZE_CLASSES", "CLASSES", "MMAPPED", "Ctx", "META", "META_DTYPE", "AREA_HEADER",
           "AREA_SIZE", "META_SIZE", "AREA_SLOTS", "MMAP_THRESHOLD", "class_size"]

#: the unit of every size and offset, and the in-band header before each slot's user address
UNIT, IB = 16, 4
#: each size class's slot size in units (classes 0 to 47)
SIZE_CLASSES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 18, 20, 25, 31, 36, 42, 50, 63, 72, 84, 102, 127, 146, 170,
                204, 255, 292, 340, 409, 511, 584, 682, 818, 1023, 1169, 1364, 1637, 2047, 2340, 2730, 3276, 4095,
                4680, 5460, 6552, 8191)
CLASSES = len(SIZE_CLASSES)
#: the size class of a request mapped on its own
MMAPPED = 63
#: requests of this many bytes and more are mapped on their own
MMAP_THRESHOLD = 131052
AREA_SIZE, META_SIZE, AREA_HEADER = 4096, 40, 24
AREA_SLOTS = (AREA_SIZE - AREA_HEADER) // META_SIZE


def class_size(sc: int) -> int:
    """Size class SC's slot size in bytes."""
    return UNIT * SIZE_CLASSES[sc]


class Ctx:
    """Offsets in `struct malloc_context` (__malloc_context): 928 bytes."""

    secret, init_done, mmap_counter = 0, 8, 12
    free_meta_head, avail_meta, avail_meta_count = 16, 24, 32
    avail_meta_area_count, meta_alloc_shift = 40, 48
    meta_area_head, meta_area_tail, avail_meta_areas = 56, 64, 72
    active = 80                         # struct meta *[48]
    usage_by_class = 464                # size_t[48]
    unmap_seq, bounces, seq, brk = 848, 880, 912, 920
    size = 928


class META:
    """Offsets in `struct meta`, and its bit fields' places in the word at BITS."""

    prev, next, mem, avail_mask, freed_mask, bits = 0, 8, 16, 24, 28, 32
    last_idx_bits, freeable_bit, sizeclass_shift, maplen_shift = 5, 5, 6, 12


#: a meta area's metas as numpy reads them
META_DTYPE = np.dtype([("prev", "<u8"), ("next", "<u8"), ("mem", "<u8"), ("avail", "<u4"), ("freed", "<u4"),
                       ("bits", "<u8")])
