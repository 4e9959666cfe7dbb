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
from collections.abc import Iterator

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.walk.chunks import (ADDRESS_MASK, BIN_STATES, HELD_STATES, LISTED_STATES, Chunk, Extent, Listing,
                                   Tally, extents)
from heapwalk.glibc.model import Account, Arena, ChunkState
from heapwalk.glibc.locate.layout import MALLOC_ALIGNMENT, MINSIZE, NON_MAIN_ARENA, PREV_INUSE, SIZE_BITS, Layout
from heapwalk.glibc.walk.neighbours import (after_foreign_sbrk, arena_bit_finding, check_after_listed,
                                            flags_at, free_in_no_list, inside_chunk)
from heapwalk.glibc.walk.resync import BEYOND, FENCEPOST_ROOM, OVERRUN_SPAN, Chain, overrun, overshoot_finding, resync
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.inferior.window import PROBE_SPAN, Window

__all__ = ["walk_extent", "walk_batches", "account"]

_WINDOW = 4 << 20      # bytes of a heap the walk reads at once


def walk_extent(mem: Memory, extent: Extent, top: int, listing: Listing, acc: Tally,
                non_main: bool | None = None) -> Iterator[Chunk]:
    """Every chunk of EXTENT in address order, as `walk_batches` meets them (see there)."""
    for batch in walk_batches(mem, extent, top, listing, acc, non_main, every=True):
        for address, size, flags, state in batch:
            yield Chunk(address, size, flags, state, extent.start)


def walk_batches(mem: Memory, extent: Extent, top: int, listing: Listing, acc: Tally,
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
    nxt = order[at] & ADDRESS_MASK if at < listed else BEYOND
    tally_bytes: dict[ChunkState, int] = dict.fromkeys(ChunkState, 0)
    tally_counts: dict[ChunkState, int] = dict.fromkeys(ChunkState, 0)
    plain_count = plain_bytes = 0        # in-use chunks not in any list (corrected when found free)
    check_bit = non_main is not None
    want_bit = NON_MAIN_ARENA if non_main else 0
    mask = SIZE_BITS | 8 if check_bit else PREV_INUSE | 8   # header bits the fast loop compares
    plain_want = PREV_INUSE | want_bit                        # ... for an in-use chunk after an in-use one
    limit = top if extent.first <= top < end else end
    win = Window(mem, end, _WINDOW)
    states, held_states, bin_states, size_mask = LISTED_STATES, HELD_STATES, BIN_STATES, ~SIZE_BITS
    i_beyond = BEYOND >> 3
    code_bytes, code_counts = [0] * len(states), [0] * len(states)   # the fast loop's tallies, by listing code
    out: list[tuple[int, int, int, ChunkState]] = []
    p_addr = p_size = 0                  # the chunk before c ...
    p_plain = False                      # ... in use and in no list (counted already)
    p_st: ChunkState | None = None       # ... or listed (top, a fencepost), its state
    anchor, anchor_st = extent.first, None  # the last chunk the walk met that the lists (or a resync) vouch for
    anchor_path = Chain()                # the path from the anchor, as overrun reads it
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
                if p_st in BIN_STATES or p_st is ChunkState.FREE_UNLISTED:
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
                            i_nxt = ((order[at] & ADDRESS_MASK) - shift) >> 3 if at < listed else i_beyond
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
                    nxt = order[at] & ADDRESS_MASK if at < listed else BEYOND
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
            passed = []  # the chunks the lists hold that the walk passed without landing on them
            while nxt < c:
                if nxt != p_addr:
                    passed.append((nxt, states[order[at] & 0xF]))
                at += 1
                nxt = order[at] & ADDRESS_MASK if at < listed else BEYOND
            skipped = bool(passed)
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
            fencepost = size == 0 and c != top and end - c <= FENCEPOST_ROOM and not extent.first <= top < end
            impossible = not fencepost and (size < 2 * 8 or size % MALLOC_ALIGNMENT or c + size > end)
            if (impossible and c != top or skipped or p_plain and not pinuse and lists_known
                    or p_st in BIN_STATES and (pinuse or win.word(c) != p_size)):
                # the neighbours disagree: is it because a size before c sent the walk into a chunk's middle?
                probe = Window(mem, end, PROBE_SPAN)
                fix = overrun(probe.word, listing, extent, top, anchor, anchor_st, c, impossible,
                              want_bit if check_bit else None, probe.many, anchor_path)
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
                    findings.append(overshoot_finding(culprit, win.word(culprit + 8), real, landed, win.word(landed + 8),
                                               where))
                    acc.unwalked += real - culprit
                    anchor, anchor_st = real, None
                    c, p_plain, p_st = real, False, None
                    at = bisect.bisect_left(order, c)  # back before c: the listed chunks from there on
                    nxt = order[at] & ADDRESS_MASK if at < listed else BEYOND
                    continue
            # no size before c lies: each listed chunk passed lies inside the chunk the walk stepped over
            findings += [inside_chunk(a, a_st, p_addr, p_size, where, p_st) for a, a_st in passed]
            if p_plain and not pinuse and not impossible:  # the chunk before is free, yet in no list
                plain_count -= 1
                plain_bytes -= p_size
                free_in_no_list(p_addr, p_size, flags_at(win, p_addr), where, findings, out, every)
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
                if again is not None and after_foreign_sbrk(win, c, non_main):
                    # the program moved the break itself: glibc closed the old top with two fenceposts, counted
                    # the foreign bytes in system_mem and went on after them; neither malloc's nor damage
                    if p_plain and p_size == 2 * 8:
                        plain_count, plain_bytes = plain_count - 2, plain_bytes - 4 * 8
                        tally_bytes[ChunkState.FENCEPOST] += 4 * 8
                        tally_counts[ChunkState.FENCEPOST] += 2
                    acc.overhead += again - c
                    c, p_plain, p_st = again, False, None
                    anchor, anchor_st = again, None
                    continue
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
                check_after_listed(p_st, p_addr, p_size, pinuse, c, win, where, findings)
            flags = size_field & SIZE_BITS
            st = ChunkState.TOP if c == top else get(c)
            if st is None and size < MINSIZE:
                st = ChunkState.FENCEPOST
            if st is None:
                plain_count += 1
                plain_bytes += size
                if check_bit and (flags & NON_MAIN_ARENA) != want_bit:
                    findings.append(arena_bit_finding(c, where, non_main))
                if every:
                    out.append((c, size, flags, ChunkState.IN_USE))
                p_plain, p_st = True, None
            else:
                anchor, anchor_st = c, st
                tally_bytes[st] += size
                tally_counts[st] += 1
                if check_bit and st in HELD_STATES and (flags & NON_MAIN_ARENA) != want_bit:
                    findings.append(arena_bit_finding(c, where, non_main))
                out.append((c, size, flags, st))
                p_plain, p_st = False, st
            p_addr, p_size = c, size
            c += size
            if st is ChunkState.TOP:
                if c != end:    # glibc grows and trims a heap with its top: top always ends where it does
                    findings.append(Finding(Severity.ERROR, p_addr, where, f"top's size {size_field:#x} ends it at "
                                            f"{c:#x}, short of its heap's end {end:#x}: the size was written over "
                                            f"(glibc would hand out memory past it)", Kind.TOP_SIZE,
                                            f"{end - p_addr:#x}", f"{size:#x}"))
                    acc.unwalked += max(0, end - c)
                break
            if len(out) >= flush_at or c - acc.reached >= _WINDOW:
                acc.reached = c
                # what an overrun found later may take back stays: the chunks from the anchor, or near c
                keep, k = max(anchor, c - OVERRUN_SPAN), len(out)
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


def account(mem: Memory, layout: Layout, arena: Arena, listing: Listing, observer=None, progress=None) -> Account:
    """Walks every chunk of ARENA and sums bytes per state; the identity is `Account.balanced`.

    OBSERVER (e.g. `heapwalk.glibc.walk.trim.TrimSimulation`) sees the same walk: its ``chunks(batch)`` gets the
    chunks that are not plainly in use, in address order, a batch at a time, and ``extent_done()`` is
    called at the end of each heap, so one walk serves both.  LISTING holds the chunks lists and tcaches hold.
    PROGRESS(bytes), when given, hears how far into the arena's memory the walk is, now and then.
    """
    acc = Tally(arena.address, arena.system_mem)
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
        acc.sum_unlisted(f"arena {arena.number}")
    if acc.accounted != acc.system_mem:
        acc.findings.append(Finding(Severity.ERROR, arena.address, f"arena {arena.number}",
                                    f"the walk accounts for {acc.accounted:#x} bytes, system_mem is "
                                    f"{acc.system_mem:#x}", Kind.ACCOUNTING, f"{acc.system_mem:#x}",
                                    f"{acc.accounted:#x}"))
    return acc.account()
