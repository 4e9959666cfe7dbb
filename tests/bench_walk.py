"""Sourced by tests/bench.py inside gdb: times the full chunk walk alone, as `heapwalk report` does it
(accounting and the trim simulation of every arena, after the free lists are decoded), and prints
"heapwalk-bench-walk SECONDS CHUNKS"."""

import time

from heapwalk.chunkwalk import Listing, account
from heapwalk.commands import load_target
from heapwalk.trim import TrimSimulation


def _walk() -> None:
    state, mem, layout = load_target(False)
    start = time.perf_counter()
    listing = Listing.of_state(state)
    chunks = 0
    for arena in state.arenas:
        sim = TrimSimulation(mem, layout, arena)
        acc = account(mem, layout, arena, listing, sim)
        sim.result()
        chunks += sum(acc.counts.values())
    print("heapwalk-bench-walk %.6f %d" % (time.perf_counter() - start, chunks))


_walk()
