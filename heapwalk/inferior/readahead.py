"""The next window of a long read fetched while this one is judged: a core file's bytes read on a thread of
heapwalk's own (`os.pread` lets Python's other threads run meanwhile), for the reader to take when it comes to
them.

Only a reader any thread may call reads ahead (a core file's own, `coreread.CoreReader.read`; never gdb's, nor a
live process's), and only the one window asked for is held: a read of other bytes is made as before, and the
window read ahead let go.  The thread is made with every signal blocked (gdb's handlers are for its own
thread) and ends with the memory it reads for."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np

from heapwalk.common.beside import own_pool

__all__ = ["ReadAhead"]


class ReadAhead:
    """Reads READ_INTO(address, buffer) (whether it filled BUFFER) ahead, one window at a time, into room made
    by the caller's thread (so that gdb's malloc keeps it in its own arena, as every other read's)."""

    def __init__(self, read_into: Callable[[int, object], bool]):
        self._read_into = read_into
        self._pending: tuple[int, int, Future] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def start(self, address: int, size: int) -> None:
        """Begins reading SIZE bytes at ADDRESS (the window read ahead before is let go)."""
        self._pending = None
        if self._pool is None:
            self._pool = own_pool("heapwalk-read-ahead")
        self._pending = (address, size, self._pool.submit(self._filled, address, np.empty(size, dtype=np.uint8)))

    def _filled(self, address: int, buffer: np.ndarray) -> memoryview | None:
        return memoryview(buffer) if self._read_into(address, buffer) else None

    def take(self, address: int, size: int) -> memoryview | None:
        """The SIZE bytes at ADDRESS (a memoryview, as gdb's reads give) when they were read ahead (waiting for
        the read to end), else None; what was read ahead is let go either way."""
        pending, self._pending = self._pending, None
        if pending is None or pending[:2] != (address, size):
            return None
        try:
            return pending[2].result()
        except Exception:
            return None

    def let_go(self) -> None:
        """Lets the window read ahead go, untaken (its bytes freed once its read ends)."""
        self._pending = None
