"""The report: where every byte of every arena is, a free-chunk histogram, the trim estimate, and a verdict.

`build_report` reads any allocator's `heapwalk.view.HeapView` (glibc's from a state decoded
with its chunk walk) and returns plain numbers and sentences; `heapwalk.output.tables`
lays them out and `heapwalk.output.jsondoc` writes them.  The verdict says only what
the numbers support: fragmentation (free memory malloc holds) or memory in
use (live data or a leak), which arenas hold it, what malloc_trim(0) would
give back, and the remedies that fit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from heapwalk.view import ArenaView, HeapView, SizeClass

__all__ = ["Bucket", "Report", "build_report", "by_class", "human"]

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
class Bucket:
    """Free chunks of sizes [low, high): how many and how many bytes."""

    low: int
    high: int
    count: int = 0
    bytes: int = 0


@dataclass
class Report:
    """The report's numbers and verdict; ARENAS and what is shared between them come from the view."""

    allocator: str
    arenas: list[ArenaView]
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
        return sum(a.reclaim for a in self.arenas)

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


def by_class(sizes: Counter, classes: tuple[SizeClass, ...]) -> list[tuple[str, int, int]]:
    """(class, chunks, bytes) of SIZES (size -> how many) by the allocator's size CLASSES, non-empty classes
    only; sizes below the first class count in it, sizes above the last in the last."""
    if not classes:
        return []
    counts = {c.name: [0, 0] for c in classes}
    for size, n in sizes.items():
        name = next((c.name for c in classes if c.low <= size < c.high),
                    classes[0 if size < classes[0].low else -1].name)
        counts[name][0] += n
        counts[name][1] += size * n
    return [(c.name, n, b) for c in classes for n, b in [counts[c.name]] if n]


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


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def _verdict(rep: Report) -> list[str]:
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
                   "free. That is live data or a leak: 'heapwalk chunks --used --min SIZE' in gdb shows the "
                   "largest holders; two snapshots taken some time apart ('heapwalk diff A B') show what grows.")
    else:
        out.append(f"{human(rep.in_use)} in use and {human(idle)} free of the {human(held)} malloc holds: "
                   "neither fragmentation nor growth stands out.")
    if rep.mmapped_bytes >= 0.25 * (held + rep.mmapped_bytes) and rep.mmapped_bytes >= MiB:
        out.append(f"{human(rep.mmapped_bytes)} is in {rep.mmapped_count} mmapped chunks (requests above "
                   "M_MMAP_THRESHOLD): they return to the system when freed.")
    return out


def build_report(view: HeapView) -> Report:
    """The report of an allocator's view of its heap."""
    all_sizes = sum(view.free_sizes.values(), Counter())
    histogram, largest, count = _histogram(all_sizes)
    rep = Report(view.allocator, list(view.arenas), view.large_count, view.large_bytes, histogram, largest, count,
                 view.arena_limit, view.arenas_idle)
    rep.classes = by_class(all_sizes, view.size_classes)
    rep.trim_total = view.reclaim_total
    rep.trim_kept = dict(view.reclaim_kept)
    rep.per_arena = {n: _histogram(sizes)[0] for n, sizes in view.free_sizes.items()}
    rep.verdict = list(view.advice) or _verdict(rep)
    return rep
