"""The report: where every byte of every arena is, a free-chunk histogram, the trim estimate, and a verdict.

`build_report` reads a `HeapState` decoded with its chunk walk (accounts and
trim estimates) and returns plain numbers and sentences; `heapwalk.output.tables`
lays them out and `heapwalk.output.jsondoc` writes them.  The verdict says only what
the numbers support: fragmentation (free memory malloc holds) or memory in
use (live data or a leak), which arenas hold it, what malloc_trim(0) would
give back, and the remedies that fit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from heapwalk.glibc.model import FREE_STATES, ChunkState
from heapwalk.glibc.model import Arena, HeapState

__all__ = ["ArenaRow", "Bucket", "Report", "build_report", "human"]

MiB = 1 << 20


def human(n: float) -> str:
    """Bytes in binary units with three significant figures: 1536 -> '1.50 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
        value /= 1024
    return f"{value} TiB"


@dataclass
class ArenaRow:
    """One arena's line: where its system memory goes."""

    number: int
    address: int
    kind: str
    threads: int
    heaps: int
    system: int
    in_use: int                  # in-use chunks, tcache structs
    free: dict[str, int]         # tcache, fast, unsorted, small, large (bytes)
    top: int
    overhead: int
    trim: int                    # resident bytes malloc_trim(0) would return
    balanced: bool

    @property
    def free_total(self) -> int:
        return sum(self.free.values())


@dataclass
class Bucket:
    """Free chunks of sizes [low, high): how many and how many bytes."""

    low: int
    high: int
    count: int = 0
    bytes: int = 0


@dataclass
class Report:
    arenas: list[ArenaRow]
    mmapped_count: int
    mmapped_bytes: int
    histogram: list[Bucket]
    largest_free: int
    free_chunks: int
    arena_limit: str
    arenas_on_free_list: int
    verdict: list[str] = field(default_factory=list)
    classes: list[tuple[str, int, int]] = field(default_factory=list)       # by glibc's bin size classes
    trim_total: int = 0                                                     # address space trim releases
    trim_kept: dict[str, int] = field(default_factory=dict)                 # free bytes trim keeps, by reason
    per_arena: dict[int, list[Bucket]] = field(default_factory=dict)       # arena number -> its histogram

    @property
    def system(self) -> int:
        return sum(a.system for a in self.arenas)

    @property
    def in_use(self) -> int:
        return sum(a.in_use for a in self.arenas)

    @property
    def free(self) -> int:
        return sum(a.free_total for a in self.arenas)

    @property
    def top(self) -> int:
        return sum(a.top for a in self.arenas)

    @property
    def overhead(self) -> int:
        return sum(a.overhead for a in self.arenas)

    @property
    def trim(self) -> int:
        return sum(a.trim for a in self.arenas)

    @property
    def free_listed(self) -> int:
        """Bytes of the free chunks the lists and tcaches hold: the histogram's total, which its shares, the
        largest free chunk and the fragmentation are computed from, so they stay within 0-100% even when
        damage keeps the walk's totals from matching them."""
        return sum(b.bytes for b in self.histogram)

    @property
    def fragmentation(self) -> float:
        """1 - largest free chunk / all free bytes (0: one free block; near 1: many small pieces), over the
        free chunks the lists hold."""
        return 1 - self.largest_free / self.free_listed if self.free_listed else 0.0

    @property
    def lists_match_walk(self) -> bool:
        """Do the free lists hold the free bytes the chunk walk found (they differ only on damaged heaps)?"""
        return self.free_listed == self.free


#: glibc's size classes of free chunks (x86_64): fastbin sizes, small bins, then the large-bin spacings
GLIBC_CLASSES = ((32, 0x90, "fastbin sizes (32-128 B)"), (0x90, 1024, "small bins (144 B-1 KiB)"),
                 (1024, 3136, "large bins, 64 B apart"), (3136, 10752, "large bins, 512 B apart"),
                 (10752, 45056, "large bins, 4 KiB apart"), (45056, 163840, "large bins, 32 KiB apart"),
                 (163840, 786432, "large bins, 256 KiB apart"), (786432, 1 << 64, "the last large bin"))


def glibc_classes(sizes: Counter) -> list[tuple[str, int, int]]:
    """(class, chunks, bytes) of SIZES (size -> how many) by glibc's bin size classes, non-empty classes only."""
    counts = {name: [0, 0] for _, _, name in GLIBC_CLASSES}
    for size, n in sizes.items():
        name = next((c for lo, hi, c in GLIBC_CLASSES if lo <= size < hi), GLIBC_CLASSES[0 if size < 32 else -1][2])
        counts[name][0] += n
        counts[name][1] += size * n
    return [(name, c, b) for (_, _, name) in GLIBC_CLASSES for c, b in [counts[name]] if c]


def _arena_of(state: HeapState):
    """A function from a chunk address to the number of the arena whose heap holds it (None if none)."""
    ranges = sorted((h.address, h.address + h.size, a.number) for a in state.arenas for h in a.heaps)

    def find(address: int) -> int | None:
        return next((n for lo, hi, n in ranges if lo <= address < hi), None)
    return find


def free_sizes_by_arena(state: HeapState) -> dict[int, Counter]:
    """Arena number -> the sizes of its free chunks (bins, fastbins, and the tcache entries in its heaps),
    as size -> how many."""
    out = _tcache_sizes_by_arena(state)
    for a in state.arenas:
        for lst in a.free_lists():
            out[a.number].update(lst.sizes)
    return out


def _tcache_sizes_by_arena(state: HeapState) -> dict[int, Counter]:
    """Arena number -> the sizes of the tcache entries that lie in its heaps, as size -> how many."""
    out: dict[int, Counter] = {a.number: Counter() for a in state.arenas}
    find = _arena_of(state)
    for _, tcache in state.tcaches():
        for b in tcache.bins:
            for entry, size in zip(b.entries, b.sizes or (b.chunk_size,) * len(b.entries)):
                number = find(entry)
                if number is not None:
                    out[number][size] += 1
    return out


def _histogram(sizes: Counter) -> tuple[list[Bucket], int, int]:
    """Power-of-two buckets of SIZES (size -> how many), the largest size and the number of chunks."""
    buckets: dict[int, Bucket] = {}
    for size, n in sizes.items():
        exp = max(size.bit_length() - 1, 5)
        b = buckets.get(exp)
        if b is None:
            b = buckets[exp] = Bucket(1 << exp, 1 << (exp + 1))
        b.count += n
        b.bytes += size * n
    return [buckets[k] for k in sorted(buckets)], max(sizes, default=0), sum(sizes.values())


def _rows(state: HeapState) -> list[ArenaRow]:
    users: dict[int, int] = {}
    for t in state.threads:
        if t.arena:
            users[t.arena] = users.get(t.arena, 0) + 1
    if any(t.tls_lost for t in state.threads):  # thread_arena is unknown for some threads: glibc's own count
        users = {a.address: a.attached_threads for a in state.arenas if a.attached_threads is not None}
    rows = []
    for a in state.arenas:
        acc = state.accounts[a.address]
        trim = state.trims.get(a.address)
        free = {s.value: acc.bytes[s] for s in FREE_STATES if s is not ChunkState.FREE_UNLISTED}
        free["unsorted"] += acc.bytes[ChunkState.FREE_UNLISTED]
        top = acc.bytes[ChunkState.TOP]
        if a.system_mem and acc.unwalked >= a.system_mem:   # not walked (Ctrl-C): what its lists and top hold
            free, top = _listed_free(state, a), a.top_size
        rows.append(ArenaRow(a.number, a.address, a.kind, users.get(a.address, 0), len(a.heaps), a.system_mem,
                             acc.bytes[ChunkState.IN_USE] + acc.bytes[ChunkState.TCACHE_STRUCT], free,
                             top, acc.overhead + acc.bytes[ChunkState.FENCEPOST],
                             trim.resident if trim else 0, acc.balanced))
    return rows


def _listed_free(state: HeapState, arena: Arena) -> dict[str, int]:
    """ARENA's free bytes by kind as its free lists and the tcache entries in its heaps hold them."""
    free = dict.fromkeys(("tcache", "fast", "unsorted", "small", "large"), 0)
    for lst in arena.free_lists():
        free[lst.kind.value] += lst.total
    free["tcache"] = sum(size * n for size, n in _tcache_sizes_by_arena(state)[arena.number].items())
    return free


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def _verdict(rep: Report, state: HeapState) -> list[str]:
    """Plain sentences, each backed by the numbers above it."""
    out = []
    # what the walk found is the whole when a damaged system_mem says less: shares stay within 100%
    held = max(rep.system, rep.in_use + rep.free + rep.top + rep.overhead)
    if not held:
        return ["malloc holds no memory in its arenas."]
    idle = rep.free + rep.top
    threads = [a for a in rep.arenas if a.kind == "thread"]
    thread_system = sum(a.system for a in threads)
    small_free = sum(b.bytes for b in rep.histogram if b.high <= 4096)
    if idle >= 0.25 * held and idle >= MiB:
        out.append(f"Fragmentation, not a leak: {human(idle)} of the {human(held)} malloc holds in its arenas "
                   f"({_pct(idle, held)}) is free (free chunks {human(rep.free)}, top chunks {human(rep.top)}); "
                   f"{human(rep.in_use)} is in use.")
        if len(threads) > 1 and thread_system >= 0.5 * held:
            thread_idle = sum(a.free_total + a.top for a in threads)
            out.append(f"{len(threads)} thread arenas hold {human(thread_system)}, {human(thread_idle)} of it free: "
                       "each thread that hits a locked arena gets its own, and their free memory is not shared. "
                       "MALLOC_ARENA_MAX=2 (or 4) caps the arena count.")
        if rep.trim >= 0.1 * idle and rep.trim >= MiB:
            out.append(f"malloc_trim(0) would give back {human(rep.trim)} now. Calling it periodically (or after "
                       "peaks), or a lower M_TRIM_THRESHOLD, returns such memory without a restart.")
        elif small_free >= 0.5 * rep.free:
            out.append(f"{human(small_free)} of the free memory is in chunks under 4 KiB "
                       f"({rep.free_chunks} free chunks; fragmentation {rep.fragmentation:.2f}): malloc_trim(0) "
                       f"would return only {human(rep.trim)}. Only fewer long-lived small allocations, or an "
                       "allocator that returns small-object pages (jemalloc, tcmalloc), would shrink it.")
        main = next((a for a in rep.arenas if a.kind == "main"), None)
        if main and main.top >= 0.25 * held and main.trim < main.top // 2:
            out.append(f"The main arena's top chunk holds {human(main.top)} that trim cannot lower: "
                       "in-use chunks above it pin the break.")
    elif rep.in_use >= 0.75 * held:
        out.append(f"Memory in use, not fragmentation: {human(rep.in_use)} of the {human(held)} malloc holds "
                   f"({_pct(rep.in_use, held)}) is in chunks the program still holds, and only {human(idle)} is "
                   "free. That is live data or a leak: 'heapwalk chunks --used --min SIZE' shows the largest "
                   "holders; two cores taken some time apart show what grows.")
    else:
        out.append(f"{human(rep.in_use)} in use and {human(idle)} free of the {human(held)} malloc holds: "
                   "neither fragmentation nor growth stands out.")
    if rep.mmapped_bytes >= 0.25 * (held + rep.mmapped_bytes) and rep.mmapped_bytes >= MiB:
        out.append(f"{human(rep.mmapped_bytes)} is in {rep.mmapped_count} mmapped chunks (requests above "
                   "M_MMAP_THRESHOLD): they return to the system when freed.")
    return out


def build_report(state: HeapState) -> Report:
    """The report of a state decoded with walk_chunks=True."""
    rows = _rows(state)
    by_arena = free_sizes_by_arena(state)   # the free chunks of the arenas (2.43's tcache'd mmapped ones are
    all_sizes = sum(by_arena.values(), Counter())                  # counted with the mmapped memory)
    histogram, largest, count = _histogram(all_sizes)
    mp = state.mp
    arena_max = mp.get("arena_max") if mp else None
    limit = (f"{arena_max} (MALLOC_ARENA_MAX / M_ARENA_MAX)" if arena_max
             else "8 x the CPU count (the default; the core does not record the CPU count)")
    rep = Report(rows, *state.mmap_counters(),
                 histogram, largest, count, limit, sum(1 for a in state.arenas if a.on_free_list))
    rep.classes = glibc_classes(all_sizes)
    rep.trim_total = sum(t.total for t in state.trims.values())
    rep.trim_kept = {k: sum(t.kept[k] for t in state.trims.values()) for k in ("tcache", "sub_page", "thread_top",
                                                                             "main_top")}
    rep.per_arena = {n: _histogram(sizes)[0] for n, sizes in by_arena.items()}
    rep.verdict = _verdict(rep, state)
    return rep
