"""jemalloc's heap as heapwalk found it: plain frozen dataclasses, named as malloc_stats_print names what
they hold (pactive, pdirty, curregs, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from heapwalk.common.findings import Fact, Finding
from heapwalk.jemalloc.extents import ExtentTable
from heapwalk.inferior.residency import Residency

__all__ = ["JeBin", "JeLarge", "JeExtents", "JeArena", "JeThread", "JeState", "SlabTotals"]


@dataclass(frozen=True)
class JeBin:
    """One small size class of one arena: its statistics (summed over the bin's shards).  In a build without
    statistics the counts of operations are None (not kept), and what is in use is counted from the slabs."""

    index: int
    size: int                   # region size
    nregs: int                  # regions per slab
    nmalloc: int | None
    ndalloc: int | None
    nrequests: int | None
    curregs: int                # regions in use
    nfills: int | None
    nflushes: int | None
    nslabs: int | None
    nreslabs: int | None
    curslabs: int               # slabs in use
    nonfull_slabs: int
    slab_pages: int = 1         # pages of one slab

    @property
    def utilization(self) -> float:
        """The share of the slabs' regions in use (0 when the bin has no slab)."""
        return self.curregs / (self.curslabs * self.nregs) if self.curslabs else 0.0


@dataclass(frozen=True)
class JeLarge:
    """One large size class of one arena: its counters as the arena keeps them (None in a build without
    statistics, where LIVE is counted from the extents instead)."""

    size: int
    nmalloc: int | None         # served by the arena (tcache fills included)
    ndalloc: int | None
    nrequests: int | None       # requests the tcache merged in, beyond nmalloc
    nflushes: int | None
    live: int | None = None     # the active extents of this class, where no counters are kept
    active_bytes: int | None = None  # their bytes (5.3.1, whose large allocations need not fill their class:
    #                                  opt.disable_large_size_classes rounds them up to pages only)

    @property
    def bytes(self) -> int:
        """The bytes of this class's allocations alive now, as malloc_stats_print's large "allocated" sums them."""
        return self.active_bytes if self.active_bytes is not None else self.curlextents * self.size

    @property
    def curlextents(self) -> int:
        """Allocations of this class alive now (none when the counters are damaged so that more were freed than
        allocated: check reports that)."""
        if self.live is not None:
            return self.live
        return max(0, self.nmalloc - self.ndalloc)


@dataclass(frozen=True)
class JeExtents:
    """The free extents of one page size class: how many, and their bytes, dirty, muzzy and retained."""

    ndirty: int
    nmuzzy: int
    nretained: int
    dirty_bytes: int
    muzzy_bytes: int
    retained_bytes: int


@dataclass(frozen=True)
class JeArena:
    """One arena (arenas[index]) and what its statistics and extent containers hold."""

    index: int
    address: int
    nthreads: int
    pactive: int                # pages in active extents
    pdirty: int                 # pages in dirty extents: freed, not yet purged, still resident
    pmuzzy: int                 # pages purged lazily (MADV_FREE), not yet reclaimed by the kernel
    retained: int               # bytes of virtual memory kept mapped after purging
    dirty_decay_ms: int
    muzzy_decay_ms: int
    dirty_npurge: int | None    # the counts of purges: None in a build without statistics
    dirty_nmadvise: int | None
    dirty_purged: int | None
    muzzy_npurge: int | None
    muzzy_nmadvise: int | None
    muzzy_purged: int | None
    bins: tuple[JeBin, ...]
    mapped: int = 0             # bytes mapped: the arena's extents and its base's metadata blocks
    base: int | None = 0        # bytes of metadata allocated from the arena's base (None: not kept)
    internal: int = 0           # bytes of jemalloc's internal allocations in the arena (without statistics:
    #                             those heapwalk finds, the thread caches' stacks)
    resident: int | None = 0    # resident bytes: metadata, active and dirty pages (5.2.1: and muzzy)
    metadata_thp: int | None = 0    # the base's transparent huge pages
    large: tuple[JeLarge, ...] = ()
    extents: tuple[JeExtents, ...] = ()     # by page size class
    tcache_bytes: int | None = None         # bytes cached by the thread caches registered with the arena, as
    #                                         its statistics count them (5.2.1: the small bins only)
    findings: tuple[Finding, ...] = ()
    dirty_clock: tuple[int, int] = (0, 0)   # the dirty pages' decay: (epoch, deadline) in ns of CLOCK_MONOTONIC
    muzzy_clock: tuple[int, int] = (0, 0)   # the muzzy pages' (0, 0: never set up)
    base_blocks: tuple[tuple[int, int], ...] = ()   # (address, size) of each block its base mapped (metadata)
    free_lists: tuple = ()                  # its rings of free extents as walked (`freelists.ListedExtents`)
    metadata_edata: int | None = None       # of `base`, the bytes for extent headers and for the radix tree's
    metadata_rtree: int | None = None       # nodes (5.3.1 counts them apart; None before, or not kept)
    abandoned_vm: int | None = None         # bytes of address space jemalloc gave up on (None: not kept)
    extent_avail: int | None = None         # spare extent headers the arena keeps (None: 5.1.0 does not count)
    created_ns: int | None = None           # when the arena was made, on jemalloc's clock (CLOCK_MONOTONIC)
    page: int = 4096                        # the build's page, the unit of pactive, pdirty and pmuzzy

    @property
    def active_bytes(self) -> int:
        """The bytes of its active pages."""
        return self.pactive * self.page

    @property
    def dirty_bytes(self) -> int:
        """The bytes of its dirty pages."""
        return self.pdirty * self.page

    @property
    def muzzy_bytes(self) -> int:
        """The bytes of its muzzy pages."""
        return self.pmuzzy * self.page

    def small(self) -> dict[str, int | None]:
        """The small classes together, as malloc_stats_print sums them: bytes in use and the counters (None:
        not kept)."""
        return {"allocated": sum(b.curregs * b.size for b in self.bins),
                **{k: _total(getattr(b, k) for b in self.bins)
                   for k in ("nmalloc", "ndalloc", "nrequests", "nfills", "nflushes")}}

    def slab_bytes(self) -> int:
        """The bytes of its slabs: each bin's slabs in use times the pages of one."""
        return sum(b.curslabs * b.slab_pages * self.page for b in self.bins)

    def large_extents(self) -> int:
        """Large allocations alive now."""
        return sum(c.curlextents for c in self.large)

    def active_slack(self) -> int:
        """Active bytes beyond its slabs and large allocations: with cache_oblivious, one page on each large
        allocation, so between 0 and large_extents() pages when the counters agree."""
        return self.active_bytes - self.slab_bytes() - self.large_totals()["allocated"]

    def large_totals(self) -> dict[str, int | None]:
        """The large classes together, as malloc_stats_print sums them (a tcache fill is one nmalloc; None: not
        kept)."""
        return {"allocated": sum(c.bytes for c in self.large),
                "nmalloc": _total(c.nmalloc for c in self.large), "ndalloc": _total(c.ndalloc for c in self.large),
                "nrequests": _total(None if c.nmalloc is None else c.nmalloc + c.nrequests for c in self.large),
                "nfills": _total(c.nmalloc for c in self.large), "nflushes": _total(c.nflushes for c in self.large)}


def _total(values) -> int | None:
    """The sum of counters, None when any of them is not kept."""
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


@dataclass(frozen=True)
class SlabTotals:
    """The slabs of one size class: how many, how many not full, regions used and regions, free bytes."""

    slabs: int
    nonfull: int
    used: int
    regions: int
    free: int


@dataclass(frozen=True)
class JeThread:
    """A thread of the target, seen through its tsd (jemalloc's TLS block)."""

    number: int                 # gdb's thread number
    lwp: int
    tsd: int | None             # the tsd's address (None: the tsd offset is unknown)
    state: int | None           # tsd state: 0 nominal .. 6 never initialised
    arena: int | None           # the index of the arena it allocates from (None: not bound yet)
    allocated: int              # bytes it has allocated, and freed, since it started
    deallocated: int
    ticker: bool | None         # does it hold the decay ticker of its arena? (None: unknown)
    tcache_arena: int | None = None         # the arena its thread cache is registered with
    tcache: tuple[tuple[int, int], ...] = ()    # (class size, regions cached) of each non-empty cache bin
    tcache_origin: tuple[tuple[int, int], ...] = ()     # (arena, bytes): where the cached regions came from
    name: str | None = None                 # its name (comm), when the target says
    internal: tuple[int, ...] = ()          # jemalloc's own allocations for the thread: the region that holds its
    #                                         thread cache's stacks; 5.2.1's array of its decay tickers
    tsd_size: int = 0                       # the bytes of its tsd

    @property
    def tcache_bytes(self) -> int:
        """The bytes its thread cache holds."""
        return sum(size * count for size, count in self.tcache)


@dataclass(frozen=True)
class JeState:
    """Everything heapwalk decoded of jemalloc in one target at one instant."""

    target: str
    version: str                # the library's own version string
    layout_name: str
    arenas: tuple[JeArena, ...]
    threads: tuple[JeThread, ...]
    facts: tuple[Fact, ...] = ()
    findings: tuple[Finding, ...] = ()
    opt: dict = field(default_factory=dict)     # run-time options by mallctl name (opt.narenas, ...)
    extents: ExtentTable | None = None          # every extent, from the radix tree (None: the tree was not found)
    residency: Residency | None = None          # which pages were in RAM, when the target says
    background_thread: bool | None = None       # do background threads run now (mallctl "background_thread",
    #                                             set at run time; None: not known)
    clock_ns: int | None = None                 # CLOCK_MONOTONIC at the snapshot (None: not known)
    conf_variable: str = "MALLOC_CONF"          # the environment variable its options are read from
    cached: Mapping[int, int] = field(default_factory=dict)     # region a thread cache holds -> the thread
    statistics: bool = True                     # does the build keep statistics (False: --disable-stats, so the
    #                                             figures in use are counted from the extents, and the counts of
    #                                             operations are None)
    page: int = 4096                            # the build's page

    @property
    def background_running(self) -> bool | None:
        """Whether jemalloc's background threads purge: the run-time state, else opt.background_thread."""
        if self.background_thread is not None:
            return self.background_thread
        value = self.opt.get("background_thread")
        return value if isinstance(value, bool) else None

    def cached_from(self, index: int) -> int:
        """The bytes of arena INDEX's regions that the threads' caches hold (whichever thread's)."""
        return sum(size for t in self.threads for arena, size in t.tcache_origin if arena == index)

    def in_use(self, a: JeArena) -> int:
        """The bytes of arena A's regions the program holds: its small and large allocations, less what the
        thread caches hold of them."""
        held = a.small()["allocated"] + a.large_totals()["allocated"] - self.cached_from(a.index)
        return max(0, min(held, a.active_bytes))    # never more than its active pages, damaged counters or not

    def metadata(self) -> dict[str, int]:
        """jemalloc's own metadata as malloc_stats_print counts it (``metadata`` = base + internal; None without
        statistics, where what the base allocated is not kept), and what the overhead column holds beside it:
        the base blocks mapped, and the pages cache_oblivious adds to large allocations."""
        pages = sum(a.active_bytes + a.dirty_bytes + a.muzzy_bytes for a in self.arenas)
        base = None if any(a.base is None for a in self.arenas) else sum(a.base for a in self.arenas)
        internal = sum(a.internal for a in self.arenas)
        return {"metadata": None if base is None else base + internal, "base": base, "internal": internal,
                "base_mapped": max(0, sum(a.mapped for a in self.arenas) - pages),
                "pads": sum(max(0, a.active_slack()) for a in self.arenas)}

    def slabs_by_size(self) -> dict[int, SlabTotals]:
        """Every arena's slabs together, by region size (sizes with a slab in use only)."""
        out: dict[int, SlabTotals] = {}
        for b in (b for a in self.arenas for b in a.bins if b.curslabs):
            row = out.get(b.size, SlabTotals(0, 0, 0, 0, 0))
            used = max(0, min(b.curregs, b.curslabs * b.nregs))   # damaged counters stay within their slabs
            out[b.size] = SlabTotals(row.slabs + b.curslabs, row.nonfull + min(b.nonfull_slabs, b.curslabs),
                                     row.used + used, row.regions + b.curslabs * b.nregs,
                                     row.free + b.curslabs * b.slab_pages * self.page - used * b.size)
        return out

    def arena(self, index: int) -> JeArena | None:
        return next((a for a in self.arenas if a.index == index), None)

    def all_findings(self) -> tuple[Finding, ...]:
        """The state's findings, then each arena's."""
        return self.findings + tuple(f for a in self.arenas for f in a.findings)
