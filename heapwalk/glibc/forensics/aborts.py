"""Which chunk made glibc's malloc abort: each abort message's check, tested on the chunks a crash core offers.

When one of malloc's consistency checks fails, glibc prints a message ("double free or corruption (!prev)")
and aborts.  Each message belongs to one check, which tested one condition on one chunk: the chunk being
freed or reallocated (a pointer the crashing thread still holds, in a register or on its stack), or the chunk
at the end of a list malloc was taking from (the unsorted bin, a small bin, a fastbin, top).  `explain` finds
the check from the message (the wording of glibc 2.29 to 2.43, and older where it differed), evaluates the
check's condition on every candidate, and names the chunks that fail it, with the evidence.  Candidates that
pass it are not chunks glibc can have been looking at, so they are not named.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from heapwalk.glibc.forensics.chunkinfo import locate, where_listed
from heapwalk.glibc.locate.layout import IS_MMAPPED, MINSIZE, PREV_INUSE, SIZE_BITS, Layout
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.glibc.model import Arena, BinKind, HeapState
from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind

__all__ = ["Candidate", "AbortCheck", "CHECKS", "check_for", "explain"]

_PAGE = 4096
_MAX_FAST = 0x80  # the largest fastbin chunk size glibc uses by default (64-bit)


@dataclass(frozen=True)
class Candidate:
    """A pointer the crashing thread holds, and where it was seen ("register rbx of thread 1")."""

    pointer: int
    source: str


class _Context:
    """What the checks read: memory, the decoded heap, and each arena's extent."""

    def __init__(self, mem: Memory, state: HeapState, layout: Layout):
        self.mem, self.state, self.layout = mem, state, layout

    def word(self, address: int) -> int | None:
        try:
            return u64(self.mem, address)
        except ReadError:
            return None

    def size(self, chunk: int) -> int | None:
        raw = self.word(chunk + 8)
        return None if raw is None else raw & ~SIZE_BITS

    def arena_of(self, chunk: int) -> Arena | None:
        """The arena whose heap holds CHUNK."""
        for arena in self.state.arenas:
            if any(h.address <= chunk < h.address + h.size for h in arena.heaps):
                return arena
        return None

    def describe(self, chunk: int) -> str:
        size = self.size(chunk)
        where = where_listed(self.state, chunk)
        return f"size {size:#x}, " + (f"free, in the {where}" if where else "in no free list") \
            if size is not None else "unreadable"


#: a check's test: (context, candidate) -> (chunk, evidence) when the candidate fails the check
_Test = Callable[[_Context, int], "tuple[int, str] | None"]


@dataclass(frozen=True)
class AbortCheck:
    """One check of malloc that aborts: its messages, what it tested, and the test.

    SUBJECTS say where its candidates come from, in order: "pointer" (a user pointer the crashing thread
    holds: the one given to free or realloc), "chunk" (a chunk pointer it holds: a chunk glibc was working
    on), or list ends read from every arena ("top", "unsorted_last", "unsorted_first", "small_last",
    "fastbin", "binned").  TEST takes a user pointer (a chunk's address + 16).
    """

    name: str
    messages: tuple[str, ...]
    tested: str
    subjects: tuple[str, ...]
    test: _Test


def _in_heap(ctx: _Context, pointer: int) -> int | None:
    """POINTER's chunk when POINTER is a 16-aligned user pointer inside an arena's heap."""
    chunk = pointer - 16
    return chunk if pointer % 16 == 0 and ctx.arena_of(chunk) is not None else None


def _tcache_double_free(ctx: _Context, pointer: int):
    chunk = _in_heap(ctx, pointer)
    if chunk is None:
        return None
    for owner, tcache in ctx.state.tcaches():
        for b in tcache.bins:
            if pointer in b.entries:
                return chunk, f"it is already in tcache bin {b.index} of {owner}"
    return None


def _fasttop(ctx: _Context, pointer: int):
    chunk = _in_heap(ctx, pointer)
    if chunk is None:
        return None
    for arena in ctx.state.arenas:
        for fb in arena.fastbins:
            if fb.chunks and fb.chunks[0] == chunk:
                return chunk, f"it is already the first chunk of fastbin {fb.index} of arena {arena.number}"
    return None


def _not_prev(ctx: _Context, pointer: int):
    chunk = _in_heap(ctx, pointer)
    size = ctx.size(chunk) if chunk is not None else None
    if not size or size % 16:
        return None
    following = ctx.word(chunk + size + 8)
    if following is None or following & PREV_INUSE:
        return None
    return chunk, f"the next chunk {chunk + size:#x} has PREV_INUSE clear: the chunk is already free"


def _out(ctx: _Context, pointer: int):
    chunk = _in_heap(ctx, pointer)
    size = ctx.size(chunk) if chunk is not None else None
    arena = ctx.arena_of(chunk) if chunk is not None else None
    top_size = ctx.size(arena.top) if arena is not None and arena.top else None
    if not size or top_size is None:
        return None
    end = arena.top + top_size
    if chunk < end <= chunk + size:
        return chunk, (f"its size {size:#x} reaches {chunk + size:#x}, past the end of arena {arena.number}'s top "
                       f"at {end:#x}")
    return None


def _invalid_pointer(ctx: _Context, pointer: int):
    if pointer % 16 == 0 or ctx.arena_of(pointer) is None:
        return None
    located = locate(ctx.mem, ctx.layout, ctx.state, pointer)
    if located is None:
        return None
    holder = located.chunk.address
    return holder, (f"the misaligned pointer {pointer:#x} lies {pointer - holder:#x} bytes into this chunk, "
                    f"whose own pointer is {holder + 16:#x}")


def _invalid_size(ctx: _Context, pointer: int):
    chunk = _in_heap(ctx, pointer)
    raw = ctx.word(chunk + 8) if chunk is not None else None
    if raw is None:
        return None
    size = raw & ~SIZE_BITS
    if size >= MINSIZE and size % 16 == 0:
        return None
    why = f"under the minimum of {MINSIZE:#x}" if size < MINSIZE else "not a multiple of 16"
    return chunk, f"its size field {raw:#x} gives a size of {size:#x}, {why}"


def _munmap(ctx: _Context, pointer: int):
    chunk = pointer - 16
    if pointer % 16 or not (ctx.arena_of(chunk) or any(c.address == chunk for c in ctx.state.mmapped)):
        return None
    prev, raw = ctx.word(chunk), ctx.word(chunk + 8)
    if prev is None or raw is None or not raw & IS_MMAPPED:
        return None
    span = ctx.layout.mmapped_span(prev, raw & ~SIZE_BITS)
    if not ((chunk - prev) | span) & (_PAGE - 1):
        return None
    start = (chunk - prev) & (2**64 - 1)
    return chunk, (f"its size field {raw:#x} says mmapped, but with its prev_size {prev:#x} its mapping would "
                   f"start at {start:#x} and span {span & (2**64 - 1):#x} bytes, which are not whole pages")


def _top_size(ctx: _Context, pointer: int):
    chunk = pointer - 16
    arena = ctx.arena_of(chunk)
    size = ctx.size(chunk)
    if arena is None or size is None or size <= arena.system_mem:
        return None
    return chunk, f"top's size {size:#x} is more than arena {arena.number}'s system_mem {arena.system_mem:#x}"


def _size_vs_prev_size(ctx: _Context, pointer: int):
    chunk = _in_heap(ctx, pointer)
    if chunk is None:
        return None
    size = ctx.size(chunk)
    if not size or size % 16:
        return None
    prev_size = ctx.word(chunk + size)
    if prev_size is None or prev_size == size:
        return None
    return chunk, f"its size is {size:#x}, but the next chunk {chunk + size:#x} has prev_size {prev_size:#x}"


def _links(ctx: _Context, chunk: int) -> tuple[int | None, int | None]:
    return ctx.word(chunk + 16), ctx.word(chunk + 24)


def _unsorted_head(ctx: _Context, chunk: int) -> int | None:
    """The unsorted bin's head of the arena whose heap holds CHUNK."""
    arena = ctx.arena_of(chunk)
    return None if arena is None else ctx.layout.bin_header(arena.address, 1)


def _unsorted_last(ctx: _Context, pointer: int):
    chunk = pointer - 16
    head = _unsorted_head(ctx, chunk)
    if head is None:
        return None
    fd, bk = _links(ctx, chunk)
    if fd != head:
        return chunk, f"its fd is {fd:#x}, not the unsorted bin's head {head:#x}, though it is the bin's last chunk"
    back = ctx.word(bk + 16) if bk is not None else None
    if back != chunk:
        return chunk, f"its bk {bk:#x} points at a chunk whose fd is {back:#x}, not back at it"
    return None


def _unsorted_first(ctx: _Context, pointer: int):
    chunk = pointer - 16
    head = _unsorted_head(ctx, chunk)
    _, bk = _links(ctx, chunk)
    if head is None or bk == head:
        return None
    return chunk, f"it is the unsorted bin's first chunk, but its bk is {bk:#x}, not the bin's head {head:#x}"


def _small_last(ctx: _Context, pointer: int):
    chunk = pointer - 16
    _, bk = _links(ctx, chunk)
    back = ctx.word(bk + 16) if bk is not None else None
    if back == chunk:
        return None
    return chunk, f"it is its small bin's last chunk, and its bk {bk:#x} points at a chunk whose fd is " \
                  f"{back if back is None else hex(back)}, not back at it"


def _fastbin_size(ctx: _Context, pointer: int):
    chunk = _in_heap(ctx, pointer)
    size = ctx.size(chunk) if chunk is not None else None
    if size is None or not MINSIZE <= size <= _MAX_FAST:
        return None
    index = (size - MINSIZE) // 16
    for arena in ctx.state.arenas:
        for fb in arena.fastbins:
            if chunk in fb.chunks:
                if index == fb.index:
                    return None
                return chunk, f"its size {size:#x} belongs in fastbin {index}, but it is in fastbin {fb.index} " \
                              f"of arena {arena.number}"
    # malloc_consolidate empties a fastbin before it checks the chunks it took: a chunk it held is in no list,
    # and a size rewritten after the chunk was freed leads to no chunk
    following = ctx.word(chunk + size + 8)
    if following is None or (following & ~SIZE_BITS) >= MINSIZE and (following & ~SIZE_BITS) % 16 == 0 and \
            (following & ~SIZE_BITS) < 1 << 40:
        return None
    return chunk, (f"its size {size:#x} (fastbin {index}) leads to {chunk + size:#x}, where no chunk starts (a size "
                   f"field of {following:#x}): its size was rewritten after it was freed into another fastbin")


def _realloc_next_size(ctx: _Context, pointer: int):
    chunk = _in_heap(ctx, pointer)
    size = ctx.size(chunk) if chunk is not None else None
    arena = ctx.arena_of(chunk) if chunk is not None else None
    if not size or size % 16 or arena is None:
        return None
    raw = ctx.word(chunk + size + 8)
    if raw is None or 16 < raw < arena.system_mem:
        return None
    return chunk, f"the next chunk {chunk + size:#x} has a size field of {raw:#x}, which no chunk can have"


CHECKS = (
    AbortCheck("tcache double free", ("free(): double free detected in tcache 2",),
               "free() found the chunk's key word set to the tcache key and the chunk in its tcache bin", ("pointer",),
               _tcache_double_free),
    AbortCheck("fastbin double free", ("double free or corruption (fasttop)",),
               "free() found the chunk already at the top of its fastbin", ("pointer",), _fasttop),
    AbortCheck("double free", ("double free or corruption (!prev)",),
               "free() found the next chunk's PREV_INUSE bit clear, so the chunk was already free", ("pointer",),
               _not_prev),
    AbortCheck("size past top", ("double free or corruption (out)",),
               "free() found that the chunk's size takes it past the end of its arena's top", ("pointer",), _out),
    AbortCheck("invalid pointer", ("free(): invalid pointer",),
               "free() found the pointer misaligned (or its size wrapping the address space)", ("pointer",),
               _invalid_pointer),
    AbortCheck("invalid size", ("free(): invalid size",),
               "free() found a chunk size under the minimum or not a multiple of 16", ("pointer",), _invalid_size),
    AbortCheck("invalid mmapped chunk", ("munmap_chunk(): invalid pointer",),
               "free() found IS_MMAPPED set, but the mapping the chunk's header describes is not whole pages",
               ("pointer",), _munmap),
    AbortCheck("top size", ("malloc(): corrupted top size",),
               "malloc() found top's size larger than its arena's system_mem", ("top",), _top_size),
    AbortCheck("size vs. prev_size", ("corrupted size vs. prev_size", "corrupted size vs. prev_size while "
                                      "consolidating"),
               "unlinking a free chunk, glibc found its size different from the next chunk's prev_size", ("binned", "chunk"),
               _size_vs_prev_size),
    AbortCheck("unsorted list", ("malloc(): unsorted double linked list corrupted",
                                 "malloc(): corrupted unsorted chunks"),
               "malloc() found the unsorted bin's last chunk not linked back to its neighbours", ("unsorted_last",),
               _unsorted_last),
    AbortCheck("small bin list", ("malloc(): smallbin double linked list corrupted",),
               "malloc() found a small bin's last chunk's bk pointing at a chunk whose fd is not it", ("small_last",),
               _small_last),
    AbortCheck("unsorted first", ("free(): corrupted unsorted chunks",),
               "free() found the unsorted bin's first chunk's bk not pointing back at the bin", ("unsorted_first",),
               _unsorted_first),
    AbortCheck("fastbin chunk size", ("malloc_consolidate(): invalid chunk size",),
               "malloc_consolidate() found a fastbin chunk whose size belongs to another fastbin", ("fastbin", "chunk"),
               _fastbin_size),
    AbortCheck("realloc next size", ("realloc(): invalid next size",),
               "realloc() found the next chunk's size impossible (at most 16, or at least system_mem)", ("pointer",),
               _realloc_next_size),
)


def check_for(message: str) -> AbortCheck | None:
    """The check whose abort message MESSAGE is (glibc may add a newline or the program's name)."""
    text = message.strip()
    for check in CHECKS:
        if any(text == m or text.endswith(": " + m) for m in check.messages):
            return check
    return None


def _subjects(ctx: _Context, subject: str) -> Iterator[int]:
    """Chunk addresses at the list ends a check of SUBJECT looks at, in every arena."""
    layout = ctx.layout
    for arena in ctx.state.arenas:
        if subject == "top" and arena.top:
            yield arena.top
        elif subject in ("unsorted_last", "unsorted_first"):
            head = layout.bin_header(arena.address, 1)
            end = ctx.word(head + (24 if subject == "unsorted_last" else 16))
            if end is not None and end != head:
                yield end
        elif subject == "small_last":
            for b in arena.bins:
                if b.kind is BinKind.SMALL:
                    head = layout.bin_header(arena.address, b.index)
                    last = ctx.word(head + 24)
                    if last is not None and last != head:
                        yield last
        elif subject == "fastbin":
            for fb in arena.fastbins:
                yield from fb.chunks
        elif subject == "binned":
            for lst in [arena.unsorted, *arena.bins]:
                yield from lst.chunks


def explain(mem: Memory, state: HeapState, layout: Layout, message: str,
            candidates: list[Candidate], limit: int = 3) -> list[Finding]:
    """Findings that name the chunks failing the check behind glibc's abort MESSAGE: an ERROR for the first
    (the crashing thread's nearest pointer, or the first arena's list end), a WARNING for each other, LIMIT
    in all; empty when the message is not one of malloc's checks or no candidate fails it."""
    check = check_for(message)
    if check is None:
        return []
    ctx = _Context(mem, state, layout)
    values = {c.pointer for c in candidates}
    tries: list[tuple[int, str]] = []
    for subject in check.subjects:
        if subject == "pointer":
            # free(mem) and realloc(mem) hold both mem and its chunk (mem - 16) while they check it: pointers
            # seen both ways come first, nearest first
            tries += sorted(((c.pointer, c.source) for c in candidates), key=lambda t: t[0] - 16 not in values)
        elif subject == "chunk":
            tries += [(c.pointer + 16, c.source) for c in candidates]
        else:
            tries += [(chunk + 16, "") for chunk in _subjects(ctx, subject)]
    out: list[Finding] = []
    named: set[int] = set()
    for value, source in tries:
        if len(out) >= limit:
            break
        try:
            failed = check.test(ctx, value)
        except (ReadError, struct.error):
            failed = None
        if failed is None or failed[0] in named:
            continue
        chunk, evidence = failed
        named.add(chunk)
        seen = f"; {source} points at it" if source else ""
        first = not out
        text = (f"glibc aborted the process: \"{message.strip()}\": {check.tested}. " if first else
                f"another chunk fails the same check as the abort (\"{message.strip()}\"): ")
        out.append(Finding(Severity.ERROR if first else Severity.WARNING, chunk, "glibc",
                           f"{text}Chunk {chunk:#x} ({ctx.describe(chunk)}) fails it: {evidence}{seen}",
                           Kind.ABORT, check.tested, evidence))
    return out
