"""A core file's memory read from the file itself, past gdb.

gdb reads a core's memory from the file: the stored bytes of the load segment that holds an address, at its
offset.  Read from the file directly (`os.pread`), the bytes are the same, and cost no call into gdb and no copy
of gdb's own: a walk reading millions of small pieces through its block cache (tcmalloc's spans, mimalloc's pages)
spends a tenth less time, and a list followed a word at a time (tcmalloc's thread caches) is followed in C, a
read a word (`links`).  Only what lies wholly in the stored bytes of one load segment, that no other segment
overlaps and the file held when it was opened, is read so; gdb reads the rest (bytes it takes from the program's
files, a truncated core's missing tail), so each answer is the one gdb would have given.
"""

from __future__ import annotations

import bisect
import ctypes
import os
from pathlib import Path

import numpy as np

from heapwalk.inferior.clib import declared_library
from heapwalk.inferior.corefile import CoreError, CoreFile

__all__ = ["CoreReader", "LINKS_AT_ONCE"]

#: links `CoreReader.links` reads in one call at most (a damaged count may say billions: the rest is hopped)
LINKS_AT_ONCE = 1 << 20

#: the list walk in C (`_slots.c`), or None (see `inferior.clib`)
_LIB = declared_library(Path(__file__).parent, "_slots", {"hw_core_links": (
    ctypes.c_int64, [ctypes.c_int64] + [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_uint64, ctypes.c_int64,
                                                                ctypes.c_void_p])})


class CoreReader:
    """The stored memory of the core file at PATH (LOADS: its load segments, vaddr, memsz, offset, filesz), read
    from the file (see the module)."""

    def __init__(self, path: str, loads: list[tuple[int, int, int, int]]):
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._segments = _stored(loads, os.fstat(self._fd).st_size)
        self._starts = [lo for lo, _, _ in self._segments]
        self._arrays: tuple[np.ndarray, ...] | None = None

    @classmethod
    def open(cls, path: str | None) -> "CoreReader | None":
        """The core at PATH (an absolute path: gdb's), or None when it cannot be read as one, or stores nothing."""
        if not path or not os.path.isabs(path):
            return None
        try:
            core = CoreFile(path)
            loads = list(core.loads)
            core.close()
            reader = cls(path, loads)
        except (OSError, CoreError):
            return None
        if not reader._segments:
            reader.close()
            return None
        return reader

    def samples(self, count: int = 3) -> list[int]:
        """A few addresses it reads (the first of segments spread over the core), to check it against gdb."""
        step = max(1, len(self._segments) // count)
        return [lo for lo, hi, _ in self._segments[::step] if hi - lo >= 64][:count]

    def read(self, address: int, size: int) -> bytes | None:
        """SIZE bytes at ADDRESS from the file, or None where it does not hold them all in one segment (or
        cannot give them now)."""
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0 or size <= 0:
            return None
        lo, hi, offset = self._segments[i]
        if address + size > hi:
            return None
        try:
            data = os.pread(self._fd, size, offset + address - lo)
        except OSError:
            return None
        return data if len(data) == size else None

    def read_into(self, address: int, buffer) -> bool:
        """`read` into BUFFER (writable, its length the bytes wanted): whether it was filled."""
        i = bisect.bisect_right(self._starts, address) - 1
        size = len(buffer)
        if i < 0 or size <= 0 or address + size > self._segments[i][1]:
            return False
        lo, _, offset = self._segments[i]
        try:
            return os.preadv(self._fd, [buffer], offset + address - lo) == size
        except OSError:
            return False

    def links(self, head: int, count: int) -> list[int]:
        """`memory.links_from` read from the file: [HEAD, the word at HEAD, the word at that, ...], COUNT + 1 at
        most (`LINKS_AT_ONCE`), ending at a null link, at a node met again, or at a node whose word the file does not
        hold.  In C where built (a read a word, no Python between), else a read at a time here."""
        count = max(0, min(count, LINKS_AT_ONCE))          # a damaged count may be anything
        if _LIB is not None:
            if self._arrays is None:
                self._arrays = tuple(np.array([s[k] for s in self._segments], dtype=np.uint64) for k in range(3))
            lo, hi, offset = self._arrays
            out = np.empty(count + 1, dtype=np.uint64)
            n = _LIB.hw_core_links(self._fd, lo.ctypes.data, hi.ctypes.data, offset.ctypes.data, len(lo), head, count,
                                   out.ctypes.data)
            return out[:n].tolist()
        out, seen, link = [head], set(), head
        while link and len(out) <= count and link not in seen:
            seen.add(link)
            word = self.read(link, 8)
            if word is None:
                break
            link = int.from_bytes(word, "little")
            out.append(link)
        return out

    def close(self) -> None:
        """Closes the file (gdb keeps its own)."""
        os.close(self._fd)


def _stored(loads: list[tuple[int, int, int, int]], file_size: int) -> list[tuple[int, int, int]]:
    """(start, end, file offset) of each load segment's bytes the file holds (LOADS: vaddr, memsz, offset,
    filesz), in address order, leaving out every segment another overlaps (gdb would pick one of them)."""
    overlapped, reach, widest = set(), -1, None
    for span in sorted((v, v + m) for v, m, _, _ in loads if m > 0):
        if span[0] < reach:              # it starts inside one before it: both out
            overlapped.update((span, widest))
        if span[1] > reach:
            reach, widest = span[1], span
    out = []
    for vaddr, memsz, offset, filesz in sorted(loads):
        held = min(filesz, memsz, file_size - offset)
        if held > 0 and (vaddr, vaddr + memsz) not in overlapped:
            out.append((vaddr, vaddr + held, offset))
    return out
