"""obmalloc in its own words: the view the report reads (each arena: blocks in use, free blocks, unused
pools, headers and rounding), the lines under the arena table, the table of size classes as
``sys._debugmallocstats()`` prints it, and the JSON document's ``obmalloc`` object."""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType

from rich import box as rich_box
from rich.table import Table
from rich.text import Text

from heapwalk.analysis.report import Report, human
from heapwalk.cpython.model import ObArena, ObState
from heapwalk.common.view import ArenaView, HeapView, Words

__all__ = ["WORDS", "heap_view", "summary_lines", "class_table", "obmalloc_document"]

WORDS = Words(
    holds="obmalloc's arenas hold", system="mapped", heaps="pools used", pieces="free blocks and pools",
    gives_back="frees now", large="", overhead="headers, rounding",
    free_columns=(("free: blocks", lambda a: a.free["blocks"]), ("unused pools", lambda a: a.free["pools"])),
    last_columns=(("headers, rounding", lambda a: a.overhead),),
    overhead_page="pool headers, rounding and alignment", pieces_page="free blocks and unused pools",
    blocks="blocks", size_class="size class")


def heap_view(state: ObState) -> HeapView:
    """The view of obmalloc's arenas: nothing is given back now (an arena goes back only when all its pools
    are empty, which obmalloc does at once)."""
    return HeapView(
        allocator="cpython", arenas=tuple(_row(state, a) for a in state.arenas),
        free_sizes=MappingProxyType({a.index: _free_sizes(state, a) for a in state.arenas}), size_classes=(),
        arena_limit=f"arenas of {human(state.arena_size)}, pools of {human(state.pool_size)}",
        residency=state.residency if all(a.resident is not None for a in state.arenas) else "")


def _row(state: ObState, a: ObArena) -> ArenaView:
    unused = a.unused_pools * state.pool_size
    return ArenaView(a.index, a.address, "arena", 0, a.used, a.size, a.in_use,
                     MappingProxyType({"blocks": a.free_blocks, "pools": unused}), 0,
                     a.headers + a.quantization + a.alignment, 0, a.balanced, a.resident, a.free_resident)


def _free_sizes(state: ObState, a: ObArena) -> Counter:
    """The arena's free pieces: its free blocks by size, and its unused pools."""
    sizes = Counter(dict(a.free_by_size))
    if a.unused_pools:
        sizes[state.pool_size] += a.unused_pools
    return sizes


def summary_lines(rep: Report, state: ObState) -> Text:
    """The lines under the arena table: the interpreter, the geometry, where the arena table is, and the totals
    as sys._debugmallocstats() names them."""
    f = state.figures()
    lines = Text()
    lines.append(f"{state.python}: {f['arenas']} arenas of {human(state.arena_size)}, pools of "
                 f"{human(state.pool_size)}; arena table "
                 + (f"at {state.table:#x}\n" if state.table is not None else "not found\n"))
    lines.append(f"blocks in use {human(f['bytes_in_allocated_blocks'])}, available blocks "
                 f"{human(f['bytes_in_available_blocks'])}, {f['unused_pools']} unused pools "
                 f"({human(f['unused_pools'] * state.pool_size)}); pool headers "
                 f"{human(f['bytes_lost_to_pool_headers'])}, quantization {human(f['bytes_lost_to_quantization'])}, "
                 f"arena alignment {human(f['bytes_lost_to_arena_alignment'])}\n")
    if not all(a.balanced for a in rep.arenas):
        lines.append("accounting: some arenas' pools do not agree with the arena table (see the findings)\n",
                     style="red")
    lines.append("obmalloc frees an arena only when every pool in it is empty: it gives nothing back now\n")
    return lines


def class_table(state: ObState, box: rich_box.Box | None) -> Table:
    """The size classes in use, as sys._debugmallocstats() lists them."""
    table = Table(title="size classes (pools in use)", box=box, title_justify="left")
    for name in ("class", "size", "num pools", "blocks in use", "avail blocks"):
        table.add_column(name, justify="right")
    for c in state.classes:
        if c.pools:
            table.add_row(str(c.index), str(c.size), str(c.pools), str(c.in_use), str(c.available))
    return table


def obmalloc_document(state: ObState) -> dict:
    """The document's ``obmalloc`` object: the interpreter, the geometry, the totals, each class and arena."""
    return {"python": state.python, "pool_size": state.pool_size, "arena_size": state.arena_size,
            "arena_table": state.table, "totals": state.figures(),
            "classes": [{"class": c.index, "size": c.size, "pools": c.pools, "blocks_in_use": c.in_use,
                         "available_blocks": c.available} for c in state.classes if c.pools],
            "arenas": [{"index": a.index, "address": a.address, "size": a.size, "first_pool": a.first_pool,
                        "pools": a.pools, "carved": a.carved, "used": a.used, "nfreepools": a.nfreepools,
                        "in_use": a.in_use, "available": a.free_blocks, "headers": a.headers,
                        "quantization": a.quantization, "alignment": a.alignment, "resident": a.resident,
                        "free_resident": a.free_resident} for a in state.arenas]}
