"""A thread of heapwalk's own, for work that may run beside the caller's: one job at a time, the caller taking
its end before it gives the next.  Made with every signal blocked (gdb's handlers are for its own thread); what
it runs must let Python's other threads run meanwhile (C called through ctypes, a file's reads) to gain."""

from __future__ import annotations

import signal
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

__all__ = ["own_pool", "Beside"]


def own_pool(name: str) -> ThreadPoolExecutor:
    """A pool of one thread, called NAME, started now with every signal blocked."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        pool.submit(int).result()          # the thread starts now, with the mask it inherits
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return pool


class Beside:
    """Runs a job at a time on a thread of its own (`own_pool`) while the caller goes on; `done` waits for it.  A
    job's error is raised by `done`.  Used as a context, the thread ends with it."""

    def __init__(self, name: str):
        self._pool = own_pool(name)
        self._job: Future | None = None

    def start(self, job: Callable[..., None], *args) -> None:
        """Runs JOB(*ARGS) beside the caller, after the job before it ended."""
        self.done()
        self._job = self._pool.submit(job, *args)

    def done(self) -> None:
        """Waits for the job given last (its error raised here)."""
        job, self._job = self._job, None
        if job is not None:
            job.result()

    def __enter__(self) -> Beside:
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self.done()
        finally:
            self._pool.shutdown(wait=True)
