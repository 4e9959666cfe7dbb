"""The report: where every byte of every arena is, a free-chunk histogram, the trim estimate, and a verdict.

`build_report` reads any allocator's `heapwalk.view.HeapView` (glibc's from a state decoded
with its chunk walk) and returns plain numbers and sentences; `heapwalk.output.tables`
lays them out and `heapwalk.output.jsondoc` writes them.  The verdict says only what
the numbers support: fragmentation (free memory malloc holds) or memory in
use (live data or a leak), which arenas hold it, what malloc_trim(0) would
give back, and the remedies that fit.  When a leak scan ran (`heapwalk.analysis.leaks`), the verdict
weighs what it found too: a leak, fragmentation, both or neither, each with its bytes; and what the memory in
use is (`heapwalk.analysis.inuse`) rides along for the tables and the JSON.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from heapwalk.analysis.inuse import InUse, LeakTotals
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
    residency: str = ""                     # where the resident figures come from ("": the target cannot say)
    mmapped_resident: int | None = None
    in_use_groups: InUse | None = None      # the program's blocks by size and signature (None: not grouped)
    leaks: LeakTotals | None = None         # what a leak scan found (None: no scan)

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
        """Free bytes in RAM (top included), when known."""
        return sum(a.idle_resident or 0 for a in self.arenas) if self.residency else None

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
        """Does the leak scan find enough leaked to be a cause: a MiB or more, and 5% or more of what is in use?"""
        lt = self.leaks
        return lt is not None and lt.leaked_bytes >= MiB and lt.leaked_bytes >= 0.05 * lt.in_use_bytes

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


def _costs(a: ArenaView, ram: bool) -> tuple[int, int]:
    """(bytes held, bytes free with top) of arena A that cost memory: those in RAM when RAM is known, else all."""
    return (a.resident or 0, a.idle_resident or 0) if ram else (a.system, a.idle)


def arena_max_saving(rep: Report, cap: int) -> tuple[int, int, int] | None:
    """What MALLOC_ARENA_MAX=CAP would have saved: (how many arenas it leaves out, the least and the most
    their free memory could be), over the free bytes in RAM when known; None when there are not more
    arenas.  A range, because which thread arenas a cap leaves out depends on the order threads came in
    (the main arena is always there)."""
    ram = bool(rep.residency)
    idle = sorted(_costs(a, ram)[1] for a in rep.arenas if a.kind == "thread")
    beyond = len(idle) + 1 - cap
    if beyond <= 0:
        return None
    return beyond, sum(idle[:beyond]), sum(idle[-beyond:])


def _arena_max_sentence(rep: Report) -> str:
    """The thread arenas' share of the free memory, and what capping their number would have saved."""
    ram = bool(rep.residency)
    threads = [a for a in rep.arenas if a.kind == "thread"]
    held, idle = (sum(x) for x in zip(*(_costs(a, ram) for a in threads)))
    where = " in RAM" if ram else ""
    text = (f"{len(threads)} thread arenas hold {human(held)}{where}, {human(idle)} of it free: each thread that "
            "hits a locked arena gets its own, and their free memory is not shared. MALLOC_ARENA_MAX=2 (or 4) "
            "caps the arena count")
    savings = [(cap, arena_max_saving(rep, cap)) for cap in (2, 4)]
    parts = [f"with {cap}, {n} arena{'s' if n > 1 else ''} fewer, {human(lo)}" + (f" to {human(hi)}" if hi != lo
             else "") for cap, found in savings if found for n, lo, hi in [found]]
    if parts:
        text += (f"; it would have saved the free memory{where} of the arenas beyond the cap: " + "; ".join(parts)
                 + (" (a range: which arenas are left out depends on the order threads came in)" if len(threads) > 1
                    else ""))
    return text + "."


def _fragmentation(rep: Report, held: int, idle: int, ram: bool) -> list[str]:
    """The sentences of a heap whose free memory (in RAM, when known) is a quarter or more of what it holds."""
    if ram:
        free_res = sum(min(a.free_resident or 0, a.free_total) for a in rep.arenas)
        out = [f"{_fragmentation_title(rep)}: {human(idle)} of the {human(held)} of malloc's arenas in RAM "
               f"({_pct(idle, held)}) is free (free chunks {human(free_res)}, top chunks {human(idle - free_res)}); "
               f"{human(rep.in_use)} is in use."]
    else:
        out = [f"{_fragmentation_title(rep)}: {human(idle)} of the {human(held)} malloc holds in its arenas "
               f"({_pct(idle, held)}) is free (free chunks {human(rep.free)}, top chunks {human(rep.top)}); "
               f"{human(rep.in_use)} is in use."]
    threads = [a for a in rep.arenas if a.kind == "thread"]
    if len(threads) > 1 and sum(_costs(a, ram)[0] for a in threads) >= 0.5 * held:
        out.append(_arena_max_sentence(rep))
    small_free = sum(b.bytes for b in rep.histogram if b.high <= 4096)
    if rep.trim >= 0.1 * idle and rep.trim >= MiB:
        out.append(f"malloc_trim(0) would give back {human(rep.trim)} now. Calling it periodically (or after "
                   "peaks), or a lower M_TRIM_THRESHOLD, returns such memory without a restart.")
    elif ram and rep.trim_kept.get("sub_page", 0) >= 0.5 * idle:
        out.append(f"{human(rep.trim_kept['sub_page'])} of free memory lies in pieces under a page (small free "
                   "chunks, and the ends and links of larger ones), which malloc_trim(0) cannot return: it would "
                   f"give back only {human(rep.trim)}. Fewer arenas (above), fewer long-lived small allocations, "
                   "or an allocator that returns small-object pages (jemalloc, tcmalloc) would shrink it.")
    elif small_free >= 0.5 * rep.free:
        out.append(f"{human(small_free)} of the free memory is in chunks under 4 KiB "
                   f"({rep.free_chunks} free chunks; fragmentation {rep.fragmentation:.2f}): malloc_trim(0) "
                   f"would return only {human(rep.trim)}. Only fewer long-lived small allocations, or an "
                   "allocator that returns small-object pages (jemalloc, tcmalloc), would shrink it.")
    main = next((a for a in rep.arenas if a.kind == "main"), None)
    top = (min(main.top_resident or 0, main.top) if ram else main.top) if main else 0
    if main and top >= 0.25 * held and main.reclaim < top // 2:
        out.append(f"The main arena's top chunk holds {human(top)}{' in RAM' if ram else ''} that trim cannot "
                   "lower: in-use chunks above it pin the break.")
    return out


def _fragmentation_title(rep: Report) -> str:
    return "Fragmentation and a leak" if rep.leaking else "Fragmentation, not a leak"


def _leaked_part(rep: Report) -> str:
    """How much of the memory in use the leak scan found leaked, as a clause."""
    lt = rep.leaks
    assert lt is not None
    return (f"{human(lt.leaked_bytes)} of the {human(lt.in_use_bytes)} in the program's chunks "
            f"({_pct(lt.leaked_bytes, lt.in_use_bytes)}) is in {lt.leaked_count} chunks that nothing reachable "
            "points to any more")


def _in_use_sentence(rep: Report, held: int, free_part: str) -> str:
    """The sentence of a heap mostly in use: live data or a leak, as far as the leak scan (if any) tells."""
    share = f"{human(rep.in_use)} of the {human(held)} malloc holds ({_pct(rep.in_use, held)}) is in use"
    if rep.leaks is None:
        return (f"Memory in use, not fragmentation: {human(rep.in_use)} of the {human(held)} malloc holds "
                f"({_pct(rep.in_use, held)}) is in chunks the program still holds, and {free_part}. "
                "That is live data or a leak: 'heapwalk leaks' in gdb finds the chunks nothing points to; two "
                "snapshots taken some time apart ('heapwalk diff A B') show what grows.")
    if rep.leaking:
        return f"A leak, not fragmentation: {share} and {free_part}; {_leaked_part(rep)}."
    return (f"Live data, neither a leak nor fragmentation: {share} and {free_part}, and the leak scan reaches "
            "nearly all of it from the program's roots. What it is shows above, by size and signature; two snapshots "
            "taken some time apart ('heapwalk diff A B') show which of them grows.")


def _scan_sentence(rep: Report) -> str:
    """What the leak scan found, and where to look next."""
    lt = rep.leaks
    assert lt is not None
    unread = (f" ({human(lt.unread_bytes)} of memory could not be read: chunks reached only through it count as "
              "leaked)") if lt.unread_bytes else ""
    if not lt.leaked_count:
        return f"The leak scan reached every chunk in use from the program's roots: nothing leaked{unread}."
    where = ""
    per_arena = sorted(lt.per_arena.items(), key=lambda kv: -kv[1][1])
    if len(per_arena) > 1 and per_arena[0][1][1]:
        number, (_, size) = per_arena[0]
        where = f"; arena {number} holds {human(size)} of it"
    text = (f"The leak scan found {human(lt.leaked_bytes)} in {lt.leaked_count} chunks nothing reachable points to "
            f"({_pct(lt.leaked_bytes, lt.in_use_bytes)} of the memory in use), {lt.unreferenced_count} of them "
            f"unreferenced (where each leaked structure starts){where}{unread}")
    if rep.leaking:
        return text + ": 'heapwalk leaks' lists them by size and signature, with the biggest unreferenced."
    return text + ": too little to explain the memory held; 'heapwalk leaks' lists them."


def _verdict(rep: Report) -> list[str]:
    """Plain sentences, each backed by the numbers above it.  Where the target says which pages are in RAM,
    free memory counts only where it is in RAM: what is not costs address space, not memory."""
    # what the walk found is the whole when a damaged system_mem says less: shares stay within 100%
    held = max(rep.system, rep.in_use + rep.free + rep.top + rep.overhead)
    if not held:
        return ["malloc holds no memory in its arenas."]
    ram = bool(rep.residency)
    idle = rep.free + rep.top
    held_cost, idle_cost = (rep.resident or 0, rep.idle_resident or 0) if ram else (held, idle)
    gone = idle - idle_cost
    out = []
    fragmented = idle_cost >= 0.25 * held_cost and idle_cost >= MiB
    if fragmented and idle_cost >= gone:
        out += _fragmentation(rep, held_cost, idle_cost, ram)
    elif ram and gone >= 0.25 * held and gone >= MiB:
        out.append(f"Free memory, but not in RAM: {human(gone)} of the {human(idle)} free in malloc's arenas is "
                   "no longer resident (given back by malloc_trim or free, or never touched), so it takes address "
                   "space, not memory, and needs no remedy; of the "
                   f"{human(held_cost)} of the arenas in RAM, {human(idle_cost)} is free and {human(rep.in_use)} is "
                   "in use. If RSS still grows, two snapshots taken some time apart ('heapwalk diff A B') show what "
                   "grows.")
        if fragmented:          # what is still in RAM of the free memory, and its remedies
            out += _fragmentation(rep, held_cost, idle_cost, ram)[1:]
    elif rep.in_use >= 0.75 * held:
        free_part = f"only {human(idle_cost)} of free memory is in RAM" if ram else f"only {human(idle)} is free"
        out.append(_in_use_sentence(rep, held, free_part))
    elif rep.leaking:
        out.append(f"A leak, not fragmentation: {_leaked_part(rep)}.")
    else:
        free_part = f"{human(idle_cost)} free in RAM" if ram else f"{human(idle)} free"
        out.append(f"{human(rep.in_use)} in use and {free_part} of the {human(held_cost if ram else held)} "
                   f"malloc holds{' in RAM' if ram else ''}: neither fragmentation nor "
                   f"{'growth' if rep.leaks is None else 'a leak'} stands out.")
    if rep.leaks is not None:
        out.insert(1, _scan_sentence(rep))
    if ram and out[0].startswith("Fragmentation") and gone >= MiB:
        out.insert(1, f"A further {human(gone)} is free but not in RAM (given back, or never touched): address "
                      "space, not memory.")
    if rep.mmapped_bytes >= 0.25 * (held + rep.mmapped_bytes) and rep.mmapped_bytes >= MiB:
        out.append(f"{human(rep.mmapped_bytes)} is in {rep.mmapped_count} mmapped chunks (requests above "
                   "M_MMAP_THRESHOLD): they return to the system when freed.")
    return out


def build_report(view: HeapView, in_use: InUse | None = None, leaks: LeakTotals | None = None) -> Report:
    """The report of an allocator's view of its heap; IN_USE and LEAKS when the blocks in use were grouped and
    scanned for leaks."""
    all_sizes = sum(view.free_sizes.values(), Counter())
    histogram, largest, count = _histogram(all_sizes)
    rep = Report(view.allocator, list(view.arenas), view.large_count, view.large_bytes, histogram, largest, count,
                 view.arena_limit, view.arenas_idle)
    rep.classes = by_class(all_sizes, view.size_classes)
    rep.trim_total = view.reclaim_total
    rep.trim_kept = dict(view.reclaim_kept)
    rep.per_arena = {n: _histogram(sizes)[0] for n, sizes in view.free_sizes.items()}
    rep.residency, rep.mmapped_resident = view.residency, view.large_resident
    rep.in_use_groups, rep.leaks = in_use, leaks
    rep.verdict = list(view.advice) or _verdict(rep)
    return rep
