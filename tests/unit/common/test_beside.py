"""The thread beside the caller's: a job at a time, its error raised where its end is taken, its thread gone
with the context, and every signal blocked on it."""

import signal
import threading

import pytest

from heapwalk.common.beside import Beside, own_pool


def test_jobs_run_one_at_a_time_in_order():
    got, names = [], set()

    def job(k):
        names.add(threading.current_thread().name)
        got.append(k)

    with Beside("test-beside") as beside:
        for k in range(50):
            beside.start(job, k)
    assert got == list(range(50))
    assert len(names) == 1 and next(iter(names)).startswith("test-beside")
    assert not any(t.name.startswith("test-beside") for t in threading.enumerate())


def test_an_error_is_raised_where_the_job_is_taken():
    def broken():
        raise ValueError("bad window")

    with pytest.raises(ValueError, match="bad window"):
        with Beside("test-beside-error") as beside:
            beside.start(broken)
            beside.done()
    with Beside("test-beside-next") as beside:      # the next job after an error's is given its own start
        beside.start(broken)
        with pytest.raises(ValueError):
            beside.start(int)


def test_the_thread_blocks_every_signal():
    pool = own_pool("test-own-pool")
    try:
        mask = pool.submit(signal.pthread_sigmask, signal.SIG_BLOCK, ()).result()
    finally:
        pool.shutdown(wait=True)
    assert signal.SIGINT in mask and signal.SIGTERM in mask
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, ())
