"""Whether memory holds a malloc_state: the test every way of finding arenas (main_arena in libc's data, the
ring, arenas found by their heaps) puts a candidate to."""

from __future__ import annotations

import struct

from heapwalk.glibc.locate.layout import Layout
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["plausible_arena"]


def plausible_arena(mem: Memory, layout: Layout, address: int) -> bool:
    """Does the memory at ADDRESS look like a malloc_state under LAYOUT: a mutex and flags glibc can leave, an
    aligned top (or the initial one, the unsorted bin's header, which 2.43's layout leaves 8 bytes off 16 while
    the arena has never grown), a sane system_mem, and every bin empty (self-linked) or pointing at aligned
    chunks?"""
    try:
        raw = mem.read(address, layout.arena_size)
    except ReadError:
        return False
    mutex, flags = struct.unpack_from("<ii", raw, 0)
    if mutex not in (0, 1, 2) or flags & ~7:
        return False
    top, = struct.unpack_from("<Q", raw, layout.off_top)
    system_mem, = struct.unpack_from("<Q", raw, layout.off_system_mem)
    initial_top = top == layout.bin_header(address, 1) and system_mem == 0
    if system_mem >= 1 << 47 or (top % 16 and not initial_top):  # system_mem need not be page-granular
        return False
    for index in range(1, 128):  # every bin is empty (self-linked) or points away from the arena
        fd, bk = struct.unpack_from("<QQ", raw, layout.off_bins + 16 * (index - 1))
        header = layout.bin_header(address, index)
        if (fd == header) != (bk == header) or (fd != header and (fd % 16 or bk % 16)):
            return False
    return True
