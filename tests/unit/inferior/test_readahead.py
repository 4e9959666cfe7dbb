"""A window read ahead on a thread of heapwalk's own (`readahead.ReadAhead`, `CachedMemory.prefetch`): taken by
the read of the same bytes, let go by any other, never harming what a read returns."""

from __future__ import annotations

import signal
import threading

import numpy as np

from heapwalk.inferior.memory import CachedMemory, ReadError
from heapwalk.inferior.readahead import ReadAhead
from heapwalk.inferior.window import read_window, window_ahead

BASE = 0x10_0000
IMAGE = np.random.default_rng(4).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()


class _Reader:
    """IMAGE at BASE, read by any thread; which thread read what, and the signals it had blocked."""

    def __init__(self):
        self.reads: list[tuple[int, int, str]] = []
        self.blocked: set[int] = set()

    def __call__(self, address: int, size: int) -> bytes | None:
        self.reads.append((address, size, threading.current_thread().name))
        if threading.current_thread() is not threading.main_thread():
            self.blocked = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
        if address < BASE or address + size > BASE + len(IMAGE):
            return None
        return IMAGE[address - BASE:address - BASE + size]

    def into(self, address: int, buffer) -> bool:
        """The read as `coreread.CoreReader.read_into` makes it."""
        data = self(address, len(buffer))
        if data is not None:
            memoryview(buffer)[:] = data
        return data is not None


def test_a_window_read_ahead_is_taken_once_by_the_read_of_the_same_bytes():
    reader = _Reader()
    ahead = ReadAhead(reader.into)
    ahead.start(BASE, 8192)
    assert ahead.take(BASE, 8192) == IMAGE[:8192]
    assert ahead.take(BASE, 8192) is None                    # taken: not held any more
    ahead.start(BASE, 8192)
    assert ahead.take(BASE, 4096) is None and ahead.take(BASE, 8192) is None    # other bytes: let go
    ahead.start(BASE - 4096, 8192)                           # bytes the reader does not have
    assert ahead.take(BASE - 4096, 8192) is None
    assert {name for _, _, name in reader.reads} != {threading.main_thread().name}
    assert {signal.SIGINT, signal.SIGCHLD, signal.SIGTERM} <= reader.blocked


def test_a_reader_that_fails_ahead_is_read_again_as_before():
    def failing(address: int, buffer) -> bool:
        raise OSError("gone")
    ahead = ReadAhead(failing)
    ahead.start(BASE, 4096)
    assert ahead.take(BASE, 4096) is None


def _memory(reader: _Reader) -> CachedMemory:
    def raw(address: int, size: int) -> bytes:
        data = reader(address, size)
        if data is None:
            raise ReadError(address, size)
        return data
    return CachedMemory(raw, regions=[(BASE, BASE + len(IMAGE))], raw_buffer=raw, read_ahead=ReadAhead(reader.into))


def test_windows_read_ahead_are_the_bytes_read_without():
    """The scan's way: each window read, the next asked for ahead; the same bytes as reading them plainly, the
    windows after the first read on the other thread; a window past the regions is never read ahead."""
    reader = _Reader()
    mem = _memory(reader)
    got, base, end = [], BASE + 8, BASE + len(IMAGE) - 8
    while base < end:
        data = read_window(mem, base, end, 3 << 16)
        window_ahead(mem, base + len(data), end, 3 << 16)
        got.append(bytes(data))
        base += len(data)
    assert b"".join(got) == IMAGE[8:-8] and len(got) > 4
    ahead = [r for r in reader.reads if r[2] != threading.main_thread().name]
    assert [(a, s) for a, s, _ in ahead] == [(BASE + 8 + k * (3 << 16), len(g)) for k, g in enumerate(got[1:], 1)]
    reader.reads.clear()
    window_ahead(mem, BASE + len(IMAGE), BASE + len(IMAGE) + 8192, 8192)
    mem.prefetch(BASE - 8192, 8192)
    assert reader.reads == []


def test_reading_ahead_leaves_the_fast_path_of_small_reads_as_it_was():
    reader = _Reader()
    mem = _memory(reader)
    assert mem.read(BASE + 16, 8) == IMAGE[16:24]
    region = mem._region
    mem.prefetch(BASE + 65536, 8192)
    assert mem._region == region and mem.read(BASE + 24, 8) == IMAGE[24:32]
    assert mem.read_buffer(BASE + 65536, 8192) == IMAGE[65536:65536 + 8192]
