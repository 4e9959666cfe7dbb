"""The chunk walk's checks of a chunk against its neighbours (`chunkwalk`): a free chunk in no list, a chunk's
arena bit, the prev_size and PREV_INUSE a listed chunk's successor must show, and the fenceposts glibc leaves
where the program moved the break under it."""

from __future__ import annotations

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.locate.layout import PREV_INUSE, SIZE_BITS
from heapwalk.glibc.model import FREE_STATES, ChunkState
from heapwalk.glibc.walk.chunks import BIN_STATES
from heapwalk.inferior.memory import ReadError
from heapwalk.inferior.window import Window

__all__ = ["flags_at", "free_in_no_list", "arena_bit_finding", "check_prev_size", "after_foreign_sbrk",
           "check_after_listed", "inside_chunk"]


def flags_at(win: "Window", chunk: int) -> int:
    """The flag bits of the chunk at CHUNK, whose header the walk has read (0 if it is gone from memory)."""
    try:
        return win.word(chunk + 8) & SIZE_BITS
    except ReadError:
        return 0


def free_in_no_list(address: int, size: int, flags: int, where: str, findings: list, out: list, every: bool) -> None:
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


def arena_bit_finding(address: int, where: str, non_main: bool | None) -> Finding:
    return Finding(Severity.ERROR, address, where, f"chunk {address:#x} has NON_MAIN_ARENA "
                   f"{'clear' if non_main else 'set'} in a {'thread' if non_main else 'main'} "
                   "arena: free() would give it to the wrong arena", Kind.ARENA_BIT,
                   "set" if non_main else "clear", "clear" if non_main else "set")


def check_prev_size(prev_size: int, c: int, p_addr: int, p_size: int, where: str, findings: list) -> None:
    if prev_size != p_size:
        findings.append(Finding(Severity.ERROR, c, where, f"chunk size does not match next chunk's prev_size: the "
                                f"free chunk {p_addr:#x} has size {p_size:#x}, the prev_size of {c:#x} is "
                                f"{prev_size:#x}", Kind.PREV_SIZE, f"{p_size:#x}", f"{prev_size:#x}"))


def after_foreign_sbrk(win, c: int, non_main: bool | None) -> bool:
    """Whether C, in the main arena, follows the two fenceposts (16 bytes each, PREV_INUSE) sysmalloc puts at
    the end of the old top when the break moved under it (a foreign sbrk): the memory from C on is the
    program's, up to where malloc's next piece starts."""
    if non_main:
        return False
    try:
        return win.word(c - 8) == 2 * 8 | PREV_INUSE and win.word(c - 24) == 2 * 8 | PREV_INUSE
    except ReadError:
        return False


def check_after_listed(st: ChunkState, p_addr: int, p_size: int, pinuse: int, c: int, win: Window,
                        where: str, findings: list) -> None:
    """The neighbour checks for a listed chunk (or a fencepost) followed by the chunk at C."""
    if st in BIN_STATES and pinuse:
        findings.append(Finding(Severity.ERROR, p_addr, where, f"chunk {p_addr:#x} is in a {st.value} bin, but the "
                                f"next chunk {c:#x} has PREV_INUSE set", Kind.FREE_IN_USE, "PREV_INUSE clear",
                                "PREV_INUSE set"))
    elif st in (ChunkState.TCACHE, ChunkState.FAST) and not pinuse:
        findings.append(Finding(Severity.ERROR, p_addr, where, f"chunk {p_addr:#x} is in a {st.value} list, but the "
                                f"next chunk {c:#x} says it is free (PREV_INUSE clear): freed twice?",
                                Kind.DOUBLE_FREE, "PREV_INUSE set", "PREV_INUSE clear"))
    if not pinuse and st is not ChunkState.FENCEPOST:
        check_prev_size(win.word(c), c, p_addr, p_size, where, findings)


def inside_chunk(chunk: int, state: ChunkState, outer: int, outer_size: int, where: str,
                 outer_state: ChunkState | None = None) -> Finding:
    """The error for a chunk a list holds (in STATE) that lies inside the chunk at OUTER the walk stepped over,
    no size before it lying, named at the entry (a tcache entry by its user pointer): a chunk forged in another's
    data and freed (how2heap's house of spirit), or, when OUTER is itself free (OUTER_STATE), the same memory
    freed twice."""
    named = chunk + 16 if state is ChunkState.TCACHE else chunk
    if outer_state in FREE_STATES:
        what = (f"the free chunk at {outer:#x} (size {outer_size:#x}, {outer_state.value}): the same memory is "
                "free twice (freed again after it was merged into its neighbour, or a size was forged)")
    else:
        what = (f"the chunk at {outer:#x} (size {outer_size:#x}), whose neighbours agree with its size: a chunk "
                "forged in another's data and freed (house of spirit)")
    return Finding(Severity.ERROR, named, where, f"free chunk {chunk:#x} ({state.value}) lies {chunk - outer:#x} "
                   f"bytes into {what}", Kind.INSIDE_CHUNK, f"outside {outer:#x}..{outer + outer_size:#x}",
                   f"{chunk:#x}")
