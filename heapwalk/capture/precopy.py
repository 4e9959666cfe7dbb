"""Pre-copy: a running process's private anonymous memory (its heaps, arenas, stacks, mmapped chunks) read
before it is stopped, so that the stop only reads again the pages it wrote meanwhile.

The kernel's soft-dirty bits say which pages a process wrote since they were last cleared (bit 55 of each
/proc/PID/pagemap entry; writing "4" to /proc/PID/clear_refs clears them all, and write-protects the pages so
that the next write to each sets its bit again).  `run` clears them, reads every present or swapped-out page
of the process's private anonymous mappings while it runs (into a scratch file beside the core), then, in
rounds, stops it for as long as reading its page map takes, notes the pages written since the last clear,
clears again, lets it go and reads those pages again, while that set shrinks.  The capture's final stop
(`heapwalk.capture.corewriter.write_core`) then reads from the process only the pages written since the last
clear, the pages that were not copied, and everything that is not private anonymous memory; the core is
the process's memory at that stop, as a stop-the-world capture would have read it:
- a page whose bit is clear at a stop was not written since the clear that preceded its last copy, which was
  taken after that clear, so the copy holds what the page holds (its bit is cleared and read only while the
  process is stopped, so no write falls between the two);
- a mapping created, moved or grown since a clear has every page marked written by the kernel; a page pinned
  for a device keeps its bit set; a page freed meanwhile is read as the final plan says (zeros); a present
  page the process does not map alone (the kernel's zero page, mapped with no bit where a freed page was read
  again, or a page shared since a fork) is read again at the stop.
The process pays for it: its first write to each page after a clear takes a minor fault, and whatever else
tracks its soft-dirty bits (CRIU's incremental dumps) sees them cleared.  Only anonymous memory is copied
while it runs: a read there of a page the process frees in the microseconds between the page map's word and
the read gets the kernel's shared zero page mapped (no memory allocated), never shared memory or a file's
page (`heapwalk.inferior.pages`).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from heapwalk.capture import ptrace
from heapwalk.common.errors import HeapwalkError
from heapwalk.inferior.pages import EXCLUSIVE, PAGE, PRESENT, SPECIAL, SWAPPED, LivePages, MapsLine, Page
from heapwalk.inferior.residency import runs_of

__all__ = ["SOFT_DIRTY", "PrecopyUnavailable", "untracked_reason", "clear", "Copies", "Precopy", "run"]

SOFT_DIRTY = 1 << 55
_CHUNK = 8 << 20                 # bytes read from the process at once while it runs
_ROUNDS = 4                      # the most rounds of reading again what was written, before the final stop
_GAP = 16 << 10                  # written pages this close are read again in one read, the pages between too
_SMALL = 32 << 20                # written bytes the final stop may as well read: no further round
NOT_COPIED, ZEROS = -1, -2       # a page's scratch offset when it holds no copy, or a copy that is all zeros


def _libc_fallocate():
    """libc's fallocate(2), or None (punching holes is then skipped)."""
    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function


_fallocate = _libc_fallocate()
_KEEP_SIZE, _PUNCH_HOLE = 1, 2


class PrecopyUnavailable(HeapwalkError):
    """Soft-dirty tracking cannot be used on this process: the capture stops it for the whole read."""


def untracked_reason() -> str | None:
    """None when this kernel tracks the pages a process writes (soft-dirty), else why not, in a few words:
    a page this process has just written must show its bit."""
    page = mmap.mmap(-1, PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        page[0] = 1
        address = np.frombuffer(page, dtype=np.uint8).ctypes.data
        with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
            entry = int.from_bytes(os.pread(pagemap.fileno(), 8, address // PAGE * 8), "little")
    except OSError as exc:
        return f"cannot read the page map ({exc.strerror})"
    finally:
        page.close()
    if not entry & SOFT_DIRTY:
        return "this kernel does not track which pages a process writes (soft-dirty, CONFIG_MEM_SOFT_DIRTY)"
    return None


def clear(pid: int) -> None:
    """Clears PID's soft-dirty bits; PrecopyUnavailable when this user may not."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("4")
    except OSError as exc:
        raise PrecopyUnavailable(f"cannot clear the soft-dirty bits of {pid} ({exc.strerror})") from None


def copied_kinds(m: MapsLine) -> bool:
    """Is mapping M copied while the process runs (private anonymous memory it may read)?"""
    return m.anonymous and m.perms[0] == "r" and m.name not in SPECIAL


@dataclass
class Copies:
    """The copies of runs of pages, in a scratch file: for each run [lo, hi) the scratch offset of each of its
    pages (`NOT_COPIED`, `ZEROS`, or where its bytes are)."""

    fd: int
    end: int = 0
    runs: list = field(default_factory=list)          # (lo, hi, offsets), sorted by lo, disjoint
    _starts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))

    def add(self, lo: int, hi: int) -> np.ndarray:
        """A new run [LO, HI), no page copied yet; its offsets."""
        offsets = np.full((hi - lo) // PAGE, NOT_COPIED, dtype=np.int64)
        self.runs.append((lo, hi, offsets))
        return offsets

    def store(self, offsets: np.ndarray, first: int, data: memoryview) -> int:
        """DATA, whole pages from page FIRST of a run (OFFSETS), as their copies (`store_marked`)."""
        n = len(data) // PAGE
        return self.store_marked(offsets, first, data, np.ones(n, dtype=bool))

    def store_marked(self, offsets: np.ndarray, first: int, data: memoryview, marked: np.ndarray) -> int:
        """The pages MARKED marks of DATA (page i of DATA is page FIRST + i of a run, OFFSETS), as their copies:
        those that hold anything appended to the scratch file, the others marked `ZEROS`.  The bytes written."""
        which = np.flatnonzero(marked)
        pages = np.frombuffer(data, dtype=np.uint64, count=len(marked) * PAGE // 8).reshape(len(marked), -1)
        nonzero = np.zeros(len(marked), dtype=bool)
        nonzero[which] = pages[which].any(axis=1)
        offsets[first + which] = ZEROS
        written = 0
        for a, b in runs_of(nonzero, 0, 1):
            os.pwrite(self.fd, data[a * PAGE:b * PAGE], self.end)
            offsets[first + a:first + b] = np.arange(self.end, self.end + (b - a) * PAGE, PAGE)
            self.end += (b - a) * PAGE
            written += (b - a) * PAGE
        return written

    def release(self, at: int, size: int) -> None:
        """SIZE bytes of the scratch file at AT are no longer needed: their blocks are given back (a hole
        punched), so that the scratch file and the core never both hold all the copies."""
        if _fallocate is not None:
            _fallocate(self.fd, _PUNCH_HOLE | _KEEP_SIZE, at, size)

    def sort(self) -> None:
        self.runs.sort(key=lambda r: r[0])
        self._starts = np.array([r[0] for r in self.runs], dtype=np.uint64)

    def forget(self, entries_of) -> int:
        """Marks `NOT_COPIED` the pages the process wrote, or freed, since the last clear (ENTRIES_OF(lo, hi):
        their page map entries), and those present but not its alone: the kernel's zero page, mapped without a
        soft-dirty bit where a page freed meanwhile was read, or a page shared since a fork; the bytes of those
        present or swapped out (to read again)."""
        again = 0
        for lo, hi, offsets in self.runs:
            entries = entries_of(lo, hi)
            there = (entries & np.uint64(PRESENT | SWAPPED)) != 0
            shared = ((entries & np.uint64(PRESENT)) != 0) & ((entries & np.uint64(EXCLUSIVE)) == 0)
            stale = ((entries & np.uint64(SOFT_DIRTY)) != 0) | ~there | shared
            stale &= offsets != NOT_COPIED
            again += int((stale & there).sum()) * PAGE
            offsets[stale] = NOT_COPIED
        return again

    def pieces(self, lo: int, hi: int):
        """[LO, HI) (page-aligned) cut into (start, end, scratch offset or None) pieces: runs of pages whose
        copy holds all their bytes at consecutive offsets (`ZEROS` for zeros), or None where the process
        must be read."""
        out: list[tuple[int, int, int | None]] = []
        at = lo
        i = max(int(np.searchsorted(self._starts, np.uint64(lo), side="right")) - 1, 0) if self.runs else 0
        while at < hi:
            if i >= len(self.runs) or self.runs[i][0] >= hi:
                out.append((at, hi, None))
                break
            rlo, rhi, offsets = self.runs[i]
            if rhi <= at:
                i += 1
                continue
            if rlo > at:
                out.append((at, rlo, None))
                at = rlo
            end = min(hi, rhi)
            out += _offset_pieces(offsets[(at - rlo) // PAGE:(end - rlo) // PAGE], at)
            at = end
            i += 1
        return _joined(out)


def _offset_pieces(offsets: np.ndarray, base: int) -> list[tuple[int, int, int | None]]:
    """Pieces of equal kind of consecutive pages from BASE on: copies at consecutive offsets, zeros, or not
    copied."""
    if not len(offsets):
        return []
    step = np.diff(offsets)
    copied = offsets >= 0
    breaks = (step != PAGE) | ~copied[1:] | ~copied[:-1]
    breaks &= ~((offsets[1:] == offsets[:-1]) & ~copied[1:])         # runs of ZEROS or NOT_COPIED stay whole
    bounds = [0, *(np.flatnonzero(breaks) + 1).tolist(), len(offsets)]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        first = int(offsets[a])
        out.append((base + a * PAGE, base + b * PAGE, None if first == NOT_COPIED else first))
    return out


def _joined(pieces):
    """PIECES with neighbours to read from the process, or of zeros, joined."""
    out: list[tuple[int, int, int | None]] = []
    for lo, hi, at in pieces:
        if out and out[-1][1] == lo and (at is None or at == ZEROS) and out[-1][2] == at:
            out[-1] = (out[-1][0], hi, at)
        else:
            out.append((lo, hi, at))
    return out


def _near_runs(runs: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """RUNS with those at most GAP bytes apart joined: one read of the pages between (their copies taken
    again) costs less than a read more."""
    out: list[tuple[int, int]] = []
    for lo, hi in runs:
        if out and lo - out[-1][1] <= gap:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


@dataclass
class Round:
    """One read while the process ran: the bytes it read and stored, and how long it took."""

    read: int
    stored: int
    seconds: float
    stopped: float = 0.0         # the stop before it, to note what was written and clear (none before the first)


class Precopy:
    """The copies `run` took of process PID's anonymous memory (`copies`), with the rounds that took them.
    `at_stop` forgets, once the process is stopped for good, the pages written since the last clear; `pieces`
    then tells the core writer what it may take from the copies; `close` removes the scratch file."""

    def __init__(self, pid: int, scratch: Path):
        self.pid = pid
        self.scratch = scratch
        scratch.unlink(missing_ok=True)
        self.copies = Copies(os.open(scratch, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        self.rounds: list[Round] = []
        self.left = 0                # bytes written that no round read again, left to the final stop
        self.forgotten = 0           # bytes written since the last clear, forgotten at the final stop

    def close(self) -> None:
        if self.copies.fd >= 0:
            os.close(self.copies.fd)
            self.copies.fd = -1
        self.scratch.unlink(missing_ok=True)

    def first_pass(self, pages: LivePages, mem: int, buffer: memoryview) -> Round:
        """Every present or swapped-out page of PAGES' anonymous mappings, read while the process runs."""
        started, read, stored = time.monotonic(), 0, 0
        for m in pages.maps:
            if not copied_kinds(m):
                continue
            kinds = pages.pages(m)
            wanted = np.flatnonzero((kinds == int(Page.OWN)) | (kinds == int(Page.SWAPPED)))
            if not len(wanted):
                continue
            lo, hi = m.start + int(wanted[0]) * PAGE, m.start + (int(wanted[-1]) + 1) * PAGE
            offsets = self.copies.add(lo, hi)
            marked = np.zeros(len(offsets), dtype=bool)
            marked[wanted - wanted[0]] = True
            got, kept = self._read_marked(pages, mem, buffer, offsets, lo, marked)
            read, stored = read + got, stored + kept
        self.copies.sort()
        return self._ran(started, read, stored)

    def again(self, pages: LivePages, mem: int, buffer: memoryview, stopped: float) -> Round:
        """The pages `forget` marked, read again while the process runs (with the few between written pages
        that lie closer than `_GAP`: one read costs less than two)."""
        started, read, stored = time.monotonic(), 0, 0
        for lo, _, offsets in self.copies.runs:
            marked = offsets == NOT_COPIED
            if not marked.any():
                continue
            for a, b in _near_runs(runs_of(marked, 0, 1), _GAP // PAGE):
                marked[a:b] = True
            got, kept = self._read_marked(pages, mem, buffer, offsets, lo, marked)
            read, stored = read + got, stored + kept
        return self._ran(started, read, stored, stopped)

    def _ran(self, started: float, read: int, stored: int, stopped: float = 0.0) -> Round:
        done = Round(read, stored, time.monotonic() - started, stopped)
        self.rounds.append(done)
        return done

    def _read_marked(self, pages: LivePages, mem: int, buffer: memoryview, offsets: np.ndarray, base: int,
                     marked: np.ndarray) -> tuple[int, int]:
        """The pages MARKED marks of the run at BASE (its OFFSETS), a window of `_CHUNK` bytes at a time, each
        read only where the page map says, just before, that it is present or swapped out (a page freed
        meanwhile is not read), one read per run of them; (bytes read, bytes stored)."""
        read = stored = 0
        per = _CHUNK // PAGE
        for w in range(0, len(marked), per):
            window = marked[w:w + per]
            if not window.any():
                continue
            lo = base + w * PAGE
            there = (pages.entries(lo, lo + len(window) * PAGE) & np.uint64(PRESENT | SWAPPED)) != 0
            got = np.zeros(len(window), dtype=bool)
            for a, b in runs_of(window & there, 0, 1):
                try:
                    n = os.preadv(mem, [buffer[a * PAGE:b * PAGE]], lo + a * PAGE) // PAGE
                except OSError:
                    continue                 # unmapped meanwhile: not copied, read at the stop if still there
                got[a:a + n] = True
            if got.any():
                stored += self.copies.store_marked(offsets, w, buffer, got)
                read += int(got.sum()) * PAGE
        return read, stored

    def at_stop(self, pages: LivePages) -> None:
        """With the process stopped for good: the pages written (or freed) since the last clear are forgotten,
        for the core writer to read them."""
        self.forgotten = self.copies.forget(pages.entries)

    def pieces(self, lo: int, hi: int):
        return self.copies.pieces(lo, hi)

    def expected_at_stop(self) -> int:
        """About the most the final stop should read from the process's anonymous memory: for the memory held
        to read it into (`heapwalk.capture.corewriter.hold_for`)."""
        last = self.rounds[-1].read if self.rounds else 0
        return 2 * max(last, self.left) + (64 << 20)


def run(pid: int, scratch: Path) -> Precopy:
    """PID's anonymous memory copied while it runs, in rounds (see the module), into SCRATCH; the copies, to
    hand to `write_core` at the final stop.  PrecopyUnavailable when the kernel does not track soft-dirty pages
    or this user may not clear them; `ptrace.PtraceError` when a round cannot stop the process."""
    reason = untracked_reason()
    if reason:
        raise PrecopyUnavailable(reason)
    try:
        mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError as exc:
        raise PrecopyUnavailable(f"cannot read /proc/{pid}/mem ({exc.strerror})") from None
    precopy = Precopy(pid, scratch)
    try:
        buffer = memoryview(bytearray(_CHUNK))
        clear(pid)
        with LivePages(pid) as pages:
            last = precopy.first_pass(pages, mem, buffer).read
        _rounds(precopy, mem, buffer, last)
    except BaseException:
        precopy.close()
        raise
    finally:
        os.close(mem)
    return precopy


def _rounds(precopy: Precopy, mem: int, buffer: memoryview, last: int) -> None:
    """While the pages to read again were many (LAST bytes, at first those of the first read): the process
    stopped to note what it wrote since the last clear and clear again, then those pages read again as it runs;
    until what it wrote stops shrinking by half (then it is left to the final stop, with no clear) or `_ROUNDS`
    rounds."""
    pid = precopy.pid
    for _ in range(_ROUNDS):
        if last <= _SMALL:
            return
        started = time.monotonic()
        with ptrace.stop(pid):
            with LivePages(pid) as pages:
                written = precopy.copies.forget(pages.entries)
            shrinking = written < last // 2
            last = written
            if shrinking:
                clear(pid)
        stopped = time.monotonic() - started
        if not shrinking:
            precopy.rounds.append(Round(0, 0, 0.0, stopped))
            precopy.left = written
            return
        with LivePages(pid) as pages:
            precopy.again(pages, mem, buffer, stopped)
