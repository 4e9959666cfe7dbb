"""Sourced by tests/tools/bench.py inside gdb on a core of cores/jemalloc/je_bench.c: writes what `make bench` needs of the
jemalloc heap to the file named by $HW_BENCH_OUT: the active extents merged into runs of adjacent memory
([address, bytes] each: what the floor reads), and the regions the program holds in each arena (the blocks the
leak scan judges), decoded as `heapwalk report` decodes them."""

import json
import os

from heapwalk.gdb.session import load_allocators
from heapwalk.inferior.ranges import merged
from heapwalk.jemalloc.extents import ACTIVE


def _dump() -> None:
    found = load_allocators()
    decoded = next(d for d in found.decoded if d.title.startswith("jemalloc"))
    table = decoded.state.extents
    active = table.state == ACTIVE
    runs = merged((a, a + n) for a, n in zip(table.address[active].tolist(), table.size[active].tolist()))
    blocks = decoded.blocks()
    arenas = {}
    for arena in blocks.arena.tolist():
        arenas[arena] = arenas.get(arena, 0) + 1
    with open(os.environ["HW_BENCH_OUT"], "w") as out:
        json.dump({"heaps": [[lo, hi - lo] for lo, hi in runs], "blocks": blocks.count,
                   "blocks_by_arena": {str(k): v for k, v in sorted(arenas.items())}}, out)


_dump()
