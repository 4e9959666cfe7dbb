"""The next arena's heaps swept on a thread of heapwalk's own while the caller follows this arena's lists and
sums its account: the sweep is C and reads, the lists and the account C and numpy, each letting the other's
thread run, so that a machine's second core takes the sweeps.

Only where another thread may read the target's memory (a core file's own bytes: `memory.memory_for_thread`); a
live process's reads are gdb's, on gdb's thread.  A sweep ahead notes its pages apart, taken in when its arena's
turn comes, and hears its own progress, told on the caller's thread while the caller waits for it.  Where a sweep
ahead gives up (damage, or bytes only gdb reads, or anything raised), the caller sweeps the arena again itself:
what the one pass gives is always what a sweep in turn gives.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout

from heapwalk.analysis.pages import PagesSeen
from heapwalk.common.beside import own_pool
from heapwalk.glibc.bulk.sweep import Sweep, SweepRoom, sweep_extents
from heapwalk.glibc.walk.chunks import Extent
from heapwalk.inferior.memory import Memory, memory_for_thread

__all__ = ["SweepsAhead", "NOT_AHEAD", "AHEAD_FROM"]

#: an arena's heaps are swept ahead from this many bytes: below it the sweep takes a few milliseconds, about what
#: handing the work and Python's lock between two threads costs (measured: `report` on a reproducer's core of a
#: few MiB 10-15% slower with every arena swept ahead)
AHEAD_FROM = 16 << 20
#: `SweepsAhead.take` for an arena no sweep was started for
NOT_AHEAD = object()
#: seconds between the progress a caller waiting for a sweep ahead is told
_TICK = 0.1


class SweepsAhead:
    """Sweeps started ahead, one at a time in the order started, on a thread of its own (see the module)."""

    def __init__(self, mem: Memory, room: SweepRoom, pages: PagesSeen | None):
        self._mem, self._room, self._pages = mem, room, pages
        self._pool: ThreadPoolExecutor | None = None           # made for the first sweep started
        self._pending: dict[int, tuple[Future, PagesSeen | None, list[int]]] = {}

    @classmethod
    def of(cls, mem: Memory, room: SweepRoom, pages: PagesSeen | None) -> SweepsAhead | None:
        """Sweeps ahead of MEM's heaps into ROOM, noting pages as PAGES does; None where no other thread may
        read MEM."""
        own = memory_for_thread(mem)
        return None if own is None else cls(own, room, pages)

    def start(self, arena: int, extents: list[Extent], top: int) -> None:
        """Starts sweeping the EXTENTS of the arena at ARENA (TOP its top), after the sweeps started before, where
        they hold `AHEAD_FROM` bytes or more (`take` then says none was started)."""
        if sum(e.end - e.start for e in extents) < AHEAD_FROM:
            return
        pages = self._pages.apart() if self._pages is not None else None
        swept = [0]
        if self._pool is None:
            self._pool = own_pool("heapwalk-sweep")
        future = self._pool.submit(sweep_extents, self._mem, extents, top, lambda done: swept.__setitem__(0, done),
                                   pages, self._room)
        self._pending[arena] = (future, pages, swept)

    def take(self, arena: int, progress=None):
        """The sweep started for ARENA, waited for (PROGRESS(bytes) told meanwhile, when given), its pages taken
        in; None where it gave up (the caller sweeps again), NOT_AHEAD where none was started."""
        pending = self._pending.pop(arena, None)
        if pending is None:
            return NOT_AHEAD
        future, pages, swept = pending
        if not self._pending:
            self._room.let_go()      # the room the sweeps before this one gave back: no sweep is to come
        try:
            sweep = _waited(future, progress, swept)
        except Exception:          # the caller's own sweep meets the same, and says what it is
            return None
        if sweep is not None and pages is not None and self._pages is not None:
            self._pages.take_in(pages)
        return sweep

    def close(self) -> None:
        """Lets go the sweeps not taken, and the thread (a sweep running ends first)."""
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _waited(future: Future, progress, swept: list[int]) -> Sweep | None:
    """FUTURE's sweep, PROGRESS told SWEPT[0] every `_TICK` seconds meanwhile and once at its end, when given."""
    if progress is None:
        return future.result()
    while True:
        try:
            sweep = future.result(timeout=_TICK)
        except FutureTimeout:
            progress(swept[0])
            continue
        progress(swept[0])
        return sweep
