"""Which arenas do not give their dirty pages back, and why: jemalloc purges an arena's dirty pages as time
passes, but only when its threads tick (allocate and free), and in jemalloc 5.1 and 5.2 a thread whose first call
into jemalloc was free() never gets a ticker.  An arena that holds dirty pages, has a decay time, has never
purged, and whose threads all lack a ticker keeps those pages until something else purges it."""

from __future__ import annotations

from heapwalk.common.findings import Finding, Severity
from heapwalk.jemalloc.kinds import Kind
from heapwalk.jemalloc.model import JeArena, JeState

__all__ = ["decay_findings", "never_decaying", "overdue"]


def never_decaying(state: JeState) -> list[tuple[JeArena, list[int]]]:
    """Each arena whose dirty pages no thread's ticker will ever decay, with the gdb numbers of the threads
    that use it (none of which holds a ticker); none while jemalloc's background threads run (they purge)."""
    out = []
    if state.background_running:
        return out
    for arena in state.arenas:
        users = [t for t in state.threads if t.arena == arena.index]
        if not (arena.pdirty and arena.dirty_decay_ms > 0 and arena.dirty_npurge == 0 and users):
            continue
        if any(t.ticker is not False for t in users):
            continue
        out.append((arena, [t.number for t in users]))
    return out


def decay_findings(state: JeState) -> tuple[Finding, ...]:
    """A warning for each arena whose dirty pages no thread's ticker will ever decay."""
    return tuple(_never_decays(arena, threads, state.conf_variable) for arena, threads in never_decaying(state))


def _never_decays(arena: JeArena, threads: list[int], variable: str) -> Finding:
    dirty = arena.dirty_bytes
    names = ", ".join(map(str, threads))
    return Finding(
        Severity.WARNING, arena.address, f"arena {arena.index}",
        f"{dirty / 2**20:.1f} MiB of dirty pages ({arena.pdirty} pages) have never been purged "
        f"(dirty_npurge 0) although dirty_decay_ms is {arena.dirty_decay_ms}: no thread using the arena "
        f"(gdb thread{'s' if len(threads) > 1 else ''} {names}) holds a decay ticker, so none of them makes it "
        "decay. In jemalloc 5.1 and 5.2 a thread whose first call was free() never gets one. Remedies: "
        f"{variable}=dirty_decay_ms:0 (purge at once), background_thread:true (a thread that purges), an "
        "allocation at each thread's start, or jemalloc 5.3", Kind.NO_DECAY, "dirty pages purged over time",
        f"{arena.pdirty} pages, never purged")


def overdue(state: JeState) -> list[tuple[JeArena, int, int]] | None:
    """Each arena holding dirty pages whose decay's next step was due before the snapshot, with how long
    before (ns) and how long before it last stepped (ns); None when the snapshot's clock is not known.  An
    arena's decay steps only when a thread of it calls jemalloc (or a background thread wakes), so an idle
    arena keeps its dirty pages past their time."""
    if state.clock_ns is None:
        return None
    out = []
    for arena in state.arenas:
        epoch, deadline = arena.dirty_clock
        if arena.pdirty and arena.dirty_decay_ms > 0 and epoch and 0 < deadline < state.clock_ns:
            out.append((arena, state.clock_ns - deadline, state.clock_ns - epoch))
    return out
