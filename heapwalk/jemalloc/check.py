"""'heapwalk check' on jemalloc: the findings of decoding (unreadable arenas, bins and bases, thread caches that
hold a region twice or of the wrong size class, lists that loop), and the counters that must agree with each
other in every arena: the free extents of each page size class add up to the container's page count (dirty,
muzzy, retained); each bin's regions in use are its allocations less its frees and fit in its slabs; no large
class has freed more than it allocated; the active pages hold exactly the slabs and the large allocations
(each with one page more when cache_oblivious is on); and the extents the radix tree maps hold, arena by arena,
what the counters say: the active, dirty, muzzy and retained bytes, and in the active ones the regions and
large allocations in use; and each ring of free extents, walked, holds extents of its state and arena, comes back
to its head, and holds the pages its container counts (`jemalloc.freelists`)."""

from __future__ import annotations

from heapwalk.common.findings import Finding, Severity
from heapwalk.jemalloc.kinds import Kind
from heapwalk.jemalloc.extents import ACTIVE, DIRTY, MUZZY, RETAINED
from heapwalk.jemalloc.heapmap import held_bytes, sampled
from heapwalk.jemalloc.model import JeArena, JeState

__all__ = ["check_jemalloc", "scope"]


def check_jemalloc(state: JeState) -> tuple[Finding, ...]:
    """Every violation found in STATE, errors first, then by address."""
    findings = list(state.all_findings())
    held = None if state.extents is None else held_bytes(state.extents)
    for a in state.arenas:
        findings += _extents(a) + _bins(a) + _active(a) + _walked(state, a, held) + _listed(a)
    return tuple(sorted(findings, key=lambda f: (f.severity is not Severity.ERROR,
                                                 f.severity is not Severity.WARNING, f.address)))


def scope(state: JeState) -> dict[str, int]:
    """What the check looked at."""
    return {"arenas": len(state.arenas), "listed_extents": sum(r.extents for a in state.arenas for r in a.free_lists),
            "bins": sum(1 for a in state.arenas for b in a.bins
                                                     if b.nmalloc or b.curslabs),
            "extents": 0 if state.extents is None else len(state.extents),
            "sampled": 0 if state.extents is None else sampled(state.extents),
            "tcaches": sum(1 for t in state.threads if t.tcache_arena is not None),
            "cached_regions": sum(c for t in state.threads for _, c in t.tcache)}


def _error(a: JeArena, message: str, expected: str, found: str, kind: Kind = Kind.ACCOUNTING) -> Finding:
    return Finding(Severity.ERROR, a.address, f"arena {a.index}", message, kind, expected, found)


def _extents(a: JeArena) -> list[Finding]:
    out = []
    for name, pages, nbytes in (("dirty", a.dirty_bytes, sum(e.dirty_bytes for e in a.extents)),
                                ("muzzy", a.muzzy_bytes, sum(e.muzzy_bytes for e in a.extents)),
                                ("retained", a.retained, sum(e.retained_bytes for e in a.extents))):
        if a.extents and pages != nbytes:
            out.append(_error(a, f"the {name} extents by size class hold {nbytes} bytes, the {name} container "
                              f"counts {pages}", f"{pages} bytes", f"{nbytes} bytes", Kind.ARENA))
    return out


def _bins(a: JeArena) -> list[Finding]:
    out = []
    for b in a.bins:
        counted = b.nmalloc is None or b.ndalloc is None       # no statistics: only the slabs themselves
        if (not counted and b.curregs != b.nmalloc - b.ndalloc) or b.curregs > b.curslabs * b.nregs \
                or b.nonfull_slabs > b.curslabs:
            out.append(_error(a, f"bin {b.index} ({b.size} B): curregs {b.curregs}, nmalloc {b.nmalloc}, ndalloc "
                              f"{b.ndalloc}, curslabs {b.curslabs} of {b.nregs} regions, nonfull_slabs "
                              f"{b.nonfull_slabs} do not agree", "curregs = nmalloc - ndalloc <= curslabs x nregs",
                              f"{b.curregs}", Kind.ARENA))
    for c in a.large:
        if c.live is None and c.ndalloc > c.nmalloc:
            out.append(_error(a, f"large class {c.size} B freed {c.ndalloc} allocations of {c.nmalloc}",
                              "ndalloc <= nmalloc", f"{c.ndalloc} > {c.nmalloc}", Kind.ARENA))
    return out


def _listed(a: JeArena) -> list[Finding]:
    """The pages on each ring of free extents against the container's count (a ring cut short by a finding
    already named is not compared again)."""
    cut = {f.structure for f in a.findings if f.structure.endswith(" extents")}
    out = []
    for ring in a.free_lists:
        name = {1: "dirty", 2: "muzzy", 3: "retained"}[ring.state]
        if ring.pages != ring.counted and f"arena {a.index} {name} extents" not in cut:
            out.append(_error(a, f"the list of {name} extents holds {ring.extents} extents of {ring.pages} pages, "
                              f"the container counts {ring.counted} pages", f"{ring.counted} pages",
                              f"{ring.pages} pages", Kind.ARENA))
    return out


def _active(a: JeArena) -> list[Finding]:
    large, extents, padding = a.large_totals()["allocated"], a.large_extents(), a.active_slack()
    if 0 <= padding <= extents * a.page:
        return []
    return [_error(a, f"{a.pactive} active pages ({a.active_bytes} bytes) do not hold its slabs "
                   f"({a.slab_bytes()} bytes) and large allocations ({large} bytes, {extents} extents)",
                   "slabs + large allocations + at most a page each", f"{padding} bytes left over")]


def _walked(state: JeState, a: JeArena, held_by_extent) -> list[Finding]:
    """The arena's extents found through the radix tree against its counters (none when the tree was not
    found); HELD_BY_EXTENT is `held_bytes` of the state's extents."""
    table = state.extents
    if table is None:
        return []
    mine = table.arena == a.index
    held = int(held_by_extent[mine & (table.state == ACTIVE)].sum())
    want = a.small()["allocated"] + a.large_totals()["allocated"]
    out = []
    for name, state_code, counted in (("active", ACTIVE, a.active_bytes), ("dirty", DIRTY, a.dirty_bytes),
                                      ("muzzy", MUZZY, a.muzzy_bytes), ("retained", RETAINED, a.retained)):
        walked = table.bytes_of(a.index, state_code)
        if walked != counted:
            out.append(_error(a, f"the {name} extents the radix tree maps hold {walked} bytes, the arena counts "
                              f"{counted}", f"{counted} bytes", f"{walked} bytes", Kind.ARENA))
    if held != want:
        out.append(_error(a, f"the active extents hold {held} bytes of regions and large allocations in use, the "
                          f"arena's bins and large classes count {want}", f"{want} bytes", f"{held} bytes",
                          Kind.ARENA))
    return out
