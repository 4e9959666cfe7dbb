"""glibc's words in its report (`heapwalk.common.view.Words`: its arena table's columns) and the lines it prints under
that table: mmapped chunks, the arena limit, what malloc_trim(0) would release and what it keeps."""

from __future__ import annotations

from rich.text import Text

from heapwalk.analysis.report import Report, human
from heapwalk.common.view import Words

__all__ = ["WORDS", "summary_lines"]

WORDS = Words(
    holds="malloc's arenas hold", system="system", heaps="heaps", pieces="chunks", gives_back="trim gives back",
    large="mmapped chunks",
    free_columns=(("free: tcache", lambda a: a.free["tcache"]), ("fast", lambda a: a.free["fast"]),
                  ("bins", lambda a: a.free["unsorted"] + a.free["small"] + a.free["large"]),
                  ("top", lambda a: a.top)),
    last_columns=(("overhead", lambda a: a.overhead), ("trim frees", lambda a: a.reclaim)), top=True,
    overhead_page="headers", pieces_page="free chunks (top aside)", blocks="chunks",
    blocks_counted=" (the program's: malloc's tcache structs and mmapped chunks aside)",
    size_class="glibc's size class")


def summary_lines(rep: Report) -> Text:
    """glibc's lines under the arena table: mmapped chunks, arenas and their limit, what malloc_trim(0) would
    release and keep, the free chunks, what is in RAM."""
    lines = Text()
    lines.append(f"mmapped chunks: {rep.mmapped_count}, {human(rep.mmapped_bytes)}\n")
    lines.append(f"arenas: {len(rep.arenas)} ({rep.arenas_on_free_list} on the free list of exited threads); "
                 f"limit {rep.arena_limit}\n")
    if not all(a.balanced for a in rep.arenas):
        lines.append("accounting: some arenas do not add up to system_mem (see the findings)\n", style="red")
    kept = rep.trim_kept
    lines.append(f"malloc_trim(0) would release {human(rep.trim_total)} of address space, {human(rep.trim)} of it "
                 f"resident; it cannot return {human(kept.get('tcache', 0))} in tcache, "
                 f"{human(kept.get('sub_page', 0))} in pieces under a page, {human(kept.get('thread_top', 0))} in "
                 f"thread-arena tops, {human(kept.get('main_top', 0))} of the main top\n")
    lines.append(f"free chunks: {rep.free_chunks}, {human(rep.free_listed)}; largest {human(rep.largest_free)}; "
                 f"fragmentation {rep.fragmentation:.2f} (1 - largest / all free)\n")
    if rep.residency and rep.idle_resident is None:
        lines.append(f"in RAM (from {rep.residency}): the arenas {human(rep.resident or 0)}; what of it is free is "
                     "not known for every arena\n")
    elif rep.residency:
        lines.append(f"in RAM (from {rep.residency}): the arenas {human(rep.resident)}, {human(rep.idle_resident)} "
                     f"of it free (top included), {human(rep.free + rep.top - rep.idle_resident)} free but not in "
                     f"RAM; mmapped chunks {human(rep.mmapped_resident or 0)}\n")
    else:
        lines.append("in RAM: unknown (this core does not say which pages were resident: a core 'heapwalk "
                     "capture' wrote does, and a live process)\n")
    if not rep.lists_match_walk:
        lines.append(f"  (the free lists hold {human(rep.free_listed)}, the chunk walk found {human(rep.free)} free: "
                     "the heap is damaged, so these figures cover only what the lists hold; see the findings)\n",
                     style="red")
    return lines
