"""What heapwalk says about a target, whatever the allocator: findings (something wrong or notable at an
address, in a plain sentence, with its severity and the invariant it breaks) and facts (something discovered,
and how)."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass

__all__ = ["Severity", "Kind", "Finding", "Fact", "CheckResult"]


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
    NO_DECAY = ("no_decay", "dirty pages that never decay: no thread of the arena holds a decay ticker")
    DISCOVERY = ("discovery", "discovery")
    OTHER = ("other", "other")


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Fact:
    """A discovered fact and how it was found (symbol, heuristic, override)."""

    name: str
    value: object
    found_by: str


@dataclass(frozen=True)
class CheckResult:
    """What a check of an allocator found: its findings, errors first then by address, and the numbers they make
    partial."""

    findings: tuple[Finding, ...]
    partial: tuple = ()          # the `heapwalk.view.Partial` notes of the numbers it makes partial

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity is Severity.WARNING]

    @property
    def clean(self) -> bool:
        """No damage found (warnings, such as a held mutex, do not make a heap damaged)."""
        return not self.errors

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(f.kind.ident for f in self.findings))
