"""mimalloc's segment map.  To 2.1.7 it is one bitmap in the object's data, a bit per segment-aligned address below 20
TiB (40 TiB from 2.1.2), found by the bits of the segments stamped in memory (`flat_segment_map`). From 2.1.8: a
table in the object's data of pointers to parts it takes from the system (8 KiB each), each part a bitmap with one
bit per segment-aligned address of its span of the address space below 48 TiB. It holds only the segments taken from
the system (those of arenas are found by their arena's blocks in use): a segment with its bit set is live; its parts
count in mimalloc's reserved and committed figures."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.mimalloc.layout import MiLayout

__all__ = ["MapParts", "find_map_parts", "unstamped_blocks", "MAP_LIMIT", "flat_segment_map", "map_bits",
           "pages_in_use"]

#: the segment map covers the addresses below this
MAP_LIMIT = 48 << 40
_PART_BITS = 8 * (8 * 1024 - 128)


@dataclass(frozen=True)
class MapParts:
    """The segment map's table, the parts it points to, and the segments their bits hold."""

    table: int
    parts: tuple[int, ...]
    held: frozenset

    def part_size(self, layout: MiLayout) -> int:
        """What one part takes from the system: its memory id, then its bitmap."""
        return layout.map_part_head + _PART_BITS // 8


def find_map_parts(mem: Memory, base: int, words: np.ndarray, layout: MiLayout,
                   segments: list[int]) -> MapParts | None:
    """The table of the object's data (WORDS, from BASE) whose parts hold the bits of some of SEGMENTS (taken
    from the system, below MAP_LIMIT), every entry NULL or a part (the table that holds most of them); None when
    no such table is there (or no segment needs one)."""
    low = sorted(s for s in segments if s < MAP_LIMIT)
    if not low:
        return None
    span = _PART_BITS << layout.segment_shift
    n = layout.segment_map_parts
    first = low[0] // span
    best = None
    for i in np.flatnonzero(words[first:len(words) - n + first + 1]).tolist():
        table = [int(p) for p in words[i:i + n]]
        if not all(_is_part(mem, p) for p in table if p):
            continue
        held = frozenset(s for s in low if _bit(mem, layout, table[s // span], s % span))
        if held and (best is None or len(held) > len(best.held)):
            best = MapParts(base + 8 * i, tuple(p for p in table if p), held)
    return best


def _is_part(mem: Memory, at: int) -> bool:
    """Whether AT can be a part: page-aligned memory from the system, whose memory id starts with its own
    address."""
    try:
        return not at % 4096 and u64(mem, at) == at
    except ReadError:
        return False


def _bit(mem: Memory, layout: MiLayout, part: int, offset: int) -> bool:
    """Whether PART holds the bit of the segment OFFSET bytes into its span."""
    if not part:
        return False
    bit = offset >> layout.segment_shift
    try:
        return bool(u64(mem, part + layout.map_part_head + 8 * (bit // 64)) >> (bit % 64) & 1)
    except ReadError:
        return False


def unstamped_blocks(mem: Memory, layout: MiLayout, arenas, live: tuple[int, ...]) -> tuple[int, ...]:
    """From 2.1.8: the arenas' blocks in use that no live stamped segment covers (each segment its slices from
    its header): a segment there lost its stamp, or its header cannot be read."""
    covered = set()
    for at in live:
        arena = next((a for a in arenas if a.start <= at < a.start + a.reserved), None)
        if arena is None:
            continue
        try:
            size = min(max(u64(mem, at + layout.seg_slices_count), 1) * layout.slice_size, arena.reserved)
        except ReadError:
            size = layout.segment_size
        covered.update((arena.start, b) for b in range(arena.block_of(at), arena.block_of(at + size - 1) + 1))
    return tuple(a.start + b * a.block_size for a in arenas for b in range(a.blocks)
                 if a.inuse >> b & 1 and (a.start, b) not in covered)


def flat_segment_map(base: int, words: np.ndarray, stamped: list[int], layout: MiLayout, used: list[int]
                 ) -> tuple[int | None, set[int]]:
    """(the segment map's address, the segments it holds): the word array of the object's data whose set bits,
    read as segments, include every stamped segment with pages in USED (a freed one, in 2.0's segment cache or
    an arena's block, keeps its stamp with no page, out of the map); of several, the one with the fewest other
    bits (a segment the map holds whose header is not stamped: unreadable, or damaged).  With one such segment the
    map must hold no segment that is not stamped.  (None, all stamped) when none is found."""
    if not stamped:
        return None, set()
    known, required = set(stamped), set(used or stamped)
    found: list[tuple[int, set[int]]] = []
    for start in _holding(words, layout, required).tolist():
        held = map_bits(words[start:start + layout.segment_map_words], layout, known)
        if held is not None and required <= held and (len(required) > 1 or held <= known):
            found.append((base + 8 * start, held))
    fewest = min((len(h) for _, h in found), default=0)
    best = [f for f in found if len(f[1]) == fewest]
    return best[0] if len(best) == 1 else (None, known)


def _holding(words: np.ndarray, layout: MiLayout, required: set[int]) -> np.ndarray:
    """The word indexes, ascending, where a map read from WORDS would have the bit of every REQUIRED segment set."""
    places = [divmod(at >> layout.segment_shift, 64) for at in sorted(required)]
    low, bit = places[0]
    starts = np.flatnonzero((words >> np.uint64(bit)) & np.uint64(1)) - low
    starts = starts[starts >= 0]
    for word, bit in places:
        if not len(starts) or word >= layout.segment_map_words:
            return starts[:0]
        starts = starts[starts + word < len(words)]
        starts = starts[(words[starts + word] >> np.uint64(bit)) & np.uint64(1) == 1]
    return starts


def pages_in_use(mem: Memory, layout: MiLayout, segment: int) -> int:
    """The pages in use the header of the stamped SEGMENT counts (0 when unreadable)."""
    try:
        return u64(mem, segment + layout.seg_used)
    except ReadError:
        return 0


def map_bits(words: np.ndarray, layout: MiLayout, known: set[int], extra: int = 64) -> set[int] | None:
    """The segments whose bits WORDS has set, or None when more than EXTRA of them are not in KNOWN (no map)."""
    out = set()
    others = 0
    for i in np.flatnonzero(words).tolist():
        w = int(words[i])
        while w:
            b = (w & -w).bit_length() - 1
            at = (i * 64 + b) << layout.segment_shift
            if at not in known:
                others += 1
                if others > extra:
                    return None
            out.add(at)
            w &= w - 1
    return out
