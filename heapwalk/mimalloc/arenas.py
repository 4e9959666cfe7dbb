"""mimalloc's arenas (from 2.1): large reservations cut into blocks of a segment's size, from which it takes its
segments.  Found without symbols from the segments themselves: an arena segment's memid names its arena (id) and
its block there, which gives the arena's start; the table of arenas is the run of pointers in the library's
data whose entry at that id describes an arena (id, start, blocks, its bitmaps) that
starts there: every arena, those no segment uses included."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.mimalloc.layout import MiLayout

__all__ = ["MiArena", "find_arenas", "arena_segment"]

_MEM_OS = (3, 4, 5)      # memkinds of memory taken from the system (OS, huge OS pages, remappable)


@dataclass(frozen=True)
class MiArena:
    """One arena: its description's address, the memory it reserved (BLOCKS of the segment size from START), and
    its blocks committed and in use, a bit each."""

    address: int
    id: int
    start: int
    blocks: int
    block_size: int
    committed: int
    inuse: int
    meta: int = 0               # bytes of its description taken from the system (0: in the library's data)
    purge: int = 0              # its blocks whose purge waits, a bit each

    @property
    def reserved(self) -> int:
        return self.blocks * self.block_size

    def committed_blocks(self) -> int:
        return bin(self.committed & ((1 << self.blocks) - 1)).count("1")

    def purge_ranges(self) -> list[tuple[int, int]]:
        """The committed blocks whose purge waits, as address ranges."""
        waiting = self.purge & self.committed & ((1 << self.blocks) - 1)
        return [(self.start + b * self.block_size, self.start + (b + 1) * self.block_size)
                for b in range(self.blocks) if waiting >> b & 1]

    def block_of(self, address: int) -> int:
        return (address - self.start) // self.block_size


def find_arenas(mem: Memory, base: int, words: np.ndarray, layout: MiLayout, segment: tuple[int, int, int] | None
                ) -> tuple[MiArena, ...]:
    """Every arena, from SEGMENT = (its address, its arena's id, its block index) of one arena segment (none: no
    arenas found): the table of the library's data (its slots, 64-byte aligned: pointers, then zeros) whose entry
    at the arena's id describes an arena that starts where the segment says, and each entry the arena of its
    place's id."""
    if segment is None or layout.seg_memkind is None:
        return ()
    at, arena_id, block = segment
    start = at - block * layout.segment_size
    slots = layout.arena_slots
    pointer = (words > np.uint64(0x10000)) & (words < np.uint64(1 << 47)) & ((words & np.uint64(7)) == 0)
    for j in np.flatnonzero(pointer[:len(words) - slots + 1]).tolist():
        if (base + 8 * j) % 64 or (j and pointer[j - 1]):
            continue
        count = int(np.argmin(pointer[j:j + slots])) if not pointer[j:j + slots].all() else slots
        if arena_id > count or words[j + count:j + slots].any():
            continue
        named = _arena(mem, int(words[j + arena_id - 1]), layout)
        if named is None or named.id != arena_id or named.start != start:
            continue
        arenas = tuple(_arena(mem, int(words[j + k]), layout) for k in range(count))
        if all(a is not None and a.id == k + 1 for k, a in enumerate(arenas)):
            return arenas
    return ()


def _arena(mem: Memory, at: int, layout: MiLayout) -> MiArena | None:
    """The arena described at AT, or None when it does not read as one."""
    try:
        head = mem.read(at, layout.arena_inuse)
        word = lambda off: int.from_bytes(head[off:off + 8], "little")     # noqa: E731
        blocks, fields = word(layout.arena_blocks), word(layout.arena_fields)
        if not 0 < blocks <= fields * 64 or fields > 1 << 16:
            return None
        inuse = int.from_bytes(mem.read(at + layout.arena_inuse, 8 * fields), "little")
        pointer = word(layout.arena_committed)
        committed = int.from_bytes(mem.read(pointer, 8 * fields), "little") if pointer else (1 << blocks) - 1
        pointer = word(layout.arena_purge)
        purge = int.from_bytes(mem.read(pointer, 8 * fields), "little") if pointer else 0
    except ReadError:
        return None
    meta = word(layout.arena_meta_size) if head[layout.arena_meta_memkind] in _MEM_OS else 0
    return MiArena(at, int.from_bytes(head[layout.arena_id:layout.arena_id + 4], "little", signed=True),
                   word(layout.arena_start), blocks, layout.segment_size, committed, inuse, meta, purge)


def arena_segment(mem: Memory, layout: MiLayout, segments) -> tuple[int, int, int] | None:
    """(address, arena id, block index) of the first of SEGMENTS taken from an arena (None: none is)."""
    if layout.seg_memkind is None:
        return None
    for at in segments:
        try:
            head = mem.read(at, 24)
        except ReadError:
            continue
        if head[layout.seg_memkind] == 6:
            block = int.from_bytes(head[0:8], "little")
            arena_id = int.from_bytes(head[8:12], "little", signed=True)
            if arena_id > 0 and block < 1 << 20:
                return at, arena_id, block
    return None

