"""Where a broken chunk walk goes on, and which size broke it.

`resync` finds the next place after damage from which sound chunk headers lead to a chunk the lists know;
`overrun` asks whether a size before the break sent the walk into a chunk's middle, and which chunk's size
it was (the damaged field, not its victim).
"""

from __future__ import annotations

import bisect

import numpy as np

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.walk.chunks import BIN_STATES, Extent, Listing, align_chunk
from heapwalk.glibc.model import ChunkState
from heapwalk.glibc.locate.layout import IS_MMAPPED, MALLOC_ALIGNMENT, MINSIZE, NON_MAIN_ARENA, PREV_INUSE, SIZE_BITS
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.inferior.window import PROBE_SPAN, Window

__all__ = ["plausible", "resync", "resume_point", "BEYOND", "FENCEPOST_ROOM", "OVERRUN_SPAN", "overshoot_finding",
           "overrun", "Chain"]


_RESYNC_WINDOW = 1 << 16
_RESYNC_STEPS = 32


def plausible(size_field: int, at: int, end: int) -> bool:
    size = size_field & ~SIZE_BITS
    return size >= MINSIZE and not size % MALLOC_ALIGNMENT and at + size <= end and not size_field & IS_MMAPPED


def _chains(word, at: int, target: int, end: int, main: bool = False) -> bool:
    """Do the chunk headers from AT lead exactly to TARGET (or through _RESYNC_STEPS sound chunks)?  In a MAIN
    arena no header has NON_MAIN_ARENA set."""
    for _ in range(_RESYNC_STEPS):
        try:
            size_field = word(at + 8)
        except ReadError:
            return False
        if not plausible(size_field, at, end) or main and size_field & NON_MAIN_ARENA:
            return False
        at += size_field & ~SIZE_BITS
        if at == target:
            return True
        if at > target:
            return False
    return True


def resync(mem: Memory, extent: Extent, bad: int, top: int, listing: Listing, main: bool = False) -> int | None:
    """Where a heap walk broken at BAD can resume: the first place after it from which sound chunk headers
    (none with NON_MAIN_ARENA set in a MAIN arena) lead to a chunk known from the lists (or top), searched
    over the next 64 KiB; else that known chunk; None when nothing after BAD is known."""
    return resume_point(Window(mem, extent.end, PROBE_SPAN).word, extent, bad, top, listing, main)


def resume_point(word, extent: Extent, bad: int, top: int, listing: Listing, main: bool = False) -> int | None:
    """`resync` over the words WORD gives."""
    known = [a for a in (listing.first_after(bad, extent.end),) if a is not None]
    if bad < top < extent.end:
        known.append(top)
    target = min(known, default=None)
    limit = min(target if target is not None else extent.end, bad + _RESYNC_WINDOW)
    at = align_chunk(bad + 1)
    while at < limit:
        if _chains(word, at, target if target is not None else extent.end, extent.end, main):
            return at
        at += MALLOC_ALIGNMENT
    return target


BEYOND = 1 << 65   # an address past every list: the walk's next listed chunk when none is left
#: how close to a heap's end the zero-size fencepost of an old top lies (glibc puts it 16 to 31 bytes before)
FENCEPOST_ROOM = 2 * MINSIZE


def overshoot_finding(chunk: int, size_field: int, real: int, landed: int, landed_field: int, where: str) -> Finding:
    """The finding for a chunk whose size runs past the next chunk (REAL) to LANDED, where no chunk starts."""
    return Finding(Severity.ERROR, chunk, where, f"chunk size {size_field:#x} runs {landed - real:#x} bytes into the "
                   f"chunk at {real:#x}: where it leads ({landed:#x}) no chunk starts (size field "
                   f"{landed_field:#x}), while sound headers from {real:#x} on lead to chunks the lists hold; "
                   f"the walk resumes at {real:#x}", Kind.CHUNK_SIZE, f"{real - chunk:#x} (the next chunk's start)",
                   f"{size_field:#x}")


#: how far back from where the neighbours disagree the search for an overrunning size looks, and how many
#: header steps it may take in all
OVERRUN_SPAN = 1 << 20
_OVERRUN_STEPS = 1 << 17
#: how many sound headers a chain must cross beyond an impossible size before it counts as the real path
_PAST_STEPS = 8
#: how many, when the chain meets other damage before the point where the walk resumes, from a chunk before the
#: one right before the impossible size
_PAST_MIN = 2


class Chain:
    """The chunks from an anchor on, as their sizes lead, kept between the `overrun`s a walk asks from one
    anchor: each asks for the path to a later break, and the path is read once, not from the anchor each
    time."""

    def __init__(self):
        self.anchor: int | None = None
        self.steps: list[tuple[int, int]] = []   # (chunk, size) from the anchor on
        self.next = 0                              # where the last step leads
        self.dead = False                          # the header at NEXT is no chunk's, or the steps ran out

    def to(self, word, anchor: int, c: int) -> list[tuple[int, int]] | None:
        """The path [(chunk, size)] from ANCHOR along sizes to C, or None when sizes do not lead there (a size
        below MINSIZE, more than _OVERRUN_STEPS chunks, or a step over C); WORD reads the headers."""
        if anchor != self.anchor:
            self.anchor, self.steps, self.next, self.dead = anchor, [], anchor, False
        steps = self.steps
        while self.next < c and not self.dead:
            size = word(self.next + 8) & ~SIZE_BITS
            if size < MINSIZE or len(steps) >= _OVERRUN_STEPS:
                self.dead = True
                break
            steps.append((self.next, size))
            self.next += size
        i = bisect.bisect_left(steps, (c,))
        if i < len(steps):
            return steps[:i] if steps[i][0] == c else None
        return steps[:] if self.next == c else None


def overrun(word, listing: Listing, extent: Extent, top: int, anchor: int, anchor_st: ChunkState | None,
             c: int, dead_end: bool, arena_bit: int | None = None, many=None, chain: Chain | None = None
             ) -> tuple[int, int, list[tuple[int, int]]] | None:
    """Which chunk's size sent the walk astray before C, where the neighbours disagree.  The walk came from
    ANCHOR (a chunk the lists vouch for, of state ANCHOR_ST) along sizes to C.  The culprit is the first chunk
    on that path inside which a chunk starts whose headers lead, all in use as their PREV_INUSE bits say, to
    the next chunk the lists hold (or top, or the heap's end), or, when C's size is impossible (DEAD_END),
    past C: where the walk's own path cannot go.  ARENA_BIT (NON_MAIN_ARENA or 0; None: unchecked) is what
    every chunk in use on such a path carries.  MANY(address, count), when given, reads words in bulk (as
    `Window.many`), so that the places inside a chunk whose own header already rules them out are passed over
    without a look each.  CHAIN, kept by the walk, keeps the path from ANCHOR between calls.  Returns
    (culprit, where its real next chunk starts, the path [(chunk, size)] from the culprit to C), or None when
    no size before C explains the disagreement."""
    path = (chain if chain is not None else Chain()).to(word, anchor, c)
    if path is None:
        return None
    budget = [_OVERRUN_STEPS]
    # past an impossible size, a chain must land no further than where the walk would resume were that size the
    # damage: a header hidden in a chunk's data may leap over C onto sound chunks, but seldom onto the first one
    past = (c, resume_point(word, extent, c, top, listing, arena_bit == 0) or BEYOND) if dead_end else None
    for k in range(bisect.bisect_left(path, (c - OVERRUN_SPAN,)), len(path)):
        b, size = path[k]
        target = listing.first_after(b, extent.end)
        if b < top < extent.end and (target is None or top < target):
            target = top
        freed = k == 0 and anchor_st in BIN_STATES
        for r in _inside(many, b, size, freed):
            if _leads(word, b, r, freed, target, extent.end, budget, past and (*past, k < len(path) - 1),
                      arena_bit):
                return b, r, path[k:]
            if budget[0] <= 0:
                return None
    return None


def _inside(many, b: int, size: int, freed: bool):
    """The places inside the chunk at B of SIZE, in address order, where a real next chunk could start: with
    MANY, only those whose header agrees with the chunk at B (PREV_INUSE clear and prev_size right when it is
    FREED, else PREV_INUSE set), as `_leads` checks first; where the words cannot be read at once, and without
    MANY, every place."""
    # no chunk is smaller than MINSIZE: a header closer to B than that is inside B (a chunk forged there), and
    # B's own size is not the one that lies
    places = range(b + MINSIZE, b + size, MALLOC_ALIGNMENT)
    if many is None or not places:
        return places
    words = many(places[0], 2 * len(places))
    read = len(words) // 2
    prev_sizes, fields = words[0:2 * read:2], words[1:2 * read:2]
    if freed:
        steps = np.arange(read, dtype=np.uint64) * np.uint64(MALLOC_ALIGNMENT) + np.uint64(MINSIZE)
        agree = (fields & np.uint64(PREV_INUSE) == 0) & (prev_sizes == steps)
    else:
        agree = fields & np.uint64(PREV_INUSE) != 0
    return [places[i] for i in np.flatnonzero(agree).tolist()] + list(places[read:])


def _leads(word, prev: int, r: int, freed: bool, target: int | None, end: int, budget: list[int],
           past: tuple[int, int, bool] | None = None, arena_bit: int | None = None) -> bool:
    """Is R the real next chunk of PREV (free in a bin when FREED): R's header agrees with PREV, and sizes from
    R lead, through chunks in use, to TARGET (None: to the heap's end or its fencepost), or, when PAST is
    (C, LANDING, FAR), over C to no further than LANDING and on to LANDING, through _PAST_STEPS sound chunks,
    or to other damage before LANDING, through one sound chunk past the landing first (or _PAST_MIN when PREV
    is FAR: not the chunk right before C, whose data would have to leap over C from further back)?  Each
    chunk in use on the way carries ARENA_BIT, when it is given."""
    try:
        field = word(r + 8)
        if freed:
            if field & PREV_INUSE or word(r) != r - prev:
                return False
        elif not field & PREV_INUSE:
            return False
        if r == target:
            return True
        at, beyond = r, 0
        while budget[0] > 0:
            budget[0] -= 1
            size = field & ~SIZE_BITS
            if target is None and size < MINSIZE and end - at <= FENCEPOST_ROOM:
                return True
            if not plausible(field, at, end) or arena_bit is not None and field & NON_MAIN_ARENA != arena_bit:
                # past C, a chain may meet other damage the walk's resumption skips too
                return past is not None and at < past[1] and beyond > (_PAST_MIN if past[2] else 1)
            at += size
            if past is not None and at > past[0]:
                if at == past[1] or beyond > _PAST_STEPS:
                    return True
                if not beyond and at > past[1]:
                    return False
                beyond += 1
            if at == (target if target is not None else end):
                return target is None or bool(word(at + 8) & PREV_INUSE)
            if target is not None and at > target:
                return False
            field = word(at + 8)
            if not field & PREV_INUSE:
                return False
    except ReadError:
        return False
    return False
