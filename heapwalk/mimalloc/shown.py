"""mimalloc's figures as heapwalk shows them: its totals in its own statistics' words (reserved, committed,
segments, abandoned), and each heap with the thread it belongs to ('heapwalk threads')."""

from __future__ import annotations

from rich.table import Table

from heapwalk.analysis.report import human
from heapwalk.mimalloc.account import ARENAS, CACHED, EXITED, META, UNOWNED, Owner
from heapwalk.mimalloc.collect import collected
from heapwalk.mimalloc.decode import MiState

__all__ = ["totals", "threads_table", "threads_document", "owner_name", "collect_resident", "options_document",
           "options_line"]


def totals(state: MiState) -> dict[str, int]:
    """mimalloc's own figures, as mi_stats_print_out names them ("current" of each), from the walk."""
    live = state.live()
    abandoned = state.abandoned()
    gives = collected(state)
    own = state.figures(gives, _own(state))
    if own is not None:
        return own
    return {"reserved": state.reserved(), "committed": state.committed(),
            "segments": len(live) - len(abandoned), "segments_abandoned": len(abandoned),
            "pages_abandoned": sum(s.abandoned for s in abandoned),
            "pages": sum(len(s.pages) for s in live),
            "purge_pending": sum(s.pending for s in live),
            "huge_segments": sum(1 for s in live if s.huge),
            "freed_segments": len({s.address for s in state.segments if not s.live}
                                  - {s.address for s in state.cached()}),
            "segments_cached": len(state.cached()),
            "thread_data": len(state.thread_data),
            "arenas": len(state.discovery.arenas), "arena_free": state.arena_free(),
            "collect_purges": sum(b - a for a, b in gives),
            "collect_decommits": sum(b - a for a, b in collected(state, counted=True))}


def drift_sentence(state: MiState, counted: str) -> str:
    """The verdict's sentence for a release whose own committed figure drifts below what is committed once it
    has purged (COUNTED: what heapwalk counts instead)."""
    version = state.discovery.version
    named = ".".join(map(str, version)) if version else state.layout.versions
    return (f"mimalloc {named}'s own committed figure (mi_stats_print, mi_process_info) is not this one once it "
            "has purged: on Linux a purge takes its bytes off that figure while the memory stays committed, so it "
            f"falls below what is committed, even below zero; heapwalk counts {counted}.")


def _own(state: MiState) -> dict[str, int]:
    """mimalloc's own reserved and committed figures, where heapwalk reads them (3.6)."""
    own = state.discovery.own_figures
    return {} if own is None else {"own_reserved": own[0], "own_committed": own[1]}


def collect_resident(state: MiState) -> int | None:
    """The resident bytes of what mi_collect(true) on the main thread gives back (None: unknown)."""
    return state.resident(collected(state))


def options_document(state: MiState) -> dict:
    """The options the process runs with: name -> {value, set} ("default", "from the environment")."""
    return {name: {"value": o.value, "set": o.how} for name, o in state.discovery.options.items()}


def options_line(state: MiState) -> str:
    """The options as one line of the report: each option not deprecated, NAME=VALUE, those the environment set
    marked with a star."""
    shown = [f"{name}={o.value}{'*' if o.how == 'from the environment' else ''}"
             for name, o in state.discovery.options.items() if not name.startswith("deprecated")]
    if not shown:
        return "options: not found\n"
    return f"options (* from the environment): {' '.join(shown)}\n"


def owner_name(owner: Owner, threads: dict, exited: str = "exited threads") -> str:
    """How the tables name OWNER: "thread N" (gdb's number), "exited threads" (mimalloc 3: "abandoned pages",
    which live threads give up too), or its thread pointer."""
    if owner.thread_id == EXITED:
        return exited
    if owner.thread_id == UNOWNED:
        return "huge blocks (no thread)"
    if owner.thread_id == ARENAS:
        return "arenas"
    if owner.thread_id == META:
        return "mimalloc's own data"
    if owner.thread_id == CACHED:
        return "segment cache"
    t = threads.get(owner.thread_id)
    return f"thread {t.number}" if t else f"thread at {owner.thread_id:#x}"


def threads_table(state: MiState, owners: list[Owner], threads: dict, box) -> Table:
    """One row per heap: its thread (gdb's number, LWP, name), where it is, its pages and the bytes its blocks
    in use and free hold."""
    table = Table(title=f"mimalloc heaps ({len(state.heaps)})", box=box, title_justify="left")
    for name in ("thread", "lwp", "name", "heap", "kind", "pages", "in use", "free in pages", "segments"):
        table.add_column(name, justify="left" if name in ("name", "heap", "kind") else "right", no_wrap=True)
    for row in threads_document(state, owners, threads):
        table.add_row(str(row["thread"] or "-"), str(row["lwp"] or "-"), row["name"] or "-", f"{row['address']:#x}",
                      row["kind"], str(row["pages"]), human(row["in_use"]), human(row["free"]),
                      str(row["segments"]))
    return table


def threads_document(state: MiState, owners: list[Owner], threads: dict) -> list[dict]:
    """The heaps as JSON: address, kind (main, backing, other; 3.6: mimalloc's own), the owning thread (its thread pointer,
    gdb's number, LWP, name: null when not found), pages, bytes of blocks in use and free, segments its thread owns."""
    by_heap: dict[int, tuple[int, int]] = {}
    for seg in state.live():
        for p in seg.pages if seg.thread_id or state.abandoned_keep_heap else ():
            used, free = by_heap.get(p.heap, (0, 0))
            by_heap[p.heap] = (used + p.in_use * p.block_size, free + p.free_cut * p.block_size)
    segments = {o.thread_id: len(o.segments) for o in owners}
    out = []
    for h in state.heaps:
        t = threads.get(h.thread_id)
        used, free = by_heap.get(h.address, (0, 0))
        kind = "main" if h.main else "mimalloc's own" if h.meta else "backing" if h.backing else "other"
        out.append({"address": h.address, "kind": kind,
                    "thread_id": h.thread_id, "thread": t.number if t else None, "lwp": t.lwp if t else None,
                    "name": t.name if t else None, "pages": h.pages, "in_use": used, "free": free,
                    "delayed": h.delayed, "segments": segments.get(h.thread_id, 0) if h.backing else 0})
    return out
