"""Run inside gdb (tests/cores/jemalloc/test_jemalloc_held.py): decodes the selected core's jemalloc twice, as its build
is (with its statistics) and as if it kept none (every figure counted from the extents), and writes both
arena lists and what the program holds (`counted.regions_held`) as JSON to the file HEAPWALK_PROBE_OUT names."""

import dataclasses
import json
import os

from heapwalk.gdb.session import _target
from heapwalk.jemalloc.counted import regions_held
from heapwalk.jemalloc.decode import collect_jemalloc
from heapwalk.jemalloc.discovery import discover_jemalloc


def _arena(a):
    return {"index": a.index, "mapped": a.mapped, "internal": a.internal,
            "bins": [[b.curregs, b.curslabs, b.nonfull_slabs] for b in a.bins],
            "large": [c.curlextents for c in a.large],
            "extents": [dataclasses.astuple(e) for e in a.extents]}


def _probe():
    target = _target()
    disc = discover_jemalloc(target.mem, target.space.mappings, [t.thread_pointer for t in target.threads if t.thread_pointer])
    as_built = collect_jemalloc(target.mem, disc, target.threads)
    counted = collect_jemalloc(target.mem, dataclasses.replace(disc, build={**disc.build, "stats": False}),
                               target.threads)
    doc = {"statistics": as_built.statistics, "as_built": [_arena(a) for a in as_built.arenas],
           "counted": [_arena(a) for a in counted.arenas],
           "held": {str(k): {str(s): n for s, n in v.items()} for k, v in regions_held(as_built).items()}}
    with open(os.environ["HEAPWALK_PROBE_OUT"], "w", encoding="utf-8") as fh:
        json.dump(doc, fh)


_probe()
