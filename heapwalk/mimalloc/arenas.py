"""mimalloc's arenas: large reservations cut into blocks of a segment's size, from which it takes its segments (from
2.1 all but huge blocks'; to 2.0.9 only those of the reservations its options or the program ask for). Found without
symbols from the segments themselves: an arena segment's memid names its arena (id) and its block there, which gives
the arena's start; the table of arenas is the run of pointers in the library's data whose entry at that id describes
an arena (id, start, blocks, its bitmaps) that starts there: every arena, those no segment uses included."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.mimalloc.layout import MiLayout

__all__ = ["MiArena", "find_arenas", "arena_segment", "segment_arena", "decodes_arenas", "meta_bytes"]

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
    pinned: bool = False        # committed as a whole, never decommitted (no bitmap of committed blocks)

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
    if segment is None or not decodes_arenas(layout):
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
        named = _arena(mem, int(words[j + arena_id - 1]), layout, arena_id)
        if named is None or named.id != arena_id or named.start != start:
            continue
        arenas = tuple(_arena(mem, int(words[j + k]), layout, k + 1) for k in range(count))
        if all(a is not None and a.id == k + 1 for k, a in enumerate(arenas)):
            return arenas
    return ()


def _arena(mem: Memory, at: int, layout: MiLayout, place: int) -> MiArena | None:
    """The arena described at AT, at PLACE (from 1) in the table, or None when it does not read as one."""
    try:
        head = mem.read(at, layout.arena_inuse)
        word = lambda off: int.from_bytes(head[off:off + 8], "little")     # noqa: E731
        blocks, fields = word(layout.arena_blocks), word(layout.arena_fields)
        if not 0 < blocks <= fields * 64 or fields > 1 << 16:
            return None
        inuse = int.from_bytes(mem.read(at + layout.arena_inuse, 8 * fields), "little")
        pinned = not word(layout.arena_committed)
        committed = (1 << blocks) - 1 if pinned else \
            int.from_bytes(mem.read(word(layout.arena_committed), 8 * fields), "little")
        pointer = word(layout.arena_purge) if layout.arena_purge is not None else 0
        purge = int.from_bytes(mem.read(pointer, 8 * fields), "little") if pointer else 0
    except ReadError:
        return None
    if layout.arena_meta_memkind is None:
        meta = meta_bytes(layout, fields, not pinned)
    else:
        meta = word(layout.arena_meta_size) if head[layout.arena_meta_memkind] in _MEM_OS else 0
    number = place if layout.arena_id is None else \
        int.from_bytes(head[layout.arena_id:layout.arena_id + 4], "little", signed=True)
    return MiArena(at, number, word(layout.arena_start), blocks, layout.segment_size, committed, inuse, meta, purge,
                   pinned)


def meta_bytes(layout: MiLayout, fields: int, decommits: bool) -> int:
    """To 2.0.9, the bytes an arena's description asks of the system: the description (its bitmap of blocks in use
    in place, one field long) and FIELDS words of each bitmap, two, or three when it DECOMMITS (its bitmap of
    committed blocks)."""
    return layout.arena_inuse + 8 + (3 if decommits else 2) * 8 * fields


def decodes_arenas(layout: MiLayout) -> bool:
    """Whether heapwalk reads LAYOUT's arenas: those measured (2.0.5 on)."""
    return layout.seg_memkind is not None or layout.arena_meta_memkind is None


def segment_arena(head: bytes, layout: MiLayout) -> tuple[int, int] | None:
    """(its arena's id, its block there) of the segment whose header starts with HEAD, or None when it was taken
    from the system (or heapwalk reads no arena of LAYOUT)."""
    if layout.seg_memkind is not None:
        if head[layout.seg_memkind] != 6:
            return None
        return int.from_bytes(head[8:12], "little", signed=True), int.from_bytes(head[0:8], "little")
    if not decodes_arenas(layout):
        return None
    memid = int.from_bytes(head[layout.seg_memid:layout.seg_memid + 8], "little")
    return (memid & 0x7F, memid >> 8) if memid & 0x7F else None


def arena_segment(mem: Memory, layout: MiLayout, segments) -> tuple[int, int, int] | None:
    """(address, arena id, block index) of the first of SEGMENTS taken from an arena (None: none is)."""
    if not decodes_arenas(layout):
        return None
    for at in segments:
        try:
            named = segment_arena(mem.read(at, 24), layout)
        except ReadError:
            continue
        if named is not None and named[0] > 0 and named[1] < 1 << 20:
            return at, *named
    return None

