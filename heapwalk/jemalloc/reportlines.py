"""jemalloc's words in its report (`heapwalk.common.view.Words`: its arena table's columns, in malloc_stats_print's
terms) and the lines it prints under that table."""

from __future__ import annotations

from rich.text import Text

from heapwalk.analysis.report import Report, human
from heapwalk.common.view import Words

__all__ = ["WORDS", "summary_lines"]

WORDS = Words(
    holds="jemalloc's arenas hold", system="mapped", heaps="extents", pieces="pieces", gives_back="decay gives back",
    large="large allocations", overhead="base, pads",
    free_columns=(("free: tcache", lambda a: a.free["tcache"]), ("slabs", lambda a: a.free["slabs"]),
                  ("dirty", lambda a: a.free["dirty"]), ("muzzy", lambda a: a.free["muzzy"])),
    last_columns=(("base, pads", lambda a: a.overhead), ("decay frees", lambda a: a.reclaim)),
    overhead_page="base blocks and pads", pieces_page="free pieces (regions, cached regions and free extents)",
    counted="regions")


def summary_lines(rep: Report, metadata: dict[str, int] | None = None, partial: tuple[int, int] | None = None,
                  counted_from: int | None = None) -> Text:
    """jemalloc's lines under the arena table: large allocations, jemalloc's metadata (METADATA, from
    `JeState.metadata`) and the base blocks and pads, what 'free in RAM' counts (PARTIAL: the slabs only partly
    in RAM and their free bytes, when RSS is known), arenas, what decay would give back, the free pieces; for a
    build without statistics, first where its figures come from (COUNTED_FROM: how many extents)."""
    lines = Text()
    if counted_from is not None:
        lines.append(f"statistics: none (built with --disable-stats): in use, slabs, large allocations and free "
                     f"extents are counted from its {counted_from} extents; the counts of operations (allocations, "
                     "frees, fills, flushes, purges) and what its base allocated are not kept\n")
    lines.append(f"large allocations: {rep.mmapped_count}, {human(rep.mmapped_bytes)}\n")
    if metadata is not None and metadata["metadata"] is None:
        lines.append(f"metadata: {human(metadata['base_mapped'])} of base blocks (what they hold is counted by "
                     f"statistics only), and internal allocations {human(metadata['internal'])} (the thread caches' "
                     f"stacks, counted in use); 'base, pads' is the base blocks and the page cache_oblivious adds to "
                     f"each large allocation ({human(metadata['pads'])})\n")
    elif metadata is not None:
        lines.append(f"metadata (malloc_stats_print's): {human(metadata['metadata'])}: base allocations "
                     f"{human(metadata['base'])} in {human(metadata['base_mapped'])} of base blocks, and internal "
                     f"allocations {human(metadata['internal'])} (counted in use); 'base, pads' is the base blocks "
                     f"and the page cache_oblivious adds to each large allocation ({human(metadata['pads'])})\n")
    if partial is not None:
        slabs, free = partial
        lines.append("free in RAM: the dirty and muzzy pages in RAM and the free regions of the slabs wholly in RAM"
                     + (f"; it leaves out {human(free)} of free regions in {slabs} slab(s) only partly in RAM"
                        if slabs else "") + ", and the regions the thread caches hold\n")
    lines.append(f"arenas: {len(rep.arenas)} ({rep.arenas_on_free_list} with no thread); {rep.arena_limit}\n")
    if not all(a.balanced for a in rep.arenas):
        lines.append("accounting: some arenas' counters do not agree with their pages (see the findings)\n",
                     style="red")
    lines.append(f"decay would give back {human(rep.trim_total)}: the dirty and muzzy pages\n")
    lines.append(f"free pieces (free slab regions, cached regions, dirty and muzzy extents): {rep.free_chunks}, "
                 f"{human(rep.free_listed)}; largest {human(rep.largest_free)}\n")
    return lines
