"""What the chunk walk gives each chunk and sums per arena: chunk states, a heap's extents, the listing of
every chunk the lists and tcaches hold (what the walk looks up as it goes), and an arena's account."""

from __future__ import annotations

import bisect
import itertools
import sys
from array import array
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.locate.layout import MALLOC_ALIGNMENT, Layout
from heapwalk.glibc.model import Account, Arena, BinKind, ChunkState, HeapState

__all__ = ["BIN_STATES", "HELD_STATES", "LISTED_STATES", "LIST_CODES", "ADDRESS_MASK", "Chunk", "Extent", "Tally",
           "list_states", "Listing", "align_chunk", "extents"]


_LIST_STATE = {BinKind.FAST: ChunkState.FAST, BinKind.UNSORTED: ChunkState.UNSORTED,
               BinKind.SMALL: ChunkState.SMALL, BinKind.LARGE: ChunkState.LARGE}


class Chunk(NamedTuple):
    """One chunk met by the walk: its address, size (flags masked), flag bits and state."""

    address: int
    size: int
    flags: int
    state: ChunkState
    extent: int                 # the heap (or main-arena region) it lies in


@dataclass(frozen=True)
class Extent:
    """A stretch of one arena's memory that holds chunks: [start, end) of a heap, first chunk at FIRST."""

    start: int
    first: int
    end: int


@dataclass
class Tally:
    """An arena's account as the walk builds it (the walk's own state): `account` gives the finished value."""

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

    def sum_unlisted(self, where: str) -> None:
        """One finding, instead of one per chunk, for the free chunks in no list of an arena whose lists are
        missing (see `heapwalk.glibc.locate.headless`)."""
        unlisted = [f for f in self.findings if f.kind is Kind.FREE_UNLISTED]
        if not unlisted:
            return
        self.findings[:] = [f for f in self.findings if f.kind is not Kind.FREE_UNLISTED]
        self.findings.append(Finding(
            Severity.INFO, self.arena, where, f"{len(unlisted)} free chunk(s), "
            f"{self.bytes[ChunkState.FREE_UNLISTED]:#x} bytes, are free by their neighbours' PREV_INUSE bits; the "
            "arena's lists are missing, so these are counted as free in no list (and chunks in tcache or "
            "fastbins, whose neighbours call them in use, as in use)", Kind.FREE_UNLISTED))

    def account(self) -> Account:
        """The finished account, frozen."""
        return Account(self.arena, self.system_mem, MappingProxyType(dict(self.bytes)),
                       MappingProxyType(dict(self.counts)), self.overhead, self.unwalked, tuple(self.findings))


def list_states(state: HeapState) -> dict[int, ChunkState]:
    """Chunk address -> state for every chunk in a free list or tcache, and every tcache struct chunk
    (`Listing.of_state` as a dict: where two lists hold a chunk, the state the walk gives it)."""
    return Listing.of_state(state).as_dict()


#: the states of listed chunks, by the code a `Listing` key carries in its low four bits; where two lists hold
#: one chunk, the lowest code wins (a tcache over a bin, as glibc's own next malloc would see it)
LISTED_STATES = (ChunkState.TCACHE_STRUCT, ChunkState.TCACHE, ChunkState.FAST, ChunkState.UNSORTED,
                  ChunkState.SMALL, ChunkState.LARGE)
LIST_CODES = {st: code for code, st in enumerate(LISTED_STATES)}
ADDRESS_MASK = ~0xF
#: the byte of a uint64 holding its low four bits (the code of a key) in gdb's own memory
_LOW_BYTE = 0 if sys.byteorder == "little" else 7


class Listing:
    """Every chunk in a free list or tcache, and every tcache struct chunk, sorted by address: what the chunk
    walk looks up as it goes.  Each is one int, address | code: chunk addresses are 16-aligned, so the low
    four bits carry the state (`LISTED_STATES`).  The ints (`keys`, a few a chunk) are made only when a walk
    asks; the one pass takes the same as arrays (`arrays`), made from the lists' own without them."""

    __slots__ = ("_keys", "_lists", "_others", "_arrays")

    def __init__(self, keys: list[int] | None = None, lists: tuple = (), others: tuple = ()):
        self._keys = keys
        self._lists, self._others = lists, others      # (code, array of chunks), (code, ints) when keys is None
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    @classmethod
    def of_state(cls, state: HeapState) -> "Listing":
        lists = tuple((LIST_CODES[_LIST_STATE[lst.kind]], lst.chunks) for arena in state.arenas
                      for lst in arena.free_lists())
        others = []
        for _, tcache in state.tcaches():
            others.append((LIST_CODES[ChunkState.TCACHE_STRUCT], [tcache.address - 2 * 8]))
            for b in tcache.bins:
                others.append((LIST_CODES[ChunkState.TCACHE], [e - 2 * 8 for e in b.entries]))
        return cls(None, lists, tuple(others))

    @classmethod
    def of_states(cls, states: dict[int, ChunkState]) -> "Listing":
        return cls(sorted(a | LIST_CODES[st] for a, st in states.items()))

    @property
    def keys(self) -> list[int]:
        """The keys, sorted (made once)."""
        if self._keys is None:
            parts = [map(code.__or__, chunks) for code, chunks in self._lists + self._others]
            self._keys = sorted(itertools.chain.from_iterable(parts))
        return self._keys

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The listed addresses (sorted, uint64) and the code of each (where two keys share an address, the
        first: the code the careful walk gives it), made once.  Addresses outside the address space (damage)
        are left out."""
        if self._arrays is None:
            if self._keys is not None:
                keys = np.array([k for k in self._keys if 0 <= k < 1 << 64], dtype=np.uint64)
            else:
                keys = _keys_of(self._lists + self._others)
                # stable: a merge of the runs the lists hold (ascending ones, mostly), four times as fast as
                # numpy's default sort on the ordered bench core's 2 M listed chunks and no slower on the random one
                keys.sort(kind="stable")
            codes = keys.view(np.uint8)[_LOW_BYTE::8] & np.uint8(15)
            keys &= np.uint64(2 ** 64 - 16)                # (in place: each array a listed chunk held once)
            first = np.ones(len(keys), dtype=bool)
            np.not_equal(keys[1:], keys[:-1], out=first[1:])
            self._arrays = (keys, codes) if first.all() else (keys[first], codes[first])
        return self._arrays

    def as_dict(self) -> dict[int, ChunkState]:
        """Address -> state; where two keys share an address, the first (the one the walk takes) wins."""
        return {k & ADDRESS_MASK: LISTED_STATES[k & 0xF] for k in reversed(self.keys)}

    def addresses(self) -> set[int]:
        return {k & ADDRESS_MASK for k in self.keys}

    def get(self, address: int) -> ChunkState | None:
        """The state of the listed chunk at ADDRESS, or None."""
        i = bisect.bisect_left(self.keys, address)
        if i < len(self.keys) and self.keys[i] & ADDRESS_MASK == address:
            return LISTED_STATES[self.keys[i] & 0xF]
        return None

    def first_after(self, low: int, high: int) -> int | None:
        """The lowest listed address in (LOW, HIGH), or None."""
        i = bisect.bisect_left(self.keys, low + 16)
        if i < len(self.keys) and self.keys[i] & ADDRESS_MASK < high:
            return self.keys[i] & ADDRESS_MASK
        return None


def _keys_of(lists: tuple) -> np.ndarray:
    """The keys (address | code) of LISTS' chunks ((code, chunks) each), in the lists' order, in one array made
    once (the lists' arrays are not copied first)."""
    parts = [(code, np.frombuffer(chunks, dtype=np.uint64) if isinstance(chunks, array) and chunks.itemsize == 8
              else np.array([c for c in chunks if 0 <= c | code < 1 << 64], dtype=np.uint64)) for code, chunks in lists]
    keys = np.empty(sum(len(chunks) for _, chunks in parts), dtype=np.uint64)
    at = 0
    for code, chunks in parts:
        np.bitwise_or(chunks, np.uint64(code), out=keys[at:at + len(chunks)])
        at += len(chunks)
    return keys


def align_chunk(address: int) -> int:
    """The first address at or after ADDRESS whose user memory (chunk + 16) is aligned."""
    return address + (-(address + 2 * 8)) % MALLOC_ALIGNMENT


def extents(arena: Arena, layout: Layout) -> list[Extent]:
    """The stretches of memory holding ARENA's chunks: each heap of a thread arena, the main arena's sbrk region."""
    if arena.is_main:  # the sbrk region, or each mmap'd piece of a non-contiguous main arena
        return [Extent(h.address, align_chunk(h.address), h.address + h.size) for h in arena.heaps]
    out = []
    for heap in arena.heaps:
        header = layout.first_chunk_offset if heap.prev == 0 else layout.heap_info_size
        out.append(Extent(heap.address, align_chunk(heap.address + header), heap.address + heap.size))
    return out


BIN_STATES = frozenset((ChunkState.UNSORTED, ChunkState.SMALL, ChunkState.LARGE))
HELD_STATES = frozenset((ChunkState.IN_USE, ChunkState.TCACHE, ChunkState.FAST, ChunkState.TCACHE_STRUCT))
