"""glibc's malloc_info(3) XML, rebuilt from a decoded heap, so scripts that parse it work on cores.

The rules are glibc's: per arena a <size> line for each non-empty fastbin
(from = size - 15, to = size, total = count x size) and each non-empty small or
large bin (min, max and sum of the size fields as stored, flag bits included),
then one <unsorted> line; "fast" totals (absent from 2.43, which has no
fastbins) and "rest" totals (every chunk in bins 1..127, plus top from 2.31);
system and aspace figures.  Before 2.31 every <size> line starts with seven
tabs and six spaces (a string continued over a line in glibc's source, fixed in
2.31).  malloc_info does not see tcache, so neither does this output;
heapwalk's other reports do.
"""

from __future__ import annotations

from heapwalk.glibc.locate.layout import layout_for
from heapwalk.glibc.model import Arena, HeapState

__all__ = ["malloc_info_xml"]


def _arena_lines(arena: Arena, top_in_rest: bool, has_fast: bool, indent: str) -> tuple:
    """ARENA's <size> and <unsorted> lines, its fast and rest totals, and its aspace figures."""
    lines = []
    fast = [0, 0]
    for fb in arena.fastbins:
        if fb.count:
            size = (fb.index + 2) * 16
            lines.append(f'{indent}  <size from="{size - 15}" to="{size}" total="{fb.count * size}" '
                         f'count="{fb.count}"/>')
            fast[0] += fb.count
            fast[1] += fb.total
    rest = [0, 0]
    for b in arena.bins:
        if b.count:
            lines.append(f'{indent}  <size from="{min(b.raw_sizes)}" to="{max(b.raw_sizes)}" total="{b.raw_total}" '
                         f'count="{b.count}"/>')
            rest[0] += b.count
            rest[1] += b.raw_total
    u = arena.unsorted
    if u.count:
        lines.append(f'  <unsorted from="{min(u.raw_sizes)}" to="{max(u.raw_sizes)}" total="{u.raw_total}" '
                     f'count="{u.count}"/>')
        rest[0] += u.count
        rest[1] += u.raw_total
    if top_in_rest:
        rest[0] += 1
        rest[1] += arena.top_size
    if arena.is_main:
        aspace = {"total": arena.system_mem, "mprotect": arena.system_mem}
    else:
        aspace = {"total": sum(h.size for h in arena.heaps), "mprotect": sum(h.mprotect_size for h in arena.heaps),
                  "subheaps": len(arena.heaps)}
    return lines, tuple(fast), tuple(rest), aspace


def malloc_info_xml(state: HeapState) -> str:
    """The document malloc_info(0, f) would have printed in the target at the snapshot."""
    era = layout_for(state.glibc_version)
    top_in_rest, has_fast, indent = era.malloc_info_top_in_rest, era.malloc_info_fast, era.malloc_info_indent
    out = ['<malloc version="1">']
    totals = {"fast": [0, 0], "rest": [0, 0], "system": [0, 0], "total": 0, "mprotect": 0}
    for arena in state.arenas:
        lines, fast, rest, aspace = _arena_lines(arena, top_in_rest, has_fast, indent)
        out.append(f'<heap nr="{arena.number}">')
        out.append("<sizes>")
        out.extend(lines)
        out.append("</sizes>")
        if has_fast:
            out.append(f'<total type="fast" count="{fast[0]}" size="{fast[1]}"/>')
        out.append(f'<total type="rest" count="{rest[0]}" size="{rest[1]}"/>')
        out.append(f'<system type="current" size="{arena.system_mem}"/>')
        out.append(f'<system type="max" size="{arena.max_system_mem}"/>')
        for kind, value in aspace.items():
            out.append(f'<aspace type="{kind}" size="{value}"/>')
        out.append("</heap>")
        for i in (0, 1):
            totals["fast"][i] += fast[i]
            totals["rest"][i] += rest[i]
        totals["system"][0] += arena.system_mem
        totals["system"][1] += arena.max_system_mem
        totals["total"] += aspace["total"]
        totals["mprotect"] += aspace["mprotect"]
    if has_fast:
        out.append(f'<total type="fast" count="{totals["fast"][0]}" size="{totals["fast"][1]}"/>')
    out.append(f'<total type="rest" count="{totals["rest"][0]}" size="{totals["rest"][1]}"/>')
    n_mmaps, mmapped = state.mmap_counters()
    out.append(f'<total type="mmap" count="{n_mmaps or 0}" size="{mmapped or 0}"/>')
    out.append(f'<system type="current" size="{totals["system"][0]}"/>')
    out.append(f'<system type="max" size="{totals["system"][1]}"/>')
    out.append(f'<aspace type="total" size="{totals["total"]}"/>')
    out.append(f'<aspace type="mprotect" size="{totals["mprotect"]}"/>')
    out.append("</malloc>")
    return "\n".join(out) + "\n"
