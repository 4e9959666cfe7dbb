"""jemalloc's heap as heapwalk found it: plain frozen dataclasses, named as malloc_stats_print names what
they hold (pactive, pdirty, curregs, ...)."""

from __future__ import annotations

from dataclasses import dataclass

from heapwalk.findings import Fact, Finding

__all__ = ["JeBin", "JeArena", "JeThread", "JeState"]


@dataclass(frozen=True, slots=True)
class JeBin:
    """One small size class of one arena: its statistics (summed over the bin's shards)."""

    index: int
    size: int                   # region size
    nregs: int                  # regions per slab
    nmalloc: int
    ndalloc: int
    nrequests: int
    curregs: int                # regions in use
    nfills: int
    nflushes: int
    nslabs: int
    nreslabs: int
    curslabs: int               # slabs in use
    nonfull_slabs: int

    @property
    def utilization(self) -> float:
        """The share of the slabs' regions in use (0 when the bin has no slab)."""
        return self.curregs / (self.curslabs * self.nregs) if self.curslabs else 0.0


@dataclass(frozen=True, slots=True)
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
    dirty_npurge: int
    dirty_nmadvise: int
    dirty_purged: int
    muzzy_npurge: int
    muzzy_nmadvise: int
    muzzy_purged: int
    bins: tuple[JeBin, ...]
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class JeState:
    """Everything heapwalk decoded of jemalloc in one target at one instant."""

    target: str
    version: str                # the library's own version string
    layout_name: str
    arenas: tuple[JeArena, ...]
    threads: tuple[JeThread, ...]
    facts: tuple[Fact, ...] = ()
    findings: tuple[Finding, ...] = ()

    def arena(self, index: int) -> JeArena | None:
        return next((a for a in self.arenas if a.index == index), None)
