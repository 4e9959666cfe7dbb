"""Sourced by tests/tools/bench_preload.py inside gdb on a core of cores/common/bench_preload.c: writes to the file
named by $HW_BENCH_OUT what `make bench` needs of the heap of the allocator named by $HW_BENCH_ALLOCATOR (its
title's first word), decoded as `heapwalk report` decodes it: the memory its blocks lie in (each block's 64 KiB
granules, merged: the allocator's pages in use, not what it reserved; runs of [address, bytes], as far as the core
holds them: what the floor reads), how many blocks it holds, and of the addresses the program wrote
to $HW_BENCH_LIVE (live.bin: every block it holds), how many heapwalk does not find in use."""

import json
import os

import gdb
import numpy as np

from heapwalk.gdb.session import load_allocators
from heapwalk.inferior.ranges import merged_arrays

_STEP = 4 << 20
_GRANULE = 1 << 16


def _readable(inferior, lo: int, hi: int) -> list[tuple[int, int]]:
    """The runs of [LO, HI) the core holds, found 4 MiB at a time, a failed read halved down to pages."""
    out, todo = [], [(lo, hi)]
    while todo:
        a, b = todo.pop()
        try:
            inferior.read_memory(a, b - a)
        except Exception:
            if b - a > 4096:
                mid = a + ((b - a) // 2 & ~4095)
                todo += [(mid, b), (a, mid)]
            continue
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _dump() -> None:
    found = load_allocators()
    name = os.environ["HW_BENCH_ALLOCATOR"]
    decoded = next(d for d in found.decoded if d.title.split()[0].lower().startswith(name))
    blocks = decoded.blocks()
    live = np.fromfile(os.environ["HW_BENCH_LIVE"], dtype="<u8")
    missing = int(np.count_nonzero(~np.isin(live, blocks.starts)))
    inferior = gdb.selected_inferior()
    runs = []
    grain = np.uint64(_GRANULE - 1)
    for lo, hi in merged_arrays(blocks.starts & ~grain, (blocks.ends + grain) & ~grain):
        for at in range(lo, hi, _STEP):
            for a, b in _readable(inferior, at, min(hi, at + _STEP)):
                if runs and runs[-1][1] == a:
                    runs[-1] = (runs[-1][0], b)
                else:
                    runs.append((a, b))
    with open(os.environ["HW_BENCH_OUT"], "w") as out:
        json.dump({"heaps": [[lo, hi - lo] for lo, hi in runs], "blocks": blocks.count, "live": len(live),
                   "missing": missing}, out)


_dump()
