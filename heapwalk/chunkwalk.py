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

import enum
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from .layout import IS_MMAPPED, MALLOC_ALIGNMENT, MINSIZE, NON_MAIN_ARENA, PREV_INUSE, SIZE_BITS, Layout
from .memory import Memory, ReadError
from .model import Arena, BinKind, Finding, HeapState, Severity

__all__ = ["ChunkState", "Chunk", "Extent", "Account", "list_states", "extents", "walk_extent", "account",
           "FREE_STATES", "MmappedChunk", "find_mmapped", "main_regions"]

_WINDOW = 1 << 18


class ChunkState(enum.Enum):
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


@dataclass(frozen=True, slots=True)
class Chunk:
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
    """Chunk address -> state for every chunk in a free list or tcache, and every tcache struct chunk."""
    out: dict[int, ChunkState] = {}
    for arena in state.arenas:
        for lst in arena.free_lists():
            st = _LIST_STATE[lst.kind]
            for c in lst.chunks:
                out[c] = st
    for thread in state.threads:
        if thread.tcache is None:
            continue
        out[thread.tcache.address - 2 * 8] = ChunkState.TCACHE_STRUCT
        for b in thread.tcache.bins:
            for e in b.entries:
                out[e - 2 * 8] = ChunkState.TCACHE
    return out


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


class _Words:
    """Reads 8-byte words of [start, end) through windows of a few hundred KiB: few reads, little memory."""

    def __init__(self, mem: Memory, start: int, end: int):
        self.mem, self.start, self.end = mem, start, end
        self.base, self.data = 0, b""

    def __call__(self, address: int) -> int:
        off = address - self.base
        if not (0 <= off and off + 8 <= len(self.data)):
            self.base = address & ~7
            size = min(_WINDOW, max(self.end - self.base, 8))
            try:
                self.data = self.mem.read(self.base, size)
            except ReadError:
                self.data = self.mem.read(self.base, 8)
            off = address - self.base
        return struct.unpack_from("<Q", self.data, off)[0]


def walk_extent(mem: Memory, extent: Extent, top: int, states: dict[int, ChunkState], acc: Account
                ) -> Iterator[Chunk]:
    """Every chunk of EXTENT in address order; adds overhead, unwalked bytes and findings to ACC."""
    acc.overhead += extent.first - extent.start
    word = _Words(mem, extent.first, extent.end)
    c = extent.first
    where = f"heap {extent.start:#x}"
    while c < extent.end:
        try:
            size_field = word(c + 8)
        except ReadError:
            acc.findings.append(Finding(Severity.ERROR, c, where, "the chunk header is unreadable"))
            acc.unwalked += extent.end - c
            return
        size = size_field & ~SIZE_BITS
        if size == 0 and c != top:  # the fencepost that ends a heap that is no longer the newest
            acc.overhead += extent.end - c
            return
        if size < 2 * 8 or size % MALLOC_ALIGNMENT or c + size > extent.end:
            acc.findings.append(Finding(Severity.ERROR, c, where, f"chunk size {size_field:#x} is impossible here "
                                        f"(the heap ends at {extent.end:#x}); the rest of the heap is not walked"))
            acc.unwalked += extent.end - c
            return
        if c == top:
            st = ChunkState.TOP
        elif c in states:
            st = states[c]
        elif size < MINSIZE:
            st = ChunkState.FENCEPOST
        else:
            st = ChunkState.IN_USE
            if c + size < extent.end:
                try:
                    if not word(c + size + 8) & PREV_INUSE:
                        st = ChunkState.FREE_UNLISTED
                        acc.findings.append(Finding(Severity.WARNING, c, where,
                                                    f"free chunk of {size:#x} bytes is in no bin"))
                except ReadError:
                    pass
        yield Chunk(c, size, size_field & SIZE_BITS, st, extent.start)
        c += size
        if st is ChunkState.TOP:
            if c != extent.end:
                acc.findings.append(Finding(Severity.WARNING, c, where, f"top ends at {c:#x}, not at the heap's "
                                            f"end {extent.end:#x}"))
                acc.overhead += max(0, extent.end - c)
            return


def account(mem: Memory, layout: Layout, arena: Arena, states: dict[int, ChunkState], observer=None) -> Account:
    """Walks every chunk of ARENA and sums bytes per state; the identity is `Account.balanced`.

    OBSERVER (e.g. `heapwalk.trim.TrimSimulation`) sees the same walk: its ``chunk(c)`` is called for each
    chunk and ``extent_done()`` at the end of each heap, so one walk serves both.
    """
    acc = Account(arena.address, arena.system_mem)
    for extent in extents(arena, layout):
        for chunk in walk_extent(mem, extent, arena.top, states, acc):
            acc.bytes[chunk.state] += chunk.size
            acc.counts[chunk.state] += 1
            if observer is not None:
                observer.chunk(chunk)
        if observer is not None:
            observer.extent_done()
    if acc.accounted != acc.system_mem:
        acc.findings.append(Finding(Severity.WARNING, arena.address, f"arena {arena.number}",
                                    f"the walk accounts for {acc.accounted:#x} bytes, system_mem is "
                                    f"{acc.system_mem:#x}"))
    return acc


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
    the region; the kernel may merge neighbouring ones into one region.
    Regions overlapping SKIP (heaps, libc) are not looked at; chunks with
    front padding are not found (the totals then disagree with mp_, which
    the caller reports).
    """
    out: list[MmappedChunk] = []
    for start, end in regions:
        if any(lo < end and start < hi for lo, hi in skip):
            continue
        at = start
        while at < end and len(out) < limit:
            try:
                prev_size, size_field = struct.unpack("<QQ", mem.read(at, 16))
            except ReadError:
                break
            size = size_field & ~SIZE_BITS
            if prev_size or not size_field & IS_MMAPPED or size_field & NON_MAIN_ARENA or size < MINSIZE:
                break
            span = layout.mmapped_span(0, size)
            if span % 4096 or at + span > end:
                break
            out.append(MmappedChunk(at, size, span))
            at += span
    return out


def _probe_main_region(mem: Memory, start: int, end: int, top: int, top_size: int) -> int | None:
    """The end of a main-arena region that starts at START (an mmap'd piece of a non-contiguous main arena):
    where its chunks reach the end of top, or two fenceposts; None if START does not hold such chunks."""
    word = _Words(mem, start, end)
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
    neighbouring pieces into one region, so a region is probed piece after piece.
    """
    out = []
    for start, end in sorted(regions):
        if any(lo < end and start < hi for lo, hi in skip):
            continue
        at = start
        while at < end:
            piece_end = _probe_main_region(mem, at, end, arena.top, arena.top_size)
            if piece_end is None:
                break
            out.append((at, piece_end))
            at = (piece_end + 4095) & ~4095
    return out
