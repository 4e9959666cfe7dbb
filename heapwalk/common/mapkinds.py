"""The kinds of run a heap map draws: what holds each byte of a strip (`view.HeapStrip.kinds` indexes
`MAP_KINDS`).  Each kind has its words in legends, its colour, its character in a plain strip, its place in
the drawing, what it is (the program's, free memory the allocator keeps, damage) and whether each of its
runs is one of the allocator's pieces.  The kinds every allocator has are here; an allocator adds its own
when its folder is imported (`add_map_kind`), after the others, so that no index moves."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MapKind", "MAP_KINDS", "KINDS", "SHARED", "USED", "FREE", "DAMAGE", "add_map_kind", "index", "in_drawing_order",
           "drawing_order", "of_use", "piece_kinds"]

#: what a kind is: held by the program, free memory the allocator keeps for reuse, bytes damage hid
USED, FREE, DAMAGE = "used", "free", "damage"


@dataclass(frozen=True)
class MapKind:
    """One kind of run: NAME (its key in documents and SVG attributes), LABEL in legends, COLOUR (#rrggbb),
    CHAR in a plain strip, RANK (where it is drawn: its place in a column's stack, top down, and in legends),
    USE (`USED`, `FREE`, `DAMAGE` or "" for anything else) and PIECE (each run is one chunk, one extent)."""

    name: str
    label: str
    colour: str
    char: str = "?"
    rank: int = 1000
    use: str = ""
    piece: bool = False


#: every kind's name, by index (the order kinds were added in)
MAP_KINDS: list[str] = []
#: every kind, by name
KINDS: dict[str, MapKind] = {}


def add_map_kind(kind: MapKind) -> int:
    """Adds KIND (or replaces the kind of its name, keeping its index); its index in MAP_KINDS."""
    if kind.name not in KINDS:
        if len(MAP_KINDS) >= 255:
            raise ValueError("a heap map has room for 255 kinds")
        MAP_KINDS.append(kind.name)
    KINDS[kind.name] = kind
    return MAP_KINDS.index(kind.name)


def index(name: str) -> int:
    """The index of the kind NAME."""
    return MAP_KINDS.index(name)


def drawing_order() -> np.ndarray:
    """The kinds' indexes in drawing order (by rank, then by index)."""
    return np.array(sorted(range(len(MAP_KINDS)), key=lambda i: (KINDS[MAP_KINDS[i]].rank, i)), dtype=np.int64)


def in_drawing_order(names) -> list[str]:
    """NAMES (kinds) in drawing order."""
    return sorted(names, key=lambda n: (KINDS[n].rank, MAP_KINDS.index(n)))


def of_use(use: str) -> list[int]:
    """The indexes of the kinds whose use is USE."""
    return [i for i, name in enumerate(MAP_KINDS) if KINDS[name].use == use]


def piece_kinds() -> list[str]:
    """The kinds whose every run is one piece, in drawing order."""
    return in_drawing_order([n for n in MAP_KINDS if KINDS[n].piece])


#: the kinds every allocator has, added here
SHARED = (MapKind("in_use", "in use", "#d62728", "#", 0, USED, True),
          MapKind("leaked", "leaked (in use, nothing reaches it)", "#e377c2", "x", 10, USED, True),
          MapKind("overhead", "headers", "#7f7f7f", "h", 90),
          MapKind("unwalked", "not walked (damage)", "#000000", "!", 100, DAMAGE),
          MapKind("unused", "mapped, unused", "#dbdbdb", ":", 110),
          MapKind("reserved", "reserved, never mapped", "#f5f5f5", ".", 120))
for _kind in SHARED:
    add_map_kind(_kind)
