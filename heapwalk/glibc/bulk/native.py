"""The one pass's pointer-chasing loops, in C when `pip install` built heapwalk's small library, in Python
otherwise.

Stepping from chunk to chunk by their sizes, and from list member to list member, cannot be done on whole
arrays: each step needs the one before.  In Python they cost about a quarter of a microsecond a step, most of a
big heap's walk; in C (`_native.c`, loaded with ctypes, no Python headers needed) a few nanoseconds.  A free
list's checks are made in the same C call that follows it (`walk_list`), where numpy would gather each of its
chunks' fields across the arena again (`indexlists` keeps those numpy steps for a build without it).  Both forms
give the same answers (tests/unit/glibc/test_native.py holds them equal); HEAPWALK_PURE=1 in the environment turns the
library off.
"""

from __future__ import annotations

import ctypes
from array import array
from pathlib import Path

import numpy as np

from heapwalk.common.arrays import staggered
from heapwalk.inferior.clib import built_library

__all__ = ["chase", "follow", "sweep_window", "free_runs", "successors", "ChunkDirectory", "walk_list",
           "linked", "walk_linked", "Rulers", "lists_native", "NATIVE", "LISTS_NATIVE", "LINKED_MAX", "RULER_EVERY",
           "RULED_FROM"]

_INT64_P = ctypes.POINTER(ctypes.c_int64)


def _load():
    """The built library's functions, or None (see `inferior.clib`; also when it was built from older sources
    that lack one)."""
    lib = built_library(Path(__file__).parent, "_native", ("hw_sweep_window", "hw_follow"))
    if lib is not None:
        lib.hw_follow.restype = ctypes.c_int64
        lib.hw_follow.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_void_p]
        lib.hw_sweep_window.restype = ctypes.c_int64
        lib.hw_sweep_window.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 3 + [ctypes.c_uint64] * 2 + \
            [ctypes.c_int64] + [ctypes.c_void_p] * 4 + [_INT64_P]
        if hasattr(lib, "hw_free_runs"):
            lib.hw_free_runs.restype = ctypes.c_int64
            lib.hw_free_runs.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 5 + [ctypes.c_void_p] * 4
        if hasattr(lib, "hw_linked_list"):   # a library built before it still serves the other three
            lib.hw_chunk_dir.restype = None
            lib.hw_chunk_dir.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
            lib.hw_walk_list.restype = ctypes.c_int64
            lib.hw_walk_list.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] + [ctypes.c_void_p] * 4 + \
                [ctypes.c_int64] * 3 + [ctypes.c_uint64] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_uint64] * 2 + \
                [ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint8, ctypes.c_uint8] + \
                [ctypes.c_void_p] * 2
            lib.hw_successors.restype = None
            lib.hw_successors.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] + [ctypes.c_void_p] * 4 + \
                [ctypes.c_int64] * 4 + [ctypes.c_void_p]
            lib.hw_compact_links.restype = ctypes.c_int64
            lib.hw_compact_links.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64] + \
                [ctypes.c_void_p] * 2
            lib.hw_linked_list.restype = ctypes.c_int64
            lib.hw_linked_list.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] + [ctypes.c_void_p] * 4 + \
                [ctypes.c_int64, ctypes.c_uint64, ctypes.c_uint64] + [ctypes.c_int64] * 3 + [ctypes.c_uint64] * 2 + \
                [ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint8, ctypes.c_uint8] + \
                [ctypes.c_void_p] * 5 + [ctypes.c_int64, ctypes.c_void_p]
        if hasattr(lib, "hw_rulers"):
            lib.hw_rulers.restype = ctypes.c_int64
            lib.hw_rulers.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                      ctypes.c_void_p]
    return lib


_LIB = _load()
#: whether the C loops are in use
NATIVE = _LIB is not None
#: whether a free list is followed and judged in one C call (`walk_list`)
LISTS_NATIVE = NATIVE and hasattr(_LIB, "hw_linked_list")


def lists_native() -> bool:
    """`LISTS_NATIVE` as it is now (a test may turn the library off)."""
    return _LIB is not None and hasattr(_LIB, "hw_linked_list")


def chase(words: np.ndarray, j: int, min_size: int) -> tuple[np.ndarray, int]:
    """Steps through WORDS (uint64) from the size field at word J by each chunk's size while the field is
    within WORDS and a chunk's (at least MIN_SIZE, a multiple of 16): the index of each field stepped on
    (int64) and the index where it stopped.  In Python: the C library does it with the gather, `sweep_window`."""
    return _chase_python(words, j, min_size)


def sweep_window(words: np.ndarray, limit: int, j: int, min_size: int, base: int, before: int,
                 into: list[np.ndarray], at: int) -> tuple[int, int]:
    """`chase` of WORDS to word LIMIT and `gather` of what it stepped on in one C loop (`hw_sweep_window`),
    the chunks' address, size field, fd and bk written to the four arrays INTO (uint64) from index AT on (room
    for LIMIT // 4 + 1): the word it stopped at (-1 where `sweep._gather` would answer None) and the chunks
    written; NotImplemented when the library was not built."""
    if _LIB is None:
        return NotImplemented
    words = np.ascontiguousarray(words, dtype=np.uint64)
    count = ctypes.c_int64()
    stop = _LIB.hw_sweep_window(words.ctypes.data, len(words), limit, j, min_size, base, before,
                                *(column.ctypes.data + 8 * at for column in into), ctypes.byref(count))
    return int(stop), count.value


def free_runs(codes: np.ndarray, sizes: np.ndarray, lo: int, hi: int, run_lo: int, run_hi: int, fast: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The stretches of chunks [LO, HI) whose CODES (uint8) lie in [RUN_LO, RUN_HI), in one C loop
    (`hw_free_runs`): each one's first chunk and the chunk past its last (int64), its bytes (SIZES summed, int64),
    and whether it holds a chunk of code FAST (bool); NotImplemented when the library lacks it."""
    if _LIB is None or not hasattr(_LIB, "hw_free_runs"):
        return NotImplemented
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    room = max(0, hi - lo + 1) // 2
    starts, ends, total = (np.empty(room, np.int64) for _ in range(3))
    has_fast = np.empty(room, np.uint8)
    k = _LIB.hw_free_runs(codes.ctypes.data, sizes.ctypes.data, lo, hi, run_lo, run_hi, fast, starts.ctypes.data,
                          ends.ctypes.data, total.ctypes.data, has_fast.ctypes.data)
    return starts[:k], ends[:k], total[:k], has_fast[:k].view(bool)


def successors(successor: np.ndarray):
    """SUCCESSOR (each chunk's next chunk's index, negative for none) in the form `follow` takes."""
    if _LIB is None:
        return successor.tolist()
    return np.ascontiguousarray(successor, dtype=np.int64)


def follow(links, j: int, steps: int) -> np.ndarray | None:
    """The indices (int64) of a list's chunks from chunk J, each next one given by LINKS (`successors`);
    None when the list goes on past STEPS links (STEPS at least 1)."""
    if _LIB is None:
        return _follow_python(links, j, steps)
    out = np.empty(min(steps, len(links) + 1), dtype=np.int64)
    count = _LIB.hw_follow(links.ctypes.data, len(links), j, len(out), out.ctypes.data)
    return None if count < 0 else out[:count].copy()


class ChunkDirectory:
    """Where each of a swept arena's chunks starts, for `walk_list`'s lookups: for every step of a few chunks'
    bytes (a power of two) through the spans the chunks lie in, the first chunk at or above it; a lookup is a
    search among the spans (one an extent), an entry, then a few chunks in address order.  About 2 bytes a
    chunk.  Only where `LISTS_NATIVE`."""

    #: chunks a step holds on average (a lookup looks at half of them)
    CHUNKS_A_STEP = 4

    def __init__(self, address: np.ndarray, spans: list[tuple[int, int]]):
        self.address = np.ascontiguousarray(address, dtype=np.uint64)
        n = len(self.address)
        spans = [(lo, hi) for lo, hi in spans if hi > lo]
        total = sum(hi - lo for lo, hi in spans)
        self.shift = max(4, (max(total * self.CHUNKS_A_STEP // max(n, 1), 1)).bit_length() - 1)
        self.lo = np.array([lo for lo, _ in spans], dtype=np.uint64)
        self.hi = np.array([hi for _, hi in spans], dtype=np.uint64)
        slots = np.array([((hi - lo - 1) >> self.shift) + 1 for lo, hi in spans], dtype=np.int64)
        self.first = np.concatenate(([0], np.cumsum(slots)[:-1])).astype(np.int64)
        self.dir = np.empty(int(slots.sum()), dtype=np.int64)
        _LIB.hw_chunk_dir(self.address.ctypes.data, n, self.lo.ctypes.data, slots.ctypes.data, len(spans),
                          self.shift, self.dir.ctypes.data)

    def arguments(self) -> tuple:
        return (self.lo.ctypes.data, self.hi.ctypes.data, self.first.ctypes.data, self.dir.ctypes.data, len(self.lo),
                self.shift)


def walk_list(chunks: tuple[np.ndarray, ...], directory: ChunkDirectory, want: int, first: int, end: int, safe: bool,
              steps: int, bound: int, lo: int, hi: int, head_bk: int | None, codes: np.ndarray, plain: int, code: int,
              out: tuple[np.ndarray, np.ndarray]) -> int | None:
    """A free list followed among CHUNKS (a sweep's address, field, fd and bk, each contiguous uint64; DIRECTORY
    their `ChunkDirectory`) from the chunk at FIRST and judged in one C call, each link looked up as it is met
    (`indexlists._Walk.list` has the same in numpy): every chunk free (WANT 1: the next chunk's PREV_INUSE clear),
    in use (0) or either (-1); it must end at a chunk whose link (its fd, undone of safe-linking when SAFE) is END,
    within STEPS links and shorter than BOUND, every size in [LO, HI], no chunk already coded other than PLAIN in
    CODES (each then coded CODE), and with HEAD_BK (not None) each bk leads back (the first's to END) and HEAD_BK to
    the last.  The chunks' addresses and fields go to OUT (room for STEPS each), in list order: how many; None when
    the list fails (CODES may then hold some of it coded).  NotImplemented when the library has no such call."""
    if not lists_native():
        return NotImplemented
    address, field, fd, bk = chunks
    count = _LIB.hw_walk_list(address.ctypes.data, field.ctypes.data, fd.ctypes.data, bk.ctypes.data, len(address),
                              *directory.arguments(), want, first, end, int(safe), steps, bound, lo, hi,
                              int(head_bk is not None), 0 if head_bk is None else head_bk, codes.ctypes.data, plain,
                              code, out[0].ctypes.data, out[1].ctypes.data)
    return None if count < 0 else int(count)


#: the most chunks `linked` takes: its indices are 4 bytes (half the room, and a list's hops are followed through
#: them, each a wait on memory that a smaller array makes shorter)
LINKED_MAX = (1 << 31) - 1


#: every how many places of the bins' free chunks a ruler stands (`Rulers`), and from how many such chunks on an
#: arena's lists are followed through them: below that, the successors of an arena's free chunks (4 bytes each)
#: fit in a core's own cache, and a list's hops, one after another, wait little (measured: 11 ns a hop at 160,000
#: chunks, 100-170 ns at 1.8 million, the huge bench core's arenas)
RULER_EVERY, RULED_FROM = 64, 1 << 19


class Rulers:
    """Every RULER_EVERY-th place of a `linked` array, where its list goes next from there: the next ruler and the
    places up to it (`hw_rulers`), so that a long list is followed a stretch between rulers at a time, many
    stretches at once, not a hop after the one before (`hw_linked_list`)."""

    __slots__ = ("next", "length", "every", "segments")

    def __init__(self, nxt: np.ndarray, length: np.ndarray, every: int):
        self.next, self.length, self.every = nxt, length, every
        self.segments = np.empty(2 * (len(nxt) + 1), dtype=np.int64)

    @classmethod
    def of(cls, successor: np.ndarray, every: int) -> "Rulers | None":
        """SUCCESSOR's rulers; None where the library lacks them, or where the lists meet so often (damage) that
        they cost more than following the lists a hop at a time."""
        if not hasattr(_LIB, "hw_rulers"):
            return None
        m = len(successor)
        nr = (m + every - 1) // every
        nxt, length = staggered(nr, np.int32, 0), staggered(nr, np.int32, 1)
        if _LIB.hw_rulers(successor.ctypes.data, m, every, nxt.ctypes.data, length.ctypes.data) < 0:
            return None
        return cls(nxt, length, every)


def linked(chunks: tuple[np.ndarray, ...], directory: ChunkDirectory, want: int, safe: bool
           ) -> tuple[np.ndarray, np.ndarray, Rulers | None]:
    """The chunks of CHUNKS (as `walk_list` takes them; at most LINKED_MAX) a list of WANT may hold, and where each
    one's link (undone of safe-linking when SAFE) leads when that is one too: (successor, index, rulers), INDEX
    their indices (int32, ascending), SUCCESSOR (int32) each one's successor as a place in INDEX, -1 for none,
    RULERS theirs (`Rulers`) where there are RULED_FROM such chunks or more.  In one C loop whose lookups do not
    wait on each other (each fetched ahead): worth it where most such chunks are listed (the bins' free chunks).
    Only where `lists_native()`."""
    address, field, fd, _ = chunks
    n = len(address)
    out = np.empty(n, dtype=np.int32)
    _LIB.hw_successors(address.ctypes.data, field.ctypes.data, fd.ctypes.data, n, *directory.arguments(),
                       want, int(safe), out.ctypes.data)
    index, successor = staggered(n, np.int32, 1), staggered(n, np.int32, 2)
    m = _LIB.hw_compact_links(out.ctypes.data, n, field.ctypes.data, want, index.ctypes.data,
                              successor.ctypes.data)
    del out
    successor, index = successor[:m].copy(), index[:m].copy()
    return successor, index, Rulers.of(successor, RULER_EVERY) if m >= RULED_FROM else None


def walk_linked(links: tuple[np.ndarray, np.ndarray, Rulers | None], chunks: tuple[np.ndarray, ...], want: int,
                first: int, end: int, safe: bool, steps: int, bound: int, lo: int, hi: int, head_bk: int | None,
                codes: np.ndarray, plain: int, code: int, out: tuple[np.ndarray, np.ndarray, np.ndarray]
                ) -> int | None:
    """`walk_list` through LINKS (`linked` of the same WANT and SAFE) instead of a lookup a hop: the list followed
    first (through its rulers where it has them), then its chunks judged, so that neither loop's reads wait on each
    other's; OUT has a third array for the chunks' indices (int64).  Only where `lists_native()`."""
    address, field, fd, bk = chunks
    successor, index, rulers = links
    ruled = (0, 0, 0, 0) if rulers is None else (rulers.next.ctypes.data, rulers.length.ctypes.data, rulers.every,
                                                 rulers.segments.ctypes.data)
    count = _LIB.hw_linked_list(successor.ctypes.data, index.ctypes.data, len(index), address.ctypes.data,
                                field.ctypes.data, fd.ctypes.data, bk.ctypes.data, len(address), first, end,
                                int(safe), steps, bound, lo, hi, int(head_bk is not None),
                                0 if head_bk is None else head_bk, codes.ctypes.data, plain, code,
                                out[2].ctypes.data, out[0].ctypes.data, out[1].ctypes.data, *ruled)
    return None if count < 0 else int(count)


def _chase_python(words: np.ndarray, j: int, min_size: int) -> tuple[np.ndarray, int]:
    found = array("q")
    append = found.append
    view = memoryview(np.ascontiguousarray(words, dtype=np.uint64)).cast("B").cast("Q")
    try:
        while j >= 0:
            size_field = view[j]
            if size_field & 8 or size_field < min_size:
                break
            append(j)
            j += size_field >> 3
    except IndexError:
        pass
    return np.frombuffer(found, dtype=np.int64), j


def _follow_python(links: list[int], j: int, steps: int) -> np.ndarray | None:
    order = array("q")
    append = order.append
    while True:
        append(j)
        if not 0 <= j < len(links):
            return None
        j = links[j]
        if j < 0:
            return np.frombuffer(order, dtype=np.int64)
        steps -= 1
        if steps <= 0:
            return None
