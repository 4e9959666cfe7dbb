"""Where a broken chunk walk goes on, and which size broke it.

`resync` finds the next place after damage from which sound chunk headers lead to a chunk the lists know;
`overrun` asks whether a size before the break sent the walk into a chunk's middle, and which chunk's size
it was (the damaged field, not its victim).
"""

from __future__ import annotations

from heapwalk.findings import Finding, Kind, Severity
from heapwalk.glibc.chunks import BIN_STATES, Extent, Listing, align_chunk
from heapwalk.glibc.model import ChunkState
from heapwalk.glibc.layout import IS_MMAPPED, MALLOC_ALIGNMENT, MINSIZE, NON_MAIN_ARENA, PREV_INUSE, SIZE_BITS
from heapwalk.target.memory import Memory, ReadError
from heapwalk.target.words import PROBE_SPAN, Window

__all__ = ["plausible", "resync", "resume_point", "BEYOND", "FENCEPOST_ROOM", "OVERRUN_SPAN", "overshoot_finding",
           "overrun"]


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


def overrun(word, listing: Listing, extent: Extent, top: int, anchor: int, anchor_st: ChunkState | None,
             c: int, dead_end: bool, arena_bit: int | None = None
             ) -> tuple[int, int, list[tuple[int, int]]] | None:
    """Which chunk's size sent the walk astray before C, where the neighbours disagree.  The walk came from
    ANCHOR (a chunk the lists vouch for, of state ANCHOR_ST) along sizes to C.  The culprit is the first chunk
    on that path inside which a chunk starts whose headers lead, all in use as their PREV_INUSE bits say, to
    the next chunk the lists hold (or top, or the heap's end), or, when C's size is impossible (DEAD_END),
    past C: where the walk's own path cannot go.  ARENA_BIT (NON_MAIN_ARENA or 0; None: unchecked) is what
    every chunk in use on such a path carries.  Returns (culprit, where its real next chunk starts, the path
    [(chunk, size)] from the culprit to C), or None when no size before C explains the disagreement."""
    path, b = [], anchor
    while b < c:
        size = word(b + 8) & ~SIZE_BITS
        if size < MINSIZE or len(path) >= _OVERRUN_STEPS:
            return None
        path.append((b, size))
        b += size
    if b != c:
        return None
    budget = [_OVERRUN_STEPS]
    # past an impossible size, a chain must land no further than where the walk would resume were that size the
    # damage: a header hidden in a chunk's data may leap over C onto sound chunks, but seldom onto the first one
    past = (c, resume_point(word, extent, c, top, listing, arena_bit == 0) or BEYOND) if dead_end else None
    for k, (b, size) in enumerate(path):
        if b < c - OVERRUN_SPAN:
            continue
        target = listing.first_after(b, extent.end)
        if b < top < extent.end and (target is None or top < target):
            target = top
        freed = k == 0 and anchor_st in BIN_STATES
        for r in range(b + MALLOC_ALIGNMENT, b + size, MALLOC_ALIGNMENT):
            if _leads(word, b, r, freed, target, extent.end, budget, past and (*past, k < len(path) - 1),
                      arena_bit):
                return b, r, path[k:]
            if budget[0] <= 0:
                return None
    return None


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
