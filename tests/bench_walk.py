"""Sourced by tests/bench.py inside gdb: times the full chunk walk alone, as `heapwalk report` does it
(`decode.walk_arenas`: accounting and the trim simulation of every arena, after the free lists are
decoded), and prints "heapwalk-bench-walk SECONDS CHUNKS"."""

import time

from heapwalk.glibc.decode import walk_arenas
from heapwalk.gdb.session import load_target


def _walk() -> None:
    state, mem, layout = load_target(False)
    start = time.perf_counter()
    walk = walk_arenas(mem, layout, state)
    chunks = sum(sum(acc.counts.values()) for acc in walk.accounts.values())
    print("heapwalk-bench-walk %.6f %d" % (time.perf_counter() - start, chunks))


_walk()
