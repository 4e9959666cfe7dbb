"""A target's memory as 8-byte words, read a window at a time: what walks that step through chunk headers
read, one bulk read per window instead of one per header."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from heapwalk.inferior.memory import Memory, ReadError, read_once

__all__ = ["Window", "word_reader", "read_window", "window_ahead", "let_go_ahead", "near_windows", "PROBE_SPAN", "SPAN",
           "NEAR_SPAN"]

#: bytes a walk reads at once
SPAN = 4 << 20
#: bytes of neighbouring pages or spans read at once (`near_windows`)
NEAR_SPAN = 2 << 20
#: bytes a probe (a resynchronisation, a region check) reads at once: it looks at little
PROBE_SPAN = 1 << 18


class Window:
    """The words of [base, base + SPAN) of one heap (up to its END), read in one piece; moved on as the
    walk goes."""

    def __init__(self, mem: Memory, end: int, span: int):
        self.mem, self.end, self.span = mem, end, span
        self.base, self.words = 0, memoryview(b"").cast("Q")

    def word(self, address: int) -> int:
        """The 8-byte word at ADDRESS (8-aligned), reading a new window when it is not in this one."""
        i = (address - self.base) >> 3
        if not 0 <= i < len(self.words):
            data = read_window(self.mem, address & ~7, self.end, self.span)
            if len(data) < 8:
                raise ReadError(address, 8)
            self.base, self.words = address & ~7, memoryview(data)[:len(data) // 8 * 8].cast("Q")
            i = 0
        return self.words[i]

    def many(self, address: int, count: int) -> np.ndarray:
        """Up to COUNT words from ADDRESS (8-aligned) in one read, as uint64: fewer where the heap or the
        target's memory ends first (`word` says what lies there, or raises).  The window is left as it is."""
        data = read_window(self.mem, address, min(self.end, address + 8 * count), 8 * count) if count > 0 else b""
        return np.frombuffer(data, dtype=np.uint64, count=min(count, len(data) // 8))


def word_reader(mem: Memory, end: int, span: int = SPAN):
    """A function giving the 8-byte word at an address below END, read SPAN bytes at a time (ReadError where
    memory is missing): for scans that step through chunk headers."""
    return Window(mem, end, span).word


def read_window(mem: Memory, base: int, end: int, span: int) -> bytes | memoryview:
    """Up to SPAN bytes at BASE, fewer where the target's memory ends (b"" when nothing is readable)."""
    size = max(16, min(span, end - base))
    while size >= 8:
        try:
            return read_once(mem, base, size)
        except ReadError:
            size = size // 2 if size > 4096 else (8 if size > 8 else 0)
    return b""


def window_ahead(mem: Memory, base: int, end: int, span: int) -> None:
    """Lets MEM read ahead, where it can (`CachedMemory.prefetch`: a core file's), the bytes the `read_window`
    of the same arguments asks for first, while the caller judges the window before."""
    prefetch = getattr(mem, "prefetch", None)
    if prefetch is not None and base < end:
        prefetch(base, max(16, min(span, end - base)))


def let_go_ahead(mem: Memory) -> None:
    """Lets MEM drop a window it read ahead that no read took (`window_ahead` before a walk stopped)."""
    let_go = getattr(mem, "let_go_ahead", None)
    if let_go is not None:
        let_go()


def near_windows(mem: Memory, starts: list[int], lengths: list[int], span: int = NEAR_SPAN
                 ) -> Iterator[tuple[int, int, int, bytes | memoryview]]:
    """(k, j, base, data): the ranges k to j-1 of STARTS (ascending) and LENGTHS, near enough to be read at once
    (within SPAN bytes of the first's start; one longer alone), and their bytes from BASE as far as they could be
    read (`read_window`); each group's read ahead (`window_ahead`) while the one before is judged."""
    groups, k = [], 0
    while k < len(starts):
        base, j = starts[k], k + 1
        while j < len(starts) and starts[j] + lengths[j] - base <= span:
            j += 1
        groups.append((k, j, base, max(starts[i] + lengths[i] for i in range(k, j))))
        k = j
    for g, (k, j, base, end) in enumerate(groups):
        data = read_window(mem, base, end, end - base) if end > base else b""
        if g + 1 < len(groups):
            window_ahead(mem, groups[g + 1][2], groups[g + 1][3], groups[g + 1][3] - groups[g + 1][2])
        yield k, j, base, data
