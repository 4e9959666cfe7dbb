"""Synthetic glibc heaps in memory images, for walker tests without gdb."""

from __future__ import annotations

import struct

from heapwalk.glibc.locate.layout import Layout, layout_for
from heapwalk.inferior.image import ImageMemory

ARENA = 0x7F0000001000
HEAP = 0x555555559000


class SynthHeap:
    """An initialised arena (every bin self-linked) plus a heap region to put chunks in."""

    def __init__(self, version=(2, 36), heap_size=0x10000):
        self.layout: Layout = layout_for(version)
        self.mem = ImageMemory({ARENA: bytes(self.layout.arena_size + 64), HEAP: bytes(heap_size)})
        lay = self.layout
        for i in range(1, 128):
            head = lay.bin_header(ARENA, i)
            self.mem.write_u64(head + 16, head)
            self.mem.write_u64(head + 24, head)
        self.mem.write_u64(ARENA + lay.off_next, ARENA)
        self.mem.write_u64(ARENA + lay.off_top, ARENA + lay.off_top)  # initial_top
        self.mem.write_u64(ARENA + lay.off_system_mem, heap_size)

    def w(self, address: int, value: int) -> None:
        self.mem.write_u64(address, value)

    def chunk(self, address: int, size: int, fd: int = 0, bk: int = 0) -> int:
        self.w(address + 8, size)
        self.w(address + 16, fd)
        self.w(address + 24, bk)
        return address

    def link_bin(self, index: int, chunks: list[int]) -> None:
        """Makes bin INDEX a proper circular list of CHUNKS (already headed)."""
        head = self.layout.bin_header(ARENA, index)
        ring = [head] + chunks
        for i, c in enumerate(ring):
            nxt, prv = ring[(i + 1) % len(ring)], ring[i - 1]
            self.w(c + 16, nxt)
            self.w(c + 24, prv)

    def fastbin_slot(self, index: int) -> int:
        return ARENA + self.layout.off_fastbins + 8 * index

    def protect(self, field: int, target: int) -> int:
        return (field >> 12) ^ target if self.layout.safe_linking else target

    def tcache(self, address: int, bins: dict[int, list[int]], counts: dict[int, int] | None = None) -> int:
        """Writes a tcache_perthread_struct at ADDRESS (user memory) with safe-linked lists."""
        lay = self.layout
        counts = counts or {i: len(e) for i, e in bins.items()}
        for i, n in counts.items():
            raw = bytearray(self.mem.read(address + 2 * i - (2 * i) % 8, 8))
            struct.pack_into("<H", raw, (2 * i) % 8, n)
            self.w(address + 2 * i - (2 * i) % 8, struct.unpack("<Q", bytes(raw))[0])
        for i, entries in bins.items():
            self.w(address + lay.tcache_off_entries + 8 * i, entries[0] if entries else 0)
            for e, nxt in zip(entries, entries[1:] + [0]):
                self.w(e, self.protect(e, nxt))
        return address
