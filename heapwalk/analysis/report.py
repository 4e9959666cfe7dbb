"""The report: where every byte of every arena is, a histogram of the free pieces, what the allocator could
give back, and its verdict.

`build_report` reads any allocator's `heapwalk.common.view.HeapView` and returns plain numbers; the allocator's own
verdict (glibc's in `heapwalk.glibc.account.verdict`) turns them into sentences; `heapwalk.output.tables` lays them
out and `heapwalk.output.jsondoc` writes them.  When a leak scan ran (`heapwalk.analysis.leaks`), what it
found rides along for the verdict, the tables and the JSON, and so does what the memory in use is
(`heapwalk.analysis.inuse`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from heapwalk.analysis.inuse import InUse, LeakTotals
from heapwalk.common.view import ArenaView, HeapView, SizeClass

__all__ = ["Bucket", "Report", "build_report", "by_class", "counted", "human", "leaking", "scan_sentence",
           "unknown_ram"]

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


def counted(n: int, plural: str) -> str:
    """N things, named by PLURAL (an allocator's word: "arenas", "owners", "segments"), in the singular for one:
    '1 arena', '8 arenas'."""
    word = plural[:-1] if n == 1 and plural.endswith("s") else plural
    return f"{n} {word}"


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
    residency: str = ""                     # where the resident figures come from ("": the target cannot say)
    mmapped_resident: int | None = None
    size_classes: tuple[SizeClass, ...] = ()  # the allocator's size classes of free pieces (none: it has none)
    in_use_groups: InUse | None = None      # the program's blocks by size and signature (None: not grouped)
    leaks: LeakTotals | None = None         # what a leak scan found (None: no scan)
    process_rss: int | None = None          # the whole process's RSS, when known: remedies are weighed against it
    thresholds: dict = field(default_factory=dict)  # the allocator's thresholds (`HeapView.thresholds`)

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
    def resident(self) -> int | None:
        """Bytes of the arenas' memory in RAM, when known."""
        return sum(a.resident or 0 for a in self.arenas) if self.residency else None

    @property
    def idle_resident(self) -> int | None:
        """Free bytes in RAM (top included), when known for every arena."""
        known = [a.idle_resident for a in self.arenas]
        return sum(known) if self.residency and None not in known else None

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
    def leaking(self) -> bool:
        """Does the leak scan find enough leaked to be a cause (`leaking`)?"""
        return leaking(self.leaks)

    @property
    def lists_match_walk(self) -> bool:
        """Do the free lists hold the free bytes the chunk walk found (they differ only on damaged heaps)?"""
        return self.free_listed == self.free


def leaking(lt: LeakTotals | None) -> bool:
    """Does the leak scan LT find enough leaked to be a cause: a MiB or more, and 5% or more of what is in use?"""
    return lt is not None and lt.leaked_bytes >= MiB and lt.leaked_bytes >= 0.05 * lt.in_use_bytes


#: a remedy that would give back less than this share of the process's RSS, or fewer bytes than WORTH_BYTES,
#: is not worth a change (a restart, a setting) where the process's RSS is known
WORTH = 0.05
WORTH_BYTES = 2 * MiB


def worth(rep: Report, amount: int) -> bool:
    """Whether giving back AMOUNT bytes is worth a remedy: always when the process's RSS is not known, else when
    it is at least `WORTH` of it and `WORTH_BYTES`."""
    return rep.process_rss is None or (amount >= WORTH * rep.process_rss and amount >= WORTH_BYTES)


def unknown_ram(who: str) -> str:
    """The sentence a verdict on free memory adds where the target does not say which pages are in RAM (a plain
    core): that its figures are address space, what the remedies would save at most, and what would say.  WHO
    gives memory back ("malloc", "tcmalloc")."""
    return (f"Whether this free memory costs RAM a plain core does not say: what {who} gave back or never touched "
            "holds address space, not memory, and needs no remedy, so what the remedies below would save is at most "
            "these figures; 'heapwalk capture PID' on the running process (or 'heapwalk report --resident-from' its "
            "capture.json, for a core taken at the same moment) says which pages are in RAM.")


def not_worth(rep: Report, amount: int, remedies: str) -> str:
    """The sentence that sets REMEDIES aside: at most AMOUNT bytes, a small share of the process's RSS."""
    return (f"{remedies} would give back at most {human(amount)}, {100 * amount / rep.process_rss:.1f}% of the "
            f"process's {human(rep.process_rss)} RSS: not worth a change here.")


def scan_sentence(lt: LeakTotals, noun: str = "chunk", row: Callable[[int], str] | None = None) -> str:
    """What the leak scan LT found, and where to look next, a block called NOUN (glibc's chunk, jemalloc's
    allocation); ROW names a row of the report's table by its number (an arena's, by default)."""
    unread = (f" ({human(lt.unread_bytes)} of memory could not be read: {noun}s reached only through it count as "
              "leaked)") if lt.unread_bytes else ""
    if not lt.leaked_count:
        return f"The leak scan reached every {noun} in use from the program's roots: nothing leaked{unread}."
    where = ""
    per_arena = sorted(lt.per_arena.items(), key=lambda kv: -kv[1][1])
    if len(per_arena) > 1 and per_arena[0][1][1]:
        number, (_, size) = per_arena[0]
        where = f"; {row(number) if row else f'arena {number}'} holds {human(size)} of it"
    share = f"{100 * lt.leaked_bytes / lt.in_use_bytes:.0f}%" if lt.in_use_bytes else "0%"
    if lt.leaked_count == 1:
        counted = (f"in 1 {noun} nothing reachable points to ({share} of the memory in use), "
                   f"{'unreferenced' if lt.unreferenced_count else 'referenced only from leaked memory'}")
    else:
        counted = (f"in {lt.leaked_count} {noun}s nothing reachable points to ({share} of the memory in use), "
                   f"{lt.unreferenced_count} of them unreferenced (where each leaked structure starts)")
    text = f"The leak scan found {human(lt.leaked_bytes)} {counted}{where}{unread}"
    them = "it" if lt.leaked_count == 1 else "them"
    if leaking(lt):
        return text + f": 'heapwalk leaks' lists {them} by size and signature, with the biggest unreferenced."
    return text + f": too little to explain the memory held; 'heapwalk leaks' lists {them}."


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


def build_report(view: HeapView, in_use: InUse | None = None, leaks: LeakTotals | None = None,
                 verdict: Callable[[Report], list[str]] | None = None, process_rss: int | None = None) -> Report:
    """The report of an allocator's view of its heap; IN_USE and LEAKS when the blocks in use were grouped and
    scanned for leaks; VERDICT (the allocator's) says what the numbers mean, its remedies weighed against the
    PROCESS_RSS when it is known."""
    all_sizes = sum(view.free_sizes.values(), Counter())
    histogram, largest, count = _histogram(all_sizes)
    rep = Report(view.allocator, list(view.arenas), view.large_count, view.large_bytes, histogram, largest, count,
                 view.arena_limit, view.arenas_idle)
    rep.size_classes = view.size_classes
    rep.classes = by_class(all_sizes, view.size_classes)
    rep.trim_total = view.reclaim_total
    rep.trim_kept = dict(view.reclaim_kept)
    rep.per_arena = {n: _histogram(sizes)[0] for n, sizes in view.free_sizes.items()}
    rep.residency, rep.mmapped_resident = view.residency, view.large_resident
    rep.in_use_groups, rep.leaks, rep.process_rss = in_use, leaks, process_rss
    rep.thresholds = dict(view.thresholds)
    rep.verdict = list(verdict(rep)) if verdict is not None else []
    return rep
