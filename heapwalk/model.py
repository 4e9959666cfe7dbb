"""The heap as heapwalk found it: plain frozen dataclasses.

Sizes are glibc chunk sizes with the three flag bits masked off, unless a
field says ``raw`` (the size field as stored, flags included: what
malloc_info prints for regular bins).  Addresses are ints: chunk addresses for
bins (what glibc's bin lists link), user-memory addresses (chunk + 16) for
tcache entries (what glibc's tcache lists link).
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["BinKind", "Severity", "Kind", "Finding", "BinList", "Heap", "Arena", "TcacheBin", "Tcache", "Thread",
           "MallocPar", "Fact", "HeapState"]


class BinKind(enum.Enum):
    """Which free list a chunk sits in, in glibc's terms."""

    TCACHE = "tcache"
    FAST = "fast"
    UNSORTED = "unsorted"
    SMALL = "small"
    LARGE = "large"


class Severity(enum.Enum):
    ERROR = "error"      # the structure is damaged; numbers that depend on it are partial
    WARNING = "warning"  # unexpected but decodable
    INFO = "info"


class Kind(enum.Enum):
    """What kind of problem a finding is: a stable name (for JSON and scripts) and its title.

    Titles use glibc's own words where glibc has a check for the same thing
    (its abort message is given in parentheses).
    """

    def __init__(self, ident: str, title: str):
        self.ident = ident
        self.title = title

    UNMAPPED = ("unmapped_pointer", "pointer into unmapped memory")
    MISALIGNED = ("misaligned", "misaligned chunk pointer (\"unaligned tcache/fastbin chunk detected\")")
    LIST_CYCLE = ("list_cycle", "list is a cycle not through its head")
    LIST_TOO_LONG = ("list_too_long", "list longer than its arena could hold")
    FD_BK = ("fd_bk_mismatch", "fd->bk != p (\"corrupted double-linked list\")")
    PREV_SIZE = ("prev_size_mismatch", "chunk size does not match next chunk's prev_size "
                 "(\"corrupted size vs. prev_size\")")
    FASTBIN_SIZE = ("fastbin_size", "fastbin entry of wrong size (\"memory corruption (fast)\")")
    BIN_SIZE = ("bin_size", "chunk in the wrong bin for its size")
    TCACHE_SIZE = ("tcache_size", "tcache entry of wrong size")
    TCACHE_COUNT = ("tcache_count", "tcache count does not match list length")
    TCACHE_KEY = ("tcache_key", "tcache entry's key overwritten (a write after free)")
    DOUBLE_FREE = ("double_free", "double free: chunk in two free lists")
    FREE_IN_USE = ("free_chunk_in_use", "chunk in a bin, but the next chunk says it is in use "
                   "(\"double free or corruption (!prev)\")")
    OVERLAPS_TOP = ("overlaps_top", "free chunk overlaps top")
    OUTSIDE_HEAP = ("outside_heap", "free chunk outside its arena's heaps")
    CHUNK_SIZE = ("chunk_size", "impossible chunk size in the heap walk (\"invalid size\")")
    FREE_UNLISTED = ("free_unlisted", "free chunk in no list (PREV_INUSE of the next chunk cleared)")
    TOP_SIZE = ("top_size", "top chunk runs past its heap (\"corrupted top size\")")
    NEXTSIZE = ("nextsize_mismatch", "large bin nextsize links broken "
                "(\"corrupted double-linked list (not small)\")")
    LARGE_ORDER = ("large_bin_order", "large bin not sorted by size")
    ARENA_BIT = ("arena_bit", "NON_MAIN_ARENA flag does not match the chunk's arena")
    BINMAP = ("binmap", "non-empty bin not marked in the binmap")
    FASTCHUNKS = ("have_fastchunks", "fastbins hold chunks but have_fastchunks is false")
    ARENA_RING = ("arena_ring", "arena ring or free list broken")
    HEAP_INFO = ("heap_info", "heap_info chain broken")
    ARENA = ("arena", "arena unreadable or inconsistent")
    MUTEX_HELD = ("mutex_held", "arena mutex held at snapshot time (lists may be mid-update)")
    ACCOUNTING = ("accounting", "system_mem not accounted for by the chunk walk")
    MMAPPED = ("mmapped", "mmapped chunks disagree with mp_")
    TCACHE = ("tcache", "tcache struct unreadable or inconsistent")
    ABORT = ("abort", "glibc aborted the process")
    CRASH_POINTER = ("crash_pointer", "the crashing thread's stack points at a free chunk")
    TLS_LOST = ("thread_tls_lost", "thread's TLS not in the core (its arena and tcache found by scanning)")
    INTERRUPTED = ("interrupted", "the chunk walk was stopped (Ctrl-C)")
    DISCOVERY = ("discovery", "discovery")
    OTHER = ("other", "other")


@dataclass(frozen=True, slots=True)
class Finding:
    """Something wrong or notable at ADDRESS, in STRUCTURE, said in a plain sentence.

    KIND names the invariant; EXPECTED and FOUND (when set) are what glibc's
    invariant wants and what memory holds.  ADDRESS is where the bad data lives
    (the chunk or slot whose field is wrong), not where a walk noticed it.
    """

    severity: Severity
    address: int
    structure: str
    message: str
    kind: Kind = Kind.OTHER
    expected: str = ""
    found: str = ""

    def __str__(self) -> str:
        where = f" at {self.address:#x}" if self.address else ""
        return f"{self.severity.value}: {self.structure}{where}: {self.message}"


@dataclass(frozen=True, slots=True)
class BinList:
    """One free list of an arena (a fastbin, the unsorted bin, a small or large bin).

    ``chunks`` are chunk addresses in list order (from the head's fd);
    ``raw_sizes`` the size fields as stored.  ``complete`` is False when the walk
    stopped at damage (see the arena's findings); the numbers then cover the
    part that was walked.
    """

    kind: BinKind
    index: int
    head: int
    chunks: Sequence[int]       # array('Q') from the walkers: 8 bytes an entry (lists may hold millions)
    raw_sizes: Sequence[int]
    complete: bool = True
    # computed once from raw_sizes
    sizes: Sequence[int] = field(init=False, compare=False, repr=False)
    total: int = field(init=False, compare=False, repr=False)
    raw_total: int = field(init=False, compare=False, repr=False)
    min_size: int = field(init=False, compare=False, repr=False)
    max_size: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        sizes = array("Q", [s & ~7 for s in self.raw_sizes])
        for name, value in (("sizes", sizes), ("total", sum(sizes)), ("raw_total", sum(self.raw_sizes)),
                            ("min_size", min(sizes, default=0)), ("max_size", max(sizes, default=0))):
            object.__setattr__(self, name, value)

    @property
    def count(self) -> int:
        return len(self.chunks)


@dataclass(frozen=True, slots=True)
class Heap:
    """A heap_info-headed mapping of a thread arena (or the main arena's sbrk region)."""

    address: int
    size: int
    mprotect_size: int
    ar_ptr: int
    prev: int
    pagesize: int | None = None


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Thread:
    """A thread of the target, its arena and its tcache."""

    number: int                 # gdb's thread number
    lwp: int
    fs_base: int
    arena: int | None           # value of the thread_arena TLS variable (None: never allocated)
    tcache_pointer: int | None  # value of the tcache TLS variable
    tcache: Tcache | None
    tls_lost: bool = False      # the core holds no copy of the thread's TLS (its stack was written as zeros)


def thread_numbers(numbers: list[int]) -> str:
    """'2-9' for a run of gdb thread numbers, else '2, 4, 7'."""
    if len(numbers) > 2 and numbers[-1] - numbers[0] == len(numbers) - 1:
        return f"{numbers[0]}-{numbers[-1]}"
    return ", ".join(map(str, numbers))


@dataclass(frozen=True, slots=True)
class MallocPar:
    """The fields of glibc's ``mp_`` that heapwalk reads (None where the version lacks them)."""

    address: int
    values: dict[str, int]

    def get(self, name: str) -> int | None:
        return self.values.get(name)


@dataclass(frozen=True, slots=True)
class Fact:
    """A discovered fact and how it was found (symbol, heuristic, override)."""

    name: str
    value: object
    found_by: str


@dataclass(frozen=True, slots=True)
class HeapState:
    """Everything heapwalk decoded from one target at one instant."""

    target: str
    glibc_version: tuple[int, int]
    layout_name: str
    main_arena: int
    mp: MallocPar | None
    arenas: tuple[Arena, ...]
    threads: tuple[Thread, ...]
    facts: tuple[Fact, ...] = ()
    findings: tuple[Finding, ...] = field(default=())
    accounts: dict = field(default_factory=dict)  # arena address -> chunkwalk.Account, when walked
    trims: dict = field(default_factory=dict)     # arena address -> trim.TrimEstimate, when walked
    mmapped: list = field(default_factory=list)   # chunkwalk.MmappedChunk found in memory, when walked
    findings_extra: list = field(default_factory=list)  # findings of the chunk walk not tied to one arena
    glibc_label: str = ""           # "2.36", or the range memory showed when the version is unknown
    heap_max_size: int = 64 << 20   # size and alignment of a thread arena's heap reservation
    scanned_tcaches: tuple[Tcache, ...] = ()  # tcache structs found in the arenas when threads' TLS is lost
    lists_stopped: bool = False     # reading the free lists was stopped (Ctrl-C): later arenas are left out

    @property
    def version_text(self) -> str:
        return self.glibc_label or "%d.%d" % self.glibc_version

    def arena_at(self, address: int) -> Arena | None:
        return next((a for a in self.arenas if a.address == address), None)

    @property
    def interrupted(self) -> bool:
        """Was the chunk walk, or the reading of the free lists before it, stopped (Ctrl-C)?"""
        return any(f.kind is Kind.INTERRUPTED for f in self.findings_extra)

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
        out.extend(self.findings_extra)
        return tuple(out)
