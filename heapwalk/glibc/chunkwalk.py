"""Walking every chunk of every heap, and accounting for every byte of an arena.

The free lists say which chunks are free; the chunk walk visits every chunk
in address order (each header's size leads to the next) and gives each a
state: in use, in a tcache, in a fastbin, in the unsorted, a small or a large
bin, the top chunk, a thread's tcache struct, or a fencepost.  Free chunks in
regular bins are also visible physically (the next chunk's PREV_INUSE is
clear); one that is free but in no list is reported.

`account` adds it all up per arena: system_mem must equal the bytes of every
state plus the overhead (heap_info, the malloc_state of a thread arena,
alignment padding, fenceposts); what could not be walked is counted apart
and reported, so the identity is a real check.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from heapwalk.glibc.layout import IS_MMAPPED, MALLOC_ALIGNMENT, MINSIZE, NON_MAIN_ARENA, PREV_INUSE, SIZE_BITS, Layout
from heapwalk.target.memory import Memory, ReadError, ranges_without
from heapwalk.glibc.model import Arena, BinKind, HeapState
from heapwalk.findings import Finding, Kind, Severity

__all__ = ["ChunkState", "Chunk", "Extent", "Account", "list_states", "Listing", "extents",
           "walk_extent", "walk_batches", "account",
           "FREE_STATES", "MmappedChunk", "find_mmapped", "find_mmapped_in_pages", "main_regions", "resync"]

_WINDOW = 4 << 20      # bytes of a heap the walk reads at once
_PROBE_SPAN = 1 << 18  # ... and a resynchronisation or region probe, which looks at little


class ChunkState(enum.Enum):
    __hash__ = object.__hash__  # members are singletons: identity hashing, without a Python-level call per lookup

    IN_USE = "in_use"
    TCACHE = "tcache"
    FAST = "fast"
    UNSORTED = "unsorted"
    SMALL = "small"
    LARGE = "large"
    TOP = "top"
    TCACHE_STRUCT = "tcache_struct"
    FENCEPOST = "fencepost"
    FREE_UNLISTED = "free_unlisted"


#: states whose bytes are free memory held by malloc (top is counted apart)
FREE_STATES = (ChunkState.TCACHE, ChunkState.FAST, ChunkState.UNSORTED, ChunkState.SMALL, ChunkState.LARGE,
               ChunkState.FREE_UNLISTED)
_LIST_STATE = {BinKind.FAST: ChunkState.FAST, BinKind.UNSORTED: ChunkState.UNSORTED,
               BinKind.SMALL: ChunkState.SMALL, BinKind.LARGE: ChunkState.LARGE}


class Chunk(NamedTuple):
    """One chunk met by the walk: its address, size (flags masked), flag bits and state."""

    address: int
    size: int
    flags: int
    state: ChunkState
    extent: int                 # the heap (or main-arena region) it lies in


@dataclass(frozen=True, slots=True)
class Extent:
    """A stretch of one arena's memory that holds chunks: [start, end) of a heap, first chunk at FIRST."""

    start: int
    first: int
    end: int


@dataclass
class Account:
    """Where an arena's system_mem goes, by chunk state, in bytes and counts."""

    arena: int
    system_mem: int
    bytes: dict[ChunkState, int] = field(default_factory=lambda: dict.fromkeys(ChunkState, 0))
    counts: dict[ChunkState, int] = field(default_factory=lambda: dict.fromkeys(ChunkState, 0))
    overhead: int = 0           # heap_info, a thread arena's malloc_state, alignment, fenceposts' tails
    unwalked: int = 0           # bytes after damage the walk could not pass
    reached: int = 0            # the address the walk has reached (for progress reports)
    findings: list[Finding] = field(default_factory=list)

    @property
    def accounted(self) -> int:
        return sum(self.bytes.values()) + self.overhead + self.unwalked

    @property
    def balanced(self) -> bool:
        """The identity: system_mem = every state's bytes + overhead, with nothing left unwalked."""
        return self.accounted == self.system_mem and self.unwalked == 0

    @property
    def free(self) -> int:
        return sum(self.bytes[s] for s in FREE_STATES)


def list_states(state: HeapState) -> dict[int, ChunkState]:
    """Chunk address -> state for every chunk in a free list or tcache, and every tcache struct chunk
    (`Listing.of_state` as a dict: where two lists hold a chunk, the state the walk gives it)."""
    return Listing.of_state(state).as_dict()


#: the states of listed chunks, by the code a `Listing` key carries in its low four bits; where two lists hold
#: one chunk, the lowest code wins (a tcache over a bin, as glibc's own next malloc would see it)
_LISTED_STATES = (ChunkState.TCACHE_STRUCT, ChunkState.TCACHE, ChunkState.FAST, ChunkState.UNSORTED,
                  ChunkState.SMALL, ChunkState.LARGE)
_CODE = {st: code for code, st in enumerate(_LISTED_STATES)}
_ADDRESS = ~0xF


class Listing:
    """Every chunk in a free list or tcache, and every tcache struct chunk, sorted by address: what the chunk
    walk looks up as it goes.  Each is one int, address | code: chunk addresses are 16-aligned, so the low
    four bits carry the state (`_LISTED_STATES`).  Built with C-level loops; a few ints per chunk."""

    __slots__ = ("keys",)

    def __init__(self, keys: list[int]):
        self.keys = keys

    @classmethod
    def of_state(cls, state: HeapState) -> "Listing":
        parts = []
        for arena in state.arenas:
            for lst in arena.free_lists():
                parts.append(map(_CODE[_LIST_STATE[lst.kind]].__or__, lst.chunks))
        for _, tcache in state.tcaches():
            parts.append([tcache.address - 2 * 8 | _CODE[ChunkState.TCACHE_STRUCT]])
            for b in tcache.bins:
                parts.append([e - 2 * 8 | _CODE[ChunkState.TCACHE] for e in b.entries])
        return cls(sorted(itertools.chain.from_iterable(parts)))

    @classmethod
    def of_states(cls, states: dict[int, ChunkState]) -> "Listing":
        return cls(sorted(a | _CODE[st] for a, st in states.items()))

    def as_dict(self) -> dict[int, ChunkState]:
        """Address -> state; where two keys share an address, the first (the one the walk takes) wins."""
        return {k & _ADDRESS: _LISTED_STATES[k & 0xF] for k in reversed(self.keys)}

    def addresses(self) -> set[int]:
        return {k & _ADDRESS for k in self.keys}

    def get(self, address: int) -> ChunkState | None:
        """The state of the listed chunk at ADDRESS, or None."""
        i = bisect.bisect_left(self.keys, address)
        if i < len(self.keys) and self.keys[i] & _ADDRESS == address:
            return _LISTED_STATES[self.keys[i] & 0xF]
        return None

    def first_after(self, low: int, high: int) -> int | None:
        """The lowest listed address in (LOW, HIGH), or None."""
        i = bisect.bisect_left(self.keys, low + 16)
        if i < len(self.keys) and self.keys[i] & _ADDRESS < high:
            return self.keys[i] & _ADDRESS
        return None


def _align_chunk(address: int) -> int:
    """The first address at or after ADDRESS whose user memory (chunk + 16) is aligned."""
    return address + (-(address + 2 * 8)) % MALLOC_ALIGNMENT


def extents(arena: Arena, layout: Layout) -> list[Extent]:
    """The stretches of memory holding ARENA's chunks: each heap of a thread arena, the main arena's sbrk region."""
    if arena.is_main:  # the sbrk region, or each mmap'd piece of a non-contiguous main arena
        return [Extent(h.address, _align_chunk(h.address), h.address + h.size) for h in arena.heaps]
    out = []
    for heap in arena.heaps:
        header = layout.first_chunk_offset if heap.prev == 0 else layout.heap_info_size
        out.append(Extent(heap.address, _align_chunk(heap.address + header), heap.address + heap.size))
    return out


_BIN_STATES = frozenset((ChunkState.UNSORTED, ChunkState.SMALL, ChunkState.LARGE))
_HELD_STATES = frozenset((ChunkState.IN_USE, ChunkState.TCACHE, ChunkState.FAST, ChunkState.TCACHE_STRUCT))
_RESYNC_WINDOW = 1 << 16
_RESYNC_STEPS = 32


def _plausible(size_field: int, at: int, end: int) -> bool:
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
        if not _plausible(size_field, at, end) or main and size_field & NON_MAIN_ARENA:
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
    return _resume(_Window(mem, extent.end, _PROBE_SPAN).word, extent, bad, top, listing, main)


def _resume(word, extent: Extent, bad: int, top: int, listing: Listing, main: bool = False) -> int | None:
    """`resync` over the words WORD gives."""
    known = [a for a in (listing.first_after(bad, extent.end),) if a is not None]
    if bad < top < extent.end:
        known.append(top)
    target = min(known, default=None)
    limit = min(target if target is not None else extent.end, bad + _RESYNC_WINDOW)
    at = _align_chunk(bad + 1)
    while at < limit:
        if _chains(word, at, target if target is not None else extent.end, extent.end, main):
            return at
        at += MALLOC_ALIGNMENT
    return target


def walk_extent(mem: Memory, extent: Extent, top: int, listing: Listing, acc: Account,
                non_main: bool | None = None) -> Iterator[Chunk]:
    """Every chunk of EXTENT in address order, as `walk_batches` meets them (see there)."""
    for batch in walk_batches(mem, extent, top, listing, acc, non_main, every=True):
        for address, size, flags, state in batch:
            yield Chunk(address, size, flags, state, extent.start)


def walk_batches(mem: Memory, extent: Extent, top: int, listing: Listing, acc: Account,
                 non_main: bool | None = None, every: bool = False, lists_known: bool = True
                 ) -> Iterator[list[tuple[int, int, int, ChunkState]]]:
    """Walks every chunk of EXTENT in address order, adding each one's bytes and count to ACC under its
    state, with overhead, unwalked bytes and findings; yields the chunks met, a window at a time, as
    (address, size, flag bits, state): every chunk with EVERY, else all but the plain in-use ones.

    Checks as it goes what glibc relies on between neighbours: a free chunk
    in a bin is followed by a chunk whose PREV_INUSE is clear and whose
    prev_size is its size; a chunk held by the program (or a tcache or
    fastbin) is followed by one with PREV_INUSE set; with NON_MAIN set (True
    for a thread arena, False for main) a held chunk's NON_MAIN_ARENA flag
    matches.  A chunk of impossible size is reported and the walk resumes at
    `resync`'s answer, the bytes in between counted as unwalked.

    Two speeds: runs of in-use chunks whose headers are all as expected
    (PREV_INUSE set, the arena's NON_MAIN_ARENA bit, a sound size, no list
    holding them) go through a loop that only counts them; every other chunk,
    and the one after it, gets the full treatment.  An in-use chunk is counted
    when met and corrected if the next header says it is free.  LISTING holds
    the chunks the lists and tcaches hold; without LISTS_KNOWN (the arena is
    missing) a free chunk is no sign that a size before it went astray.  The
    heap is read a few MiB at a time and parsed as 8-byte words.
    """
    acc.overhead += extent.first - extent.start
    acc.reached = extent.first
    end = extent.end
    where = f"heap {extent.start:#x}"
    findings = acc.findings
    get = listing.get
    order = listing.keys
    at, listed = bisect.bisect_left(order, extent.first), len(order)
    nxt = order[at] & _ADDRESS if at < listed else _BEYOND
    tally_bytes: dict[ChunkState, int] = dict.fromkeys(ChunkState, 0)
    tally_counts: dict[ChunkState, int] = dict.fromkeys(ChunkState, 0)
    plain_count = plain_bytes = 0        # in-use chunks not in any list (corrected when found free)
    check_bit = non_main is not None
    want_bit = NON_MAIN_ARENA if non_main else 0
    mask = SIZE_BITS | 8 if check_bit else PREV_INUSE | 8   # header bits the fast loop compares
    plain_want = PREV_INUSE | want_bit                        # ... for an in-use chunk after an in-use one
    limit = top if extent.first <= top < end else end
    win = _Window(mem, end, _WINDOW)
    states, held_states, bin_states, size_mask = _LISTED_STATES, _HELD_STATES, _BIN_STATES, ~SIZE_BITS
    i_beyond = _BEYOND >> 3
    code_bytes, code_counts = [0] * len(states), [0] * len(states)   # the fast loop's tallies, by listing code
    out: list[tuple[int, int, int, ChunkState]] = []
    p_addr = p_size = 0                  # the chunk before c ...
    p_plain = False                      # ... in use and in no list (counted already)
    p_st: ChunkState | None = None       # ... or listed (top, a fencepost), its state
    anchor, anchor_st = extent.first, None  # the last chunk the walk met that the lists (or a resync) vouch for
    unlisted: list[int] = []             # the chunks counted free but in no list (damage: rare)
    first_finding = len(findings)
    flush_at = 4096                      # how many chunks met before they go to the caller
    c = extent.first
    try:
        while c < end:
            if not every and c + 8 >= win.base:
                # the fast loop: chunks whose headers are what their neighbours say, counted and passed;
                # it stops at anything else (and at the window's end), which the full treatment handles
                # it runs in word indices of the window: chunk c's size field is words[i], i = (c - shift) / 8,
                # and a size field shifted right by 3 is the chunk's length in words, its flag bits dropped
                words, shift = win.words, win.base - 8
                i = i0 = (c - shift) >> 3
                p, lp, n, listed_bytes = -1, -1, 0, 0
                if p_st in _BIN_STATES or p_st is ChunkState.FREE_UNLISTED:
                    pass  # the chunk after a free one: the full treatment checks its prev_size
                else:
                    i_limit = (limit - shift + 7) >> 3
                    i_end = (end - shift) >> 3
                    i_nxt = (nxt - shift) >> 3
                    append = out.append
                    bound = i_nxt if i_nxt < i_limit else i_limit  # where the next chunk is not plainly in use
                    try:
                        while True:
                            size_field = words[i]  # IndexError at the window's end
                            if i < bound:  # in use: PREV_INUSE set, its arena bit, a sound size
                                if size_field & mask != plain_want or size_field < MINSIZE:
                                    break
                                n += 1
                                p = i
                                i += size_field >> 3
                                continue
                            if i >= i_limit:
                                break
                            code = order[at] & 0xF
                            st = states[code]
                            if i != i_nxt or size_field & 9 != PREV_INUSE or size_field < MINSIZE \
                                    or i + (size_field >> 3) > i_end \
                                    or check_bit and st in held_states and size_field & NON_MAIN_ARENA != want_bit:
                                break
                            size = size_field & size_mask
                            code_bytes[code] += size
                            code_counts[code] += 1
                            append((shift + (i << 3), size, size_field & SIZE_BITS, st))
                            listed_bytes += size
                            lp = i
                            at += 1
                            i_nxt = ((order[at] & _ADDRESS) - shift) >> 3 if at < listed else i_beyond
                            bound = i_nxt if i_nxt < i_limit else i_limit
                            i += size_field >> 3
                            if st in bin_states:
                                # what follows a free chunk: PREV_INUSE clear, prev_size its size; and
                                # when it is in use, its own header as above
                                size_field = words[i]
                                if i >= i_limit or i >= i_nxt or size_field & mask != want_bit or \
                                        size_field < MINSIZE or words[i - 1] != size:
                                    break
                                n += 1
                                p = i
                                i += size_field >> 3
                    except IndexError:
                        pass
                if i != i0:
                    c0, c = c, shift + (i << 3)
                    nxt = order[at] & _ADDRESS if at < listed else _BEYOND
                    plain_count += n
                    plain_bytes += c - c0 - listed_bytes
                    if lp >= 0:
                        anchor, anchor_st = shift + (lp << 3), states[order[at - 1] & 0xF]
                    if p > lp:
                        p_addr, p_plain, p_st = shift + (p << 3), True, None
                    else:  # the last chunk met is the listed one at lp, and c is its end
                        p_addr, p_plain, p_st = anchor, False, anchor_st
                    p_size = c - p_addr
                    if c > end:  # the last one runs past the heap: undo it, and give it the full treatment
                        plain_count -= 1
                        plain_bytes -= c - p_addr
                        c, p_plain, p_st = p_addr, False, None
                if c >= end:
                    break
            skipped = False  # has the walk passed a chunk the lists hold without landing on it?
            while nxt < c:
                skipped = skipped or nxt != p_addr
                at += 1
                nxt = order[at] & _ADDRESS if at < listed else _BEYOND
            # the full treatment of the chunk at c
            try:
                size_field = win.word(c + 8)
            except ReadError:
                findings.append(Finding(Severity.ERROR, c, where, "the chunk header is not in the target's memory "
                                        "(a truncated core?); the rest of the heap is not walked", Kind.UNMAPPED))
                acc.unwalked += end - c
                break
            size = size_field & ~SIZE_BITS
            pinuse = size_field & PREV_INUSE
            # a zero size ends a heap that is no longer the newest (the fencepost sysmalloc leaves in the last
            # bytes of the old top); anywhere else it is damage, as is any size that is not a chunk's
            fencepost = size == 0 and c != top and end - c <= _FENCEPOST_ROOM and not extent.first <= top < end
            impossible = not fencepost and (size < 2 * 8 or size % MALLOC_ALIGNMENT or c + size > end)
            if (impossible and c != top or skipped or p_plain and not pinuse and lists_known
                    or p_st in _BIN_STATES and (pinuse or win.word(c) != p_size)):
                # the neighbours disagree: is it because a size before c sent the walk into a chunk's middle?
                fix = _overrun(_Window(mem, end, _PROBE_SPAN).word, listing, extent, top, anchor, anchor_st, c,
                               impossible, want_bit if check_bit else None)
                if fix is not None:
                    culprit, real, chain = fix
                    gone = dict(chain)  # what the detour counted as in use, once the rest is taken out
                    for a in [a for a in unlisted if culprit <= a < c]:
                        tally_bytes[ChunkState.FREE_UNLISTED] -= gone.pop(a)
                        tally_counts[ChunkState.FREE_UNLISTED] -= 1
                    if culprit == anchor and anchor_st is not None:
                        tally_bytes[anchor_st] -= gone.pop(anchor)
                        tally_counts[anchor_st] -= 1
                    plain_count -= len(gone)
                    plain_bytes -= sum(gone.values())
                    findings[first_finding:] = [f for f in findings[first_finding:]
                                                if not culprit <= f.address <= c]
                    out = [o for o in out if not culprit <= o[0] < c]
                    landed = culprit + chain[0][1]
                    findings.append(_overshoot(culprit, win.word(culprit + 8), real, landed, win.word(landed + 8),
                                               where))
                    acc.unwalked += real - culprit
                    anchor, anchor_st = real, None
                    c, p_plain, p_st = real, False, None
                    at = bisect.bisect_left(order, c)  # back before c: the listed chunks from there on
                    nxt = order[at] & _ADDRESS if at < listed else _BEYOND
                    continue
            if p_plain and not pinuse and not impossible:  # the chunk before is free, yet in no list
                plain_count -= 1
                plain_bytes -= p_size
                _unlisted(p_addr, p_size, _flags_at(win, p_addr), where, findings, out, every)
                tally_bytes[ChunkState.FREE_UNLISTED] += p_size
                tally_counts[ChunkState.FREE_UNLISTED] += 1
                unlisted.append(p_addr)
                p_plain, p_st = False, ChunkState.FREE_UNLISTED
            if fencepost:
                if p_plain and p_addr + p_size == c and p_size < MINSIZE + 16 and win.word(c) == p_size:
                    # the last piece of that heap's old top, too small to free: sysmalloc gave it a size, a
                    # foot and no NON_MAIN_ARENA bit; a fencepost, not a chunk the program holds
                    plain_count -= 1
                    plain_bytes -= p_size
                    tally_bytes[ChunkState.FENCEPOST] += p_size
                    tally_counts[ChunkState.FENCEPOST] += 1
                    if findings and findings[-1].kind is Kind.ARENA_BIT and findings[-1].address == p_addr:
                        findings.pop()
                    if every and out and out[-1][0] == p_addr:
                        out[-1] = (p_addr, p_size, out[-1][2], ChunkState.FENCEPOST)
                acc.overhead += end - c
                break
            if impossible:
                if c == top:
                    findings.append(Finding(Severity.ERROR, c, where, f"top's size {size_field:#x} runs past the "
                                            f"end of its heap {end:#x}", Kind.TOP_SIZE,
                                            f"at most {end - c:#x}", f"{size_field:#x}"))
                    acc.unwalked += end - c
                    break
                again = resync(mem, extent, c, top, listing, non_main is False)
                findings.append(Finding(Severity.ERROR, c, where, f"chunk size {size_field:#x} is impossible here "
                                        f"(the heap ends at {end:#x}); "
                                        + (f"the walk resumes at {again:#x}" if again else
                                           "the rest of the heap is not walked"), Kind.CHUNK_SIZE,
                                        f"a multiple of {MALLOC_ALIGNMENT} within the heap", f"{size_field:#x}"))
                acc.unwalked += (again or end) - c
                if again is None:
                    break
                c, p_plain, p_st = again, False, None
                anchor, anchor_st = again, None
                continue
            if p_st is not None:
                _check_after_listed(p_st, p_addr, p_size, pinuse, c, win, where, findings)
            flags = size_field & SIZE_BITS
            st = ChunkState.TOP if c == top else get(c)
            if st is None and size < MINSIZE:
                st = ChunkState.FENCEPOST
            if st is None:
                plain_count += 1
                plain_bytes += size
                if check_bit and (flags & NON_MAIN_ARENA) != want_bit:
                    findings.append(_arena_bit_finding(c, where, non_main))
                if every:
                    out.append((c, size, flags, ChunkState.IN_USE))
                p_plain, p_st = True, None
            else:
                anchor, anchor_st = c, st
                tally_bytes[st] += size
                tally_counts[st] += 1
                if check_bit and st in _HELD_STATES and (flags & NON_MAIN_ARENA) != want_bit:
                    findings.append(_arena_bit_finding(c, where, non_main))
                out.append((c, size, flags, st))
                p_plain, p_st = False, st
            p_addr, p_size = c, size
            c += size
            if st is ChunkState.TOP:
                if c != end:
                    findings.append(Finding(Severity.WARNING, c, where, f"top ends at {c:#x}, not at the heap's "
                                            f"end {end:#x}", Kind.TOP_SIZE))
                    acc.overhead += max(0, end - c)
                break
            if len(out) >= flush_at or c - acc.reached >= _WINDOW:
                acc.reached = c
                # what an overrun found later may take back stays: the chunks from the anchor, or near c
                keep, k = max(anchor, c - _OVERRUN_SPAN), len(out)
                while k and out[k - 1][0] >= keep:
                    k -= 1
                if k:
                    yield out[:k]
                    out = out[k:]
                flush_at = len(out) + 4096
        if out:
            yield out
    finally:
        tally_bytes[ChunkState.IN_USE] += plain_bytes
        tally_counts[ChunkState.IN_USE] += plain_count
        for code, st in enumerate(states):
            tally_bytes[st] += code_bytes[code]
            tally_counts[st] += code_counts[code]
        for st, n in tally_bytes.items():
            acc.bytes[st] += n
            acc.counts[st] += tally_counts[st]


_BEYOND = 1 << 65   # an address past every list: the walk's next listed chunk when none is left
#: how close to a heap's end the zero-size fencepost of an old top lies (glibc puts it 16 to 31 bytes before)
_FENCEPOST_ROOM = 2 * MINSIZE


def _overshoot(chunk: int, size_field: int, real: int, landed: int, landed_field: int, where: str) -> Finding:
    """The finding for a chunk whose size runs past the next chunk (REAL) to LANDED, where no chunk starts."""
    return Finding(Severity.ERROR, chunk, where, f"chunk size {size_field:#x} runs {landed - real:#x} bytes into the "
                   f"chunk at {real:#x}: where it leads ({landed:#x}) no chunk starts (size field "
                   f"{landed_field:#x}), while sound headers from {real:#x} on lead to chunks the lists hold; "
                   f"the walk resumes at {real:#x}", Kind.CHUNK_SIZE, f"{real - chunk:#x} (the next chunk's start)",
                   f"{size_field:#x}")


#: how far back from where the neighbours disagree the search for an overrunning size looks, and how many
#: header steps it may take in all
_OVERRUN_SPAN = 1 << 20
_OVERRUN_STEPS = 1 << 17
#: how many sound headers a chain must cross beyond an impossible size before it counts as the real path
_PAST_STEPS = 8
#: how many, when the chain meets other damage before the point where the walk resumes, from a chunk before the
#: one right before the impossible size
_PAST_MIN = 2


def _overrun(word, listing: Listing, extent: Extent, top: int, anchor: int, anchor_st: ChunkState | None,
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
    past = (c, _resume(word, extent, c, top, listing, arena_bit == 0) or _BEYOND) if dead_end else None
    for k, (b, size) in enumerate(path):
        if b < c - _OVERRUN_SPAN:
            continue
        target = listing.first_after(b, extent.end)
        if b < top < extent.end and (target is None or top < target):
            target = top
        freed = k == 0 and anchor_st in _BIN_STATES
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
            if target is None and size < MINSIZE and end - at <= _FENCEPOST_ROOM:
                return True
            if not _plausible(field, at, end) or arena_bit is not None and field & NON_MAIN_ARENA != arena_bit:
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


class _Window:
    """The words of [base, base + SPAN) of one heap (up to its END), read in one piece; moved on as the
    walk goes."""

    def __init__(self, mem: Memory, end: int, span: int):
        self.mem, self.end, self.span = mem, end, span
        self.base, self.words = 0, memoryview(b"").cast("Q")

    def word(self, address: int) -> int:
        """The 8-byte word at ADDRESS (8-aligned), reading a new window when it is not in this one."""
        i = (address - self.base) >> 3
        if not 0 <= i < len(self.words):
            data = _read_window(self.mem, address & ~7, self.end, self.span)
            if len(data) < 8:
                raise ReadError(address, 8)
            self.base, self.words = address & ~7, memoryview(data)[:len(data) // 8 * 8].cast("Q")
            i = 0
        return self.words[i]


def word_reader(mem: Memory, end: int):
    """A function giving the 8-byte word at an address below END, read in windows (ReadError where memory
    is missing): for scans that step through chunk headers."""
    return _Window(mem, end, _WINDOW).word


def _flags_at(win: "_Window", chunk: int) -> int:
    """The flag bits of the chunk at CHUNK, whose header the walk has read (0 if it is gone from memory)."""
    try:
        return win.word(chunk + 8) & SIZE_BITS
    except ReadError:
        return 0


def _read_window(mem: Memory, base: int, end: int, span: int) -> bytes | memoryview:
    """Up to SPAN bytes at BASE, fewer where the target's memory ends (b"" when nothing is readable)."""
    size = max(16, min(span, end - base))
    read = getattr(mem, "read_buffer", mem.read)
    while size >= 8:
        try:
            return read(base, size)
        except ReadError:
            size = size // 2 if size > 4096 else (8 if size > 8 else 0)
    return b""


def _unlisted(address: int, size: int, flags: int, where: str, findings: list, out: list, every: bool) -> None:
    """Reports the chunk at ADDRESS, counted as in use, as free but in no list, and re-emits it as such."""
    if findings and findings[-1].kind is Kind.ARENA_BIT and findings[-1].address == address:
        findings.pop()  # a free chunk's arena bit is not checked
    findings.append(Finding(Severity.ERROR, address, where, f"free chunk of {size:#x} bytes is in no list: the "
                            "next chunk's PREV_INUSE is clear", Kind.FREE_UNLISTED,
                            "PREV_INUSE set (or the chunk in a bin)", "PREV_INUSE clear"))
    if every and out and out[-1][0] == address:
        out[-1] = (address, size, out[-1][2], ChunkState.FREE_UNLISTED)
    else:
        out.append((address, size, flags, ChunkState.FREE_UNLISTED))


def _arena_bit_finding(address: int, where: str, non_main: bool | None) -> Finding:
    return Finding(Severity.ERROR, address, where, f"chunk {address:#x} has NON_MAIN_ARENA "
                   f"{'clear' if non_main else 'set'} in a {'thread' if non_main else 'main'} "
                   "arena: free() would give it to the wrong arena", Kind.ARENA_BIT,
                   "set" if non_main else "clear", "clear" if non_main else "set")


def _check_prev_size(prev_size: int, c: int, p_addr: int, p_size: int, where: str, findings: list) -> None:
    if prev_size != p_size:
        findings.append(Finding(Severity.ERROR, c, where, f"chunk size does not match next chunk's prev_size: the "
                                f"free chunk {p_addr:#x} has size {p_size:#x}, the prev_size of {c:#x} is "
                                f"{prev_size:#x}", Kind.PREV_SIZE, f"{p_size:#x}", f"{prev_size:#x}"))


def _check_after_listed(st: ChunkState, p_addr: int, p_size: int, pinuse: int, c: int, win: _Window,
                        where: str, findings: list) -> None:
    """The neighbour checks for a listed chunk (or a fencepost) followed by the chunk at C."""
    if st in _BIN_STATES and pinuse:
        findings.append(Finding(Severity.ERROR, p_addr, where, f"chunk {p_addr:#x} is in a {st.value} bin, but the "
                                f"next chunk {c:#x} has PREV_INUSE set", Kind.FREE_IN_USE, "PREV_INUSE clear",
                                "PREV_INUSE set"))
    elif st in (ChunkState.TCACHE, ChunkState.FAST) and not pinuse:
        findings.append(Finding(Severity.ERROR, p_addr, where, f"chunk {p_addr:#x} is in a {st.value} list, but the "
                                f"next chunk {c:#x} says it is free (PREV_INUSE clear): freed twice?",
                                Kind.DOUBLE_FREE, "PREV_INUSE set", "PREV_INUSE clear"))
    if not pinuse and st is not ChunkState.FENCEPOST:
        _check_prev_size(win.word(c), c, p_addr, p_size, where, findings)


def account(mem: Memory, layout: Layout, arena: Arena, listing: Listing, observer=None, progress=None) -> Account:
    """Walks every chunk of ARENA and sums bytes per state; the identity is `Account.balanced`.

    OBSERVER (e.g. `heapwalk.glibc.trim.TrimSimulation`) sees the same walk: its ``chunks(batch)`` gets the
    chunks that are not plainly in use, in address order, a batch at a time, and ``extent_done()`` is
    called at the end of each heap, so one walk serves both.  LISTING holds the chunks lists and tcaches hold.
    PROGRESS(bytes), when given, hears how far into the arena's memory the walk is, now and then.
    """
    acc = Account(arena.address, arena.system_mem)
    walked = 0
    for extent in extents(arena, layout):
        for batch in walk_batches(mem, extent, arena.top, listing, acc, not arena.is_main,
                                  lists_known=arena.lists_known):
            if observer is not None:
                observer.chunks(batch)
            if progress is not None:
                progress(walked + acc.reached - extent.start)
        walked += extent.end - extent.start
        if observer is not None:
            observer.extent_done()
    if not arena.lists_known:
        _unlisted_in_sum(acc, arena)
    if acc.accounted != acc.system_mem:
        acc.findings.append(Finding(Severity.ERROR, arena.address, f"arena {arena.number}",
                                    f"the walk accounts for {acc.accounted:#x} bytes, system_mem is "
                                    f"{acc.system_mem:#x}", Kind.ACCOUNTING, f"{acc.system_mem:#x}",
                                    f"{acc.accounted:#x}"))
    return acc


def _unlisted_in_sum(acc: Account, arena: Arena) -> None:
    """One finding, instead of one per chunk, for the free chunks of an arena whose lists are missing."""
    unlisted = [f for f in acc.findings if f.kind is Kind.FREE_UNLISTED]
    if not unlisted:
        return
    acc.findings[:] = [f for f in acc.findings if f.kind is not Kind.FREE_UNLISTED]
    acc.findings.append(Finding(
        Severity.INFO, arena.address, f"arena {arena.number}", f"{len(unlisted)} free chunk(s), "
        f"{acc.bytes[ChunkState.FREE_UNLISTED]:#x} bytes, are free by their neighbours' PREV_INUSE bits; the "
        "arena's lists are missing, so these are counted as free in no list (and chunks in tcache or "
        "fastbins, whose neighbours call them in use, as in use)", Kind.FREE_UNLISTED))


@dataclass(frozen=True, slots=True)
class MmappedChunk:
    """A chunk with a mapping of its own: its address, size field (masked), and the bytes of its mapping."""

    address: int
    size: int
    span: int


def find_mmapped(mem: Memory, layout: Layout, regions: list[tuple[int, int]], skip: list[tuple[int, int]],
                 limit: int = 1 << 20) -> list[MmappedChunk]:
    """Mmapped chunks at the start of anonymous memory regions (and packed after each other within one).

    A mapping made for one chunk starts with its header: prev_size 0 (the
    front padding, which only memalign'd chunks have) and a size with
    IS_MMAPPED set and NON_MAIN_ARENA clear, spanning whole pages that fit in
    the region; the kernel may merge neighbouring ones into one region, and
    merges one placed right below a thread heap with the heap's first pages.
    SKIP (heaps, libc) is cut out of the regions, and what is left of each is
    looked at; chunks with front padding are not found (the totals then
    disagree with mp_, which the caller reports).
    """
    out: list[MmappedChunk] = []
    for start, end in ranges_without(regions, skip):
        at = start
        while at < end and len(out) < limit:
            chunk = _mmapped_at(mem, layout, at, end)
            if chunk is None:
                break
            out.append(chunk)
            at += chunk.span
    return out


def _mmapped_at(mem: Memory, layout: Layout, at: int, end: int) -> MmappedChunk | None:
    """The mmapped chunk whose mapping starts at AT and ends by END, if AT holds such a header: prev_size 0,
    IS_MMAPPED set, NON_MAIN_ARENA clear, a mapping of whole pages."""
    try:
        prev_size, size_field = struct.unpack("<QQ", mem.read(at, 16))
    except ReadError:
        return None
    size = size_field & ~SIZE_BITS
    if prev_size or not size_field & IS_MMAPPED or size_field & NON_MAIN_ARENA or size < MINSIZE:
        return None
    span = layout.mmapped_span(0, size)
    return MmappedChunk(at, size, span) if span % 4096 == 0 and at + span <= end else None


def find_mmapped_in_pages(mem: Memory, layout: Layout, regions: list[tuple[int, int]],
                          skip: list[tuple[int, int]], budget: int = 1 << 30) -> list[MmappedChunk]:
    """Mmapped chunks anywhere in REGIONS (less SKIP), looked for at every page: for when `find_mmapped`
    finds fewer than mp_ counts, because the kernel merged a chunk's mapping with anonymous memory below
    it (a thread's stack, say), so that it no longer starts a region.  Reads at most BUDGET bytes of
    pages; the caller keeps what it finds only if the totals then agree with mp_."""
    out: list[MmappedChunk] = []
    for start, end in ranges_without(regions, skip):
        at = (start + 4095) & ~4095
        while at + 16 <= end and budget > 0:
            budget -= 4096
            chunk = _mmapped_at(mem, layout, at, end)
            if chunk is None:
                at += 4096
            else:
                out.append(chunk)
                at += chunk.span
    return out


def _probe_main_region(mem: Memory, start: int, end: int, top: int, top_size: int) -> int | None:
    """The end of a main-arena region that starts at START (an mmap'd piece of a non-contiguous main arena):
    where its chunks reach the end of top, or two fenceposts; None if START does not hold such chunks."""
    word = _Window(mem, end, _PROBE_SPAN).word
    c = _align_chunk(start)
    first, fenceposts = True, 0
    while c < end:
        try:
            size_field = word(c + 8)
        except ReadError:
            return None
        size = size_field & ~SIZE_BITS
        if size_field & (IS_MMAPPED | NON_MAIN_ARENA) or size < 2 * 8 or size % MALLOC_ALIGNMENT or c + size > end:
            return None
        if first and not size_field & PREV_INUSE:
            return None
        first = False
        if c == top:
            return c + size if size == top_size else None
        fenceposts = fenceposts + 1 if size < MINSIZE else 0
        c += size
        if fenceposts == 2:
            return c
    return None


def main_regions(mem: Memory, arena: Arena, regions: list[tuple[int, int]], skip: list[tuple[int, int]]
                 ) -> list[tuple[int, int]]:
    """The pieces [start, end) of a non-contiguous main arena (mmap'd when sbrk could not be used).

    Each piece ends at top or with two fenceposts; the kernel may have merged
    neighbouring pieces into one region, so a region is probed piece after piece
    (SKIP, the thread heaps and libc, cut out: a piece may merge with a heap).
    """
    out = []
    for start, end in ranges_without(sorted(regions), skip):
        at = start
        while at < end:
            piece_end = _probe_main_region(mem, at, end, arena.top, arena.top_size)
            if piece_end is None:
                break
            out.append((at, piece_end))
            at = (piece_end + 4095) & ~4095
    return out
