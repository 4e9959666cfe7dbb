"""Sourced by tests/tools/bench.py inside gdb: times the decode with the chunk walk as `heapwalk report` does it (the
one pass: every heap swept once, the lists followed and every arena accounted and trimmed from the sweep),
then the same through the careful walkers alone (the lists followed through memory, then every chunk
walked), each without discovery; prints "heapwalk-bench-walk SECONDS CHUNKS" and
"heapwalk-bench-careful SECONDS CHUNKS".  Then the leak scan alone, after a decode that kept the chunks in use
(as `heapwalk leaks` makes it): the blocks, the roots, the scan of roots and heaps and the search; prints
"heapwalk-bench-leakscan SECONDS BLOCKS"."""

import time

from heapwalk.analysis.leaks import leaks_of
from heapwalk.gdb.session import _target
from heapwalk.glibc.locate.discovery import Overrides
from heapwalk.glibc.account.blocks import blocks_of
from heapwalk.glibc.decode import collect
from heapwalk.glibc.locate.discovery import discover


def _timed(target, disc, sweep: bool) -> tuple[float, int]:
    start = time.perf_counter()
    state = collect(target.mem, disc, target.threads, target.description, True, target.space.regions,
                    sweep=sweep)
    seconds = time.perf_counter() - start
    return seconds, sum(sum(acc.counts.values()) for acc in state.walk.accounts.values())


def _walk() -> None:
    target = _target()
    disc = discover(target.mem, target.symbols, Overrides(), target.space.mappings,
                    [t.thread_pointer for t in target.threads if t.thread_pointer], core=target.space.core,
                    regions=target.space.regions)
    print("heapwalk-bench-walk %.6f %d" % _timed(target, disc, True))
    print("heapwalk-bench-careful %.6f %d" % _timed(_target(), disc, False))
    target = _target()
    state = collect(target.mem, disc, target.threads, target.description, True, target.space.regions,
                    keep_used=True)
    start = time.perf_counter()
    blocks = blocks_of(target.mem, disc.layout, state)
    leaks_of(target.mem, blocks, target.space, target.threads)
    print("heapwalk-bench-leakscan %.6f %d" % (time.perf_counter() - start, blocks.count))


_walk()
