"""The heap as heapwalk found it, and what the walk of its chunks found: plain frozen dataclasses.

Sizes are glibc chunk sizes with the three flag bits masked off, unless a field says ``raw`` (the size field as
stored, flags included: what malloc_info prints for regular bins).  Addresses are ints: chunk addresses for
bins (what glibc's bin lists link), user-memory addresses (chunk + 16) for tcache entries (what its lists link).
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from types import MappingProxyType

import numpy as np

from heapwalk.common.findings import Fact, Finding
from heapwalk.inferior.residency import Residency

__all__ = ["BinKind", "BinList", "Heap", "Arena", "TcacheBin", "Tcache", "Thread", "MallocPar", "ChunkState",
           "FREE_STATES", "list_name", "thread_numbers", "Account", "TrimEstimate", "KEPT_REASONS", "MmappedChunk", "ChunkWalk", "HeapState"]


_SIZE_MASK = np.uint64(2 ** 64 - 8)


class BinKind(enum.Enum):
    """Which free list a chunk sits in, in glibc's terms."""

    TCACHE = "tcache"
    FAST = "fast"
    UNSORTED = "unsorted"
    SMALL = "small"
    LARGE = "large"


@dataclass(frozen=True)
class BinList:
    """One free list of an arena (a fastbin, the unsorted bin, a small or large bin).

    ``chunks`` are chunk addresses in list order (from the head's fd); ``raw_sizes`` the size fields as stored.
    ``complete`` is False when the walk stopped at damage (see the arena's findings); the numbers then cover
    the part that was walked.
    """

    kind: BinKind
    index: int
    head: int
    chunks: Sequence[int]       # array('Q') from the walkers: 8 bytes an entry (lists may hold millions)
    raw_sizes: Sequence[int]    # array("I") where every field fits 32 bits (the one pass), else array("Q")
    complete: bool = True
    total: int = field(init=False, compare=False, repr=False)   # these four from raw_sizes, once
    raw_total: int = field(init=False, compare=False, repr=False)
    min_size: int = field(init=False, compare=False, repr=False)
    max_size: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        raw = self.raw_sizes
        raw_np = np.array(raw, dtype=np.uint64)
        masked = raw_np & _SIZE_MASK
        exact = not len(raw) or int(raw_np.max()) * len(raw) < 1 << 64            # no sum can wrap around
        values = (int(masked.sum()), int(raw_np.sum())) if exact else (sum(self.sizes), sum(raw))
        extremes = (int(masked.min()), int(masked.max())) if len(raw) else (0, 0)
        for name, value in zip(("total", "raw_total", "min_size", "max_size"), (*values, *extremes)):
            object.__setattr__(self, name, value)

    @property
    def sizes(self) -> Sequence[int]:
        """Each entry's chunk size, made from RAW_SIZES when asked (array('Q')): not kept twice."""
        return array("Q", (np.array(self.raw_sizes, dtype=np.uint64) & _SIZE_MASK).tobytes())

    @property
    def count(self) -> int:
        return len(self.chunks)


@dataclass(frozen=True)
class Heap:
    """A heap_info-headed mapping of a thread arena (or the main arena's sbrk region)."""

    address: int
    size: int
    mprotect_size: int
    ar_ptr: int
    prev: int
    pagesize: int | None = None


@dataclass(frozen=True)
class Arena:
    """One malloc_state and what hangs from it."""

    address: int
    number: int                 # position in the arena ring, main_arena = 0 (malloc_info's heap nr)
    is_main: bool
    mutex: int
    flags: int
    have_fastchunks: int | None
    top: int
    top_size: int
    last_remainder: int
    next: int
    next_free: int
    attached_threads: int | None
    system_mem: int
    max_system_mem: int
    heaps: tuple[Heap, ...]
    fastbins: tuple[BinList, ...]
    unsorted: BinList
    bins: tuple[BinList, ...]   # small and large bins 2..127, in index order
    on_free_list: bool = False
    findings: tuple[Finding, ...] = ()
    lists_known: bool = True    # False: the arena itself is missing, so no list says which chunks are free

    @property
    def kind(self) -> str:
        return "main" if self.is_main else "thread"

    @property
    def noncontiguous(self) -> bool:
        return bool(self.flags & 2)

    def free_lists(self) -> tuple[BinList, ...]:
        """Every non-empty free list: fastbins, unsorted, then small and large bins."""
        lists = [b for b in self.fastbins if b.count]
        if self.unsorted.count:
            lists.append(self.unsorted)
        lists.extend(b for b in self.bins if b.count)
        return tuple(lists)


@dataclass(frozen=True)
class TcacheBin:
    """One tcache bin of one thread: ``entries`` are user-memory addresses, head first."""

    index: int
    chunk_size: int
    count: int                  # glibc's count for the bin (for 2.42+, decoded from num_slots)
    entries: tuple[int, ...]
    complete: bool = True
    # large bins (2.42+) hold mixed sizes: each entry's chunk size, and the memory it holds (an
    # mmapped chunk holds its whole mapping); empty for small bins, whose entries all have chunk_size
    sizes: tuple[int, ...] = ()
    spans: tuple[int, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.spans) if self.spans else len(self.entries) * self.chunk_size


@dataclass(frozen=True)
class Tcache:
    """A tcache_perthread_struct at ``address`` (user memory of its chunk)."""

    address: int
    bins: tuple[TcacheBin, ...]  # non-empty bins only
    findings: tuple[Finding, ...] = ()
    arena: int | None = None     # for a tcache found by scanning: the arena whose heap holds it

    @property
    def count(self) -> int:
        return sum(len(b.entries) for b in self.bins)

    @property
    def total(self) -> int:
        return sum(b.total for b in self.bins)


@dataclass(frozen=True)
class Thread:
    """A thread of the target, its arena and its tcache."""

    number: int                 # gdb's thread number
    lwp: int
    thread_pointer: int
    arena: int | None           # value of the thread_arena TLS variable (None: never allocated)
    tcache_pointer: int | None  # value of the tcache TLS variable
    tcache: Tcache | None
    tls_lost: bool = False      # the core holds no copy of the thread's TLS (its stack was written as zeros)
    name: str | None = None     # its name (comm), when the target says


def thread_numbers(numbers: list[int]) -> str:
    """'2-9' for a run of gdb thread numbers, else '2, 4, 7'."""
    if len(numbers) > 2 and numbers[-1] - numbers[0] == len(numbers) - 1:
        return f"{numbers[0]}-{numbers[-1]}"
    return ", ".join(map(str, numbers))


def list_name(arena: Arena, kind: BinKind, index: int) -> str:
    """How the output names a free list: 'fastbin[2] of arena 1', 'small bin[5] of arena 0'."""
    name = "fastbin" if kind is BinKind.FAST else f"{kind.value} bin"
    return f"{name}[{index}] of arena {arena.number}"


@dataclass(frozen=True)
class MallocPar:
    """The fields of glibc's ``mp_`` that heapwalk reads (None where the version lacks them)."""

    address: int
    values: dict[str, int]

    def get(self, name: str) -> int | None:
        return self.values.get(name)


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

@dataclass(frozen=True)
class Account:
    """Where an arena's system_mem goes, by chunk state, in bytes and counts: what the chunk walk found."""

    arena: int
    system_mem: int
    bytes: Mapping[ChunkState, int] = field(default_factory=lambda: MappingProxyType(dict.fromkeys(ChunkState, 0)))
    counts: Mapping[ChunkState, int] = field(default_factory=lambda: MappingProxyType(dict.fromkeys(ChunkState, 0)))
    overhead: int = 0           # heap_info, a thread arena's malloc_state, alignment, fenceposts' tails
    unwalked: int = 0           # bytes after damage the walk could not pass
    findings: tuple[Finding, ...] = ()

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


#: the reasons free bytes stay after malloc_trim(0) (see `TrimEstimate.kept`)
KEPT_REASONS = ("tcache", "sub_page", "thread_top", "main_top")


@dataclass(frozen=True)
class TrimEstimate:
    """Bytes malloc_trim(0) would release from one arena, and how many of them are resident."""

    arena: int
    madvise: int = 0            # page interiors of free chunks (address space keeps its mapping)
    madvise_resident: int = 0
    systrim: int = 0            # the main arena's top, given back to the kernel
    systrim_resident: int = 0
    # free bytes no trim can return, by reason: "tcache" (not flushed), "sub_page" (free chunks, or their
    # ends and links, smaller than a page), "thread_top" (a thread arena's top is never trimmed), "main_top"
    # (what stays of the main top: its last partial page, or all of it when the arena is not contiguous)
    kept: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(dict.fromkeys(KEPT_REASONS, 0)))

    @property
    def kept_free(self) -> int:
        return sum(self.kept.values())

    @property
    def total(self) -> int:
        return self.madvise + self.systrim

    @property
    def resident(self) -> int:
        return self.madvise_resident + self.systrim_resident


@dataclass(frozen=True)
class MmappedChunk:
    """A chunk with a mapping of its own: its address, size field (masked), and the bytes of its mapping."""

    address: int
    size: int
    span: int


@dataclass(frozen=True)
class ChunkWalk:
    """What the walk of every chunk found: each arena's account and trim estimate (by arena address), the
    mmapped chunks, the findings not tied to one arena, and whether Ctrl-C stopped it."""

    accounts: Mapping[int, Account]
    trims: Mapping[int, TrimEstimate]
    mmapped: tuple[MmappedChunk, ...] = ()
    findings: tuple[Finding, ...] = ()
    interrupted: bool = False
    used: Mapping[int, tuple] | None = None  # arena address -> its in-use chunks (addresses, sizes), when kept
    chunks: Mapping[int, Mapping] | None = None  # arena address -> its heaps' runs (`bulk.runs.HeapRuns`) by start
    pages: Any = None  # the whole pages the one pass read, and those of them that hold anything but zeros


@dataclass(frozen=True)
class HeapState:
    """Everything heapwalk decoded from one target at one instant."""

    target: str
    glibc_version: tuple[int, int]
    layout_name: str
    main_arena: int | None      # None: not found (a truncated core lost it; see glibc/headless.py)
    mp: MallocPar | None
    arenas: tuple[Arena, ...]
    threads: tuple[Thread, ...]
    facts: tuple[Fact, ...] = ()
    findings: tuple[Finding, ...] = field(default=())
    walk: ChunkWalk | None = None   # the walk of every chunk, when it was asked for
    glibc_label: str = ""           # "2.36", or the range memory showed when the version is unknown
    heap_max_size: int = 64 << 20   # size and alignment of a thread arena's heap reservation
    page_size: int = 4096           # the target's page (AT_PAGESZ): what trim and mmap round to
    scanned_tcaches: tuple[Tcache, ...] = ()  # tcache structs found in the arenas when threads' TLS is lost
    lists_stopped: bool = False     # reading the free lists was stopped (Ctrl-C): later arenas are left out
    stop_findings: tuple[Finding, ...] = ()    # where the lists were stopped, and glibc's last words then
    target_findings: tuple[Finding, ...] = ()  # what the target lacks or adds (a truncated core, another malloc)
    cpus: tuple[int, int] | None = None  # CPUs online and those the process may use, when the target says
    residency: Residency | None = None   # which pages were in RAM, when the target says

    @property
    def version_text(self) -> str:
        return self.glibc_label or "%d.%d" % self.glibc_version

    def arena_at(self, address: int) -> Arena | None:
        return next((a for a in self.arenas if a.address == address), None)

    def arena_named(self, wanted: int) -> Arena | None:
        """The arena at address WANTED, or numbered WANTED in the ring (a number is below 4096)."""
        return next((a for a in self.arenas if a.address == wanted or (wanted < 4096 and a.number == wanted)),
                    None)

    @property
    def interrupted(self) -> bool:
        """Was the chunk walk, or the reading of the free lists before it, stopped (Ctrl-C)?"""
        return self.lists_stopped or (self.walk is not None and self.walk.interrupted)

    @property
    def accounts(self) -> Mapping[int, Account]:
        """Each walked arena's account, by arena address (empty when no walk was asked for)."""
        return self.walk.accounts if self.walk is not None else _NOTHING

    @property
    def trims(self) -> Mapping[int, TrimEstimate]:
        """Each walked arena's trim estimate, by arena address (empty when no walk was asked for)."""
        return self.walk.trims if self.walk is not None else _NOTHING

    @property
    def mmapped(self) -> tuple[MmappedChunk, ...]:
        """The mmapped chunks found in memory (none when no walk was asked for)."""
        return self.walk.mmapped if self.walk is not None else ()

    def loose_findings(self) -> tuple[Finding, ...]:
        """The findings tied to no arena, thread or list that come after decoding: where it was stopped, what
        the walk found outside the arenas, what the target lacks."""
        walked = self.walk.findings if self.walk is not None else ()
        return self.stop_findings + walked + self.target_findings

    def mmap_counters(self) -> tuple[int, int]:
        """(count, bytes) of the mmapped chunks as glibc counts them: mp_'s n_mmaps and mmapped_mem, or, when
        mp_ was not found, the chunks found in memory."""
        if self.mp is not None:
            return self.mp.get("n_mmaps") or 0, self.mp.get("mmapped_mem") or 0
        return len(self.mmapped), sum(c.span for c in self.mmapped)

    def tcaches(self) -> list[tuple[str, Tcache]]:
        """Every decoded tcache with its owner: each thread's (through its TLS), then those found by
        scanning the arenas, whose thread is unknown."""
        out = [(f"thread {t.number}", t.tcache) for t in self.threads if t.tcache is not None]
        out += [(f"tcache {tc.address:#x} (thread unknown)", tc) for tc in self.scanned_tcaches]
        return out

    def all_findings(self) -> tuple[Finding, ...]:
        out = list(self.findings)
        for arena in self.arenas:
            out.extend(arena.findings)
        for _, tcache in self.tcaches():
            out.extend(tcache.findings)
        for acc in self.accounts.values():
            out.extend(acc.findings)
        out.extend(self.loose_findings())
        return tuple(out)


_NOTHING: Mapping = MappingProxyType({})
