"""What any allocator's decoder gives the analysis and the output: its arenas with where their memory is
(system, in use, free by kind, top, overhead), what the allocator could give back now (glibc's
malloc_trim(0), jemalloc's decay), and the sizes of the free pieces.

glibc's decoder fills it in `heapwalk.glibc.account.summary`; the report, its verdict and the tables read only
this, so a second allocator fills the same fields and gets the same report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["ArenaView", "Blocks", "BlockSizes", "HeapStrip", "HeapView", "SizeClass", "TagRuns", "Words", "index_type",
           "retagged", "tags_held"]


@dataclass(frozen=True)
class ArenaView:
    """One arena: where its system memory goes."""

    number: int
    address: int
    kind: str                    # "main" or "thread" (glibc), the allocator's own words elsewhere
    threads: int                 # threads that allocate from it
    heaps: int                   # the pieces of memory it holds (glibc heaps)
    system: int                  # bytes it holds from the system
    in_use: int                  # bytes in allocations the program holds, and the allocator's per-thread caches
    free: Mapping[str, int]      # free bytes by kind (glibc: tcache, fast, unsorted, small, large)
    top: int                     # free bytes at the end of its memory, where it grows
    overhead: int                # the allocator's own headers and padding
    reclaim: int                 # resident bytes the allocator could give back now (glibc: malloc_trim(0))
    balanced: bool               # do its bytes add up to system, with nothing left unwalked?
    resident: int | None = None          # bytes of its memory in RAM (None: the target cannot say)
    free_resident: int | None = None     # bytes of its free pieces in RAM
    top_resident: int | None = None      # bytes of its top in RAM
    users: tuple[str, ...] | None = None  # the names of the threads that allocate from it ("" for one unnamed;
    #                                       None: the allocator does not tie threads to it)

    @property
    def free_total(self) -> int:
        return sum(self.free.values())

    @property
    def idle(self) -> int:
        """Free bytes, top included."""
        return self.free_total + self.top

    @property
    def idle_resident(self) -> int | None:
        """Free bytes in RAM, top included (None: unknown); never more than the free bytes."""
        if self.free_resident is None:
            return None
        return min(self.free_resident, self.free_total) + min(self.top_resident or 0, self.top)


def _free_columns(kinds: tuple[str, ...]) -> tuple:
    return tuple((k, lambda a, k=k: a.free.get(k, 0)) for k in kinds)


@dataclass(frozen=True)
class Words:
    """What an allocator calls the parts of its report, so that its tables and pages speak its words: what its
    arenas hold (HOLDS: "jemalloc's arenas hold"), the columns of its arena table, its free pieces, what it
    gives back and how."""

    holds: str                                   # "malloc's arenas hold"
    arena: str = "arena"                         # the arena table's column of each row's address
    arenas: str = "arenas"                       # its rows, in its footer ("8 arenas")
    system: str = "mapped"                       # the column of what an arena holds from the system
    heaps: str = "heaps"                         # the column of the pieces of memory an arena holds
    pieces: str = "pieces"                       # its free pieces ("chunks")
    gives_back: str = "gives back"               # what it would give back now ("trim gives back")
    large: str = "large allocations"             # allocations with a mapping of their own ("mmapped chunks")
    overhead: str = "overhead"                   # its own bytes ("metadata")
    #: the arena table's free columns, (header, the figure of one `ArenaView`), after "in use"
    free_columns: tuple = ()
    #: the arena table's last columns, after the free ones
    last_columns: tuple = ()
    top: bool = False                            # does an arena have a top (free bytes where it grows)?
    overhead_page: str = ""                      # the report page's name of OVERHEAD, when longer
    pieces_page: str = ""                        # the report page's words for all its free pieces
    blocks: str = "blocks"                       # its allocations ("chunks")
    size_class: str = "size class"               # what the page calls a class of its free pieces
    blocks_counted: str = ""                     # which of them the in-use tables count, when not all
    counted: str = ""                            # what a diff counts by size class, when not its blocks

    def columns(self, kinds: tuple[str, ...]) -> tuple:
        """The free columns, or one per kind of free bytes when the allocator names none."""
        return self.free_columns or _free_columns(kinds)


@dataclass(frozen=True)
class SizeClass:
    """A range of free-piece sizes [low, high) the allocator treats alike, and its name."""

    low: int
    high: int
    name: str


@dataclass(frozen=True)
class HeapView:
    """Every arena of one target at one instant, and what is shared between them."""

    allocator: str                               # "glibc"
    arenas: tuple[ArenaView, ...]
    free_sizes: Mapping[int, Counter]            # arena number -> free piece size -> how many
    size_classes: tuple[SizeClass, ...]          # the allocator's size classes, smallest first
    large_count: int = 0                         # allocations with a mapping of their own (glibc: mmapped chunks)
    large_bytes: int = 0
    arena_limit: str = ""                        # how many arenas the allocator may make, and why
    arenas_idle: int = 0                         # arenas no thread uses (glibc: on the free list)
    reclaim_total: int = 0                       # address space the allocator would give back now
    reclaim_kept: Mapping[str, int] = field(default_factory=dict)  # free bytes it would keep, by reason
    residency: str = ""                          # where the arenas' resident bytes come from ("": unknown)
    large_resident: int | None = None            # resident bytes of the large allocations, when known
    thresholds: Mapping[str, int] = field(default_factory=dict)  # the allocator's thresholds as they stand (glibc:
    #                                            trim_threshold, mmap_threshold, no_dyn_threshold from mp_)


#: a block's length is kept in 32 bits in units of this many bytes (blocks up to 32 GiB), where every block's is a
#: multiple of it (every allocator's are); else each block's end is kept whole
LENGTH_UNIT = 8
_SHIFT = LENGTH_UNIT.bit_length() - 1
#: blocks made into lengths at a time
_STEP = 1 << 20


class Blocks:
    """Every allocation the program holds in an allocator's heaps, as the leak scan needs them: the first and
    one-past-last usable byte of each (sorted, never overlapping), the arena each lies in, and which memory is
    the allocator's own, so that it is never taken for a root.

    An allocation's address as the allocator names it (glibc: the chunk) is ``start - header``; its size as
    the allocator counts it (glibc: the chunk size) is ``end - start + header - tail``.

    The ends are kept as lengths (`LENGTH_UNIT`, uint32: 12 bytes a block with the start, not 16), or whole where a
    block does not fit that: `lengths` or `whole_ends` is None.  `ends` makes every end at once, `end_of` some.
    The arenas are kept as each block's index (`arena_index`: uint8 for up to 256 arenas, uint16 up to 65,536; with
    one arena a single 0 seen as many, read-only; given as runs, `TagRuns`, made when first asked) among the
    numbers `arena_numbers` (ascending, int32); `arena` makes every block's number, `arena_of` some.
    """

    def __init__(self, starts: Any, ends: Any, arena: Any, header: int, tail: int,
                 heaps: tuple[tuple[int, int], ...] = (), private: tuple[tuple[int, int], ...] = (),
                 large: tuple[tuple[int, int], ...] = (), unknown: tuple[tuple[int, int], ...] = (),
                 lengths: Any = None):
        """ENDS, or where ENDS is None, LENGTHS as the blocks keep them; ARENA, each block's arena number, or the
        numbers and each block's index among them as the blocks keep them (a builder that makes them so)."""
        self.starts = starts                      # numpy uint64, sorted
        self.lengths, self.whole_ends = (lengths, None) if ends is None else _lengths(starts, ends)
        self.arena_numbers, index = arena if isinstance(arena, tuple) else _indexed(arena)
        self._index, self._runs = (None, index) if isinstance(index, TagRuns) else (index, None)
        if len(self.arena_numbers) == 1:        # one arena: every index 0, kept as one (no byte a block)
            self._index, self._runs = np.broadcast_to(np.zeros(1, dtype=index.dtype), (len(starts),)), None
        self.header, self.tail = header, tail
        self.heaps = heaps          # the allocator's memory that holds the blocks: scanned only in blocks
        self.private = private      # its bookkeeping elsewhere (glibc: main_arena, mp_): never a root
        self.large = large          # allocations with a mapping of their own: roots, never judged
        self.unknown = unknown      # heap memory whose chunks damage hides: scanned as a root

    @property
    def count(self) -> int:
        return len(self.starts)

    @property
    def arena_index(self) -> Any:
        """Each block's index among `arena_numbers`; where the builder gave it as runs (`TagRuns`), made when first
        asked (after the leak scan, whose peak it then stays out of)."""
        if self._index is None:
            self._index, self._runs = self._runs.array(), None
        return self._index

    @property
    def arena(self) -> Any:
        """Each block's arena number (ArenaView.number; numpy int32), made anew: `arena_of` some."""
        return self.arena_numbers[self.arena_index]

    def arena_of(self, rows) -> Any:
        """The arena numbers of the blocks at ROWS."""
        return self.arena_numbers[self.arena_index[rows]]

    @property
    def ends(self) -> Any:
        """Every block's one-past-last usable byte (numpy uint64): made anew unless kept whole."""
        if self.whole_ends is not None:
            return self.whole_ends
        return self.starts + (self.lengths.astype(np.uint64) << np.uint64(_SHIFT))

    def end_of(self, rows) -> Any:
        """The one-past-last usable byte of the blocks at ROWS (an index, or numpy uint64 for an array of them)."""
        if self.whole_ends is not None:
            return self.whole_ends[rows]
        return self.starts[rows] + (self.lengths[rows].astype(np.uint64) << np.uint64(_SHIFT))

    def addresses(self, rows) -> Any:
        """The allocator's address of the blocks at ROWS (numpy uint64)."""
        return self.starts[rows] - self.header if self.header else self.starts[rows]

    def sizes(self, rows=slice(None)) -> Any:
        """The allocator's size of the blocks at ROWS (numpy int64).  Of every block, `BlockSizes` over the lengths
        (no array of a block each), or where the blocks keep whole ends an int64 array made once (read-only)."""
        if isinstance(rows, slice) and rows == slice(None):
            if self.lengths is not None:
                return BlockSizes(self.lengths, self.header - self.tail)
            return self.derived("sizes", _all_sizes)
        return (self.end_of(rows) - self.starts[rows]).astype("int64") + (self.header - self.tail)

    def derived(self, key: str, make: Callable[[Blocks], Any]) -> Any:
        """MAKE(self), made at the first call with KEY and kept with the blocks: arrays of a block each that more
        than one part of the analysis needs (made once, not once for each)."""
        made = self.__dict__.setdefault("_derived", {})
        if key not in made:
            made[key] = make(self)
        return made[key]


class BlockSizes:
    """Every block's size as the allocator counts it, made from the blocks' LENGTHS (uint32, `LENGTH_UNIT`s) and
    ADJUST (header less tail) where asked: SIZES[ROWS] is an int64 array, or an int64 for one row, as from the
    whole array; `sum`, `tolist` and len as its.  `tally` reads the lengths in C; np.asarray makes the array."""

    def __init__(self, lengths: Any, adjust: int):
        self.lengths, self.shift, self.adjust = lengths, _SHIFT, adjust

    def __getitem__(self, rows) -> Any:
        return (self.lengths[rows].astype(np.int64) << self.shift) + self.adjust

    def __len__(self) -> int:
        return len(self.lengths)

    def __array__(self, dtype=None, copy=None) -> Any:
        whole = self[slice(None)]
        return whole if dtype is None else whole.astype(dtype)

    def sum(self, where: Any = None) -> int:
        """The sizes' sum (exact: in Python's integers), of those WHERE marks when given (a mask, as numpy's)."""
        if where is None:
            return (int(self.lengths.sum(dtype=np.uint64)) << self.shift) + self.adjust * len(self.lengths)
        return ((int(self.lengths.sum(dtype=np.uint64, where=where)) << self.shift)
                + self.adjust * int(np.count_nonzero(where)))

    def tolist(self) -> list[int]:
        return self[slice(None)].tolist()


def _lengths(starts: Any, ends: Any) -> tuple[Any, Any]:
    """ENDS as lengths from STARTS in units of LENGTH_UNIT (uint32) and None, or None and ENDS (uint64) where a
    length is not a multiple of the unit or does not fit.  Made a million at a time: the ends and the starts are
    all the room it takes."""
    ends = np.asarray(ends, dtype=np.uint64)
    lengths = np.empty(len(ends), dtype=np.uint32)
    for at in range(0, len(ends), _STEP):
        length = ends[at:at + _STEP] - starts[at:at + _STEP]
        if np.any(length & np.uint64(LENGTH_UNIT - 1)) or int(length.max()) >> _SHIFT >= 1 << 32:   # none wraps
            return None, ends
        length >>= np.uint64(_SHIFT)
        lengths[at:at + _STEP] = length
    return lengths, None


def _indexed(arena: Any) -> tuple[Any, Any]:
    """The arena numbers ARENA (one per block) holds (int32, ascending), and each block's index among them in the
    smallest type that holds it (`index_type`)."""
    arena = np.asarray(arena)
    if not len(arena):
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.uint8)
    low, high = int(arena.min()), int(arena.max())
    if low < 0 or high >= 1 << 20:
        numbers, index = np.unique(arena, return_inverse=True)
        return numbers.astype(np.int32), index.astype(index_type(len(numbers)))
    numbers = np.flatnonzero(np.bincount(arena)).astype(np.int32)     # small numbers (every allocator's): counted
    lookup = np.zeros(high + 1, dtype=index_type(len(numbers)))
    lookup[numbers] = np.arange(len(numbers))
    return numbers, lookup[arena]


class TagRuns:
    """Blocks' tags as runs of consecutive blocks: COUNTS[k] blocks of tag TAGS[k] (a page's blocks, all of one
    owner), each block's tag made only by `array`."""

    def __init__(self, tags: np.ndarray, counts: np.ndarray):
        self.tags, self.counts, self.dtype = tags, counts, tags.dtype

    def array(self) -> np.ndarray:
        """Each block's tag."""
        return np.repeat(self.tags, self.counts)


#: blocks' tags handled at a time (numpy's bincount and fancy indexing make int64 arrays of what they are given)
_TAG_STEP = 1 << 18


def tags_held(tags: np.ndarray, count: int) -> np.ndarray:
    """Which of COUNT tags (indices) TAGS holds at least once (a mask)."""
    held = np.zeros(count, dtype=bool)
    for at in range(0, len(tags), _TAG_STEP):
        held |= np.bincount(tags[at:at + _TAG_STEP], minlength=count)[:count] > 0
    return held


def retagged(tags: np.ndarray, held: np.ndarray) -> np.ndarray:
    """TAGS renumbered to the tags HELD keeps (a mask of the old ones; each of TAGS is one it keeps), in the
    smallest type that holds them."""
    new = (np.cumsum(held) - 1).astype(index_type(int(held.sum())))
    out = np.empty(len(tags), dtype=new.dtype)
    for at in range(0, len(tags), _TAG_STEP):
        out[at:at + _TAG_STEP] = new[tags[at:at + _TAG_STEP]]
    return out


def index_type(count: int) -> Any:
    """The smallest type `Blocks.arena_index` holds COUNT arenas' indices in."""
    return np.uint8 if count <= 1 << 8 else np.uint16 if count <= 1 << 16 else np.int32


@dataclass(frozen=True)
class HeapStrip:
    """One heap of one arena as a heap map draws it: [start, end) cut into runs (sorted, never overlapping,
    covering it all), each of a kind (`mapkinds.MAP_KINDS`: in use, free by list, top, the allocator's own
    headers, bytes a damaged walk could not pass, a mapped but unused tail, a reservation never mapped), the
    runs the allocator would give back (and BAND, what it calls that), and the resident ranges when the target
    says which pages are in RAM."""

    arena: int                                # the arena's number
    label: str                                # "main arena", "arena 3 heap 2", ...
    start: int
    end: int
    run_starts: Any                           # numpy uint64
    run_ends: Any                             # numpy uint64
    kinds: Any                                # numpy uint8, an index into mapkinds.MAP_KINDS
    trimmable: Any = None                     # (n, 2) uint64 [start, end): what the allocator gives back
    resident: Any = None                      # (n, 2) uint64 [start, end) in RAM; None: the target cannot say
    beyond: int = 0                           # bytes of its reservation after END, left out of the strip
    band: str = "given back"                  # what TRIMMABLE is ("malloc_trim(0) gives back")


def _all_sizes(blocks: Blocks) -> Any:
    """`Blocks.sizes` of every block kept with whole ends, made in one array (read-only: it is shared)."""
    sizes = (blocks.whole_ends - blocks.starts).view("int64")
    sizes += blocks.header - blocks.tail
    sizes.setflags(write=False)
    return sizes
