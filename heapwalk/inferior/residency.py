"""Which pages of the target were in RAM at the instant heapwalk read it, where that is known.

Free memory costs RAM only where its pages are resident: a heap emptied by malloc_trim(0), or never touched
past its first pages, holds address space and nothing more.  Three sources know:
- a live process: /proc/PID/pagemap's present bit, read for the ranges asked about (`Pagemap`);
- a core `heapwalk capture` wrote: of its private mappings it holds the bytes of the pages that were
  resident or swapped out and leaves the others out (segments with no file bytes), and its HEAPWALK note
  lists the runs it holds that were not resident (`of_core`; what it says of anonymous memory is exact);
- the resident runs the capture recorded while gcore wrote a whole core (`of_runs`, from capture.json).
gcore's and the kernel's cores alone cannot say.  Pure Python and numpy, no gdb.
"""

from __future__ import annotations

import bisect
import errno
import json
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from heapwalk.inferior.corefile import CoreFile
from heapwalk.inferior.ranges import merged, ranges_without
from heapwalk.inferior.pages import EXCLUSIVE, FILE_PAGE, PAGE, ZeroPages

__all__ = ["Residency", "Pagemap", "of_core", "of_runs", "load_runs", "present_runs", "runs_of",
           "PAGE"]

#: the environment variable through which the command line names, for a whole core gcore wrote, a JSON file of
#: the resident runs it read from /proc/PID/pagemap at the capture ({"resident_runs": [[start, end], ...]})
_TOP = (1 << 63) - 1             # addresses are compared as int64: a damaged one above is clipped here
_SPAN_MAX = 1 << 40              # a range asked of a live page map wider than this comes from a damaged size


class Residency:
    """Resident memory as sorted, disjoint [start, end) runs, and where that was learnt (SOURCE: a phrase
    such as "the process's page map")."""

    def __init__(self, runs: Iterable[tuple[int, int]], source: str):
        pairs = np.array(sorted(runs), dtype=np.int64).reshape(-1, 2)
        self.starts, self.ends = pairs[:, 0].copy(), pairs[:, 1].copy()
        self._below_run = np.concatenate(([0], np.cumsum(self.ends - self.starts)))
        self.source = source

    def covering(self, ranges: Iterable[tuple[int, int]]) -> Residency:
        """This residency, knowing at least RANGES (a live source reads them; a recorded one knows all)."""
        return self

    def _below(self, x: np.ndarray) -> np.ndarray:
        """Resident bytes below each address of X."""
        i = np.searchsorted(self.starts, x, side="right") - 1
        inside = np.minimum(x - self.starts[np.maximum(i, 0)], (self.ends - self.starts)[np.maximum(i, 0)])
        return np.where(i >= 0, self._below_run[np.maximum(i, 0)] + np.maximum(inside, 0), 0)

    def resident(self, start: int, end: int) -> int:
        """Resident bytes of [START, END)."""
        return self.resident_sum(np.array([start]), np.array([end]))

    def resident_sum(self, starts, ends) -> int:
        """Resident bytes of the ranges [STARTS[i], ENDS[i]) (arrays of addresses), summed (a byte in two
        ranges counts twice)."""
        if not len(self.starts):
            return 0
        lo = np.clip(np.asarray(starts, dtype=np.uint64), 0, _TOP).astype(np.int64)
        hi = np.maximum(np.clip(np.asarray(ends, dtype=np.uint64), 0, _TOP).astype(np.int64), lo)
        return int((self._below(hi) - self._below(lo)).sum())

    def resident_each(self, starts, ends) -> np.ndarray:
        """Resident bytes of each range [STARTS[i], ENDS[i]), as an int64 array."""
        if not len(self.starts):
            return np.zeros(len(starts), dtype=np.int64)
        lo = np.clip(np.asarray(starts, dtype=np.uint64), 0, _TOP).astype(np.int64)
        hi = np.maximum(np.clip(np.asarray(ends, dtype=np.uint64), 0, _TOP).astype(np.int64), lo)
        return self._below(hi) - self._below(lo)

    def within(self, start: int, end: int) -> np.ndarray:
        """The resident runs clipped to [START, END), in order, as an (n, 2) int64 array of [start, end)."""
        lo = int(np.searchsorted(self.ends, start, side="right"))
        hi = int(np.searchsorted(self.starts, end, side="left"))
        return np.stack((np.maximum(self.starts[lo:hi], start), np.minimum(self.ends[lo:hi], end)), axis=1)

    @property
    def total(self) -> int:
        return int(self._below_run[-1])


class Pagemap(Residency):
    """A live process's resident pages, read from /proc/PID/pagemap for the ranges asked about (reading it
    changes nothing in the process)."""

    def __init__(self, pid: int):
        super().__init__((), "the process's page map, /proc/PID/pagemap")
        self.pid = pid

    def covering(self, ranges: Iterable[tuple[int, int]]) -> Residency:
        runs: list[tuple[int, int]] = []
        spans = merged((lo // PAGE * PAGE, -(-hi // PAGE) * PAGE) for lo, hi in ranges
                        if 0 <= lo < hi <= _TOP and hi - lo <= _SPAN_MAX)    # wider: a damaged size
        zero = ZeroPages()
        try:
            with open(f"/proc/{self.pid}/pagemap", "rb", buffering=0) as f:
                for lo, hi in spans:
                    for at in range(lo, hi, 1 << 30):
                        runs.extend(present_runs(f.fileno(), at, min(hi, at + (1 << 30)), zero))
        finally:
            zero.close()
        return Residency(runs, self.source)


def runs_of(mask: np.ndarray, base: int, unit: int = PAGE) -> list[tuple[int, int]]:
    """[start, end) runs of the true entries of MASK, entry i covering [BASE + i * UNIT, BASE + (i + 1) * UNIT)."""
    edges = np.flatnonzero(np.diff(np.concatenate(([False], mask, [False])).view(np.int8)))
    return [(base + a * unit, base + b * unit) for a, b in zip(edges[::2].tolist(), edges[1::2].tolist())]


def present_runs(pagemap: int, lo: int, hi: int, zero: "ZeroPages | None" = None) -> list[tuple[int, int]]:
    """[start, end) runs of the present pages of [LO, HI) (page-aligned), from the pagemap file PAGEMAP (none
    where it cannot be read), less the kernel's zero page where ZERO tells it (a page only ever read, by the
    process or by a tool before heapwalk, is mapped to it: present, but no RAM of the process's)."""
    try:
        entries = np.frombuffer(os.pread(pagemap, (hi - lo) // PAGE * 8, lo // PAGE * 8), dtype=np.uint64)
    except OSError:
        return []
    present = (entries >> np.uint64(63)).astype(bool)
    if zero is not None:
        shared = present & ((entries & np.uint64(FILE_PAGE | EXCLUSIVE)) == 0)
        present &= ~zero.mask(entries, shared)
    return runs_of(present, lo)


def of_core(core: CoreFile) -> Residency | None:
    """The residency a core `heapwalk capture` wrote records (its segments with bytes, less the runs its
    HEAPWALK note lists as not resident; for the mappings whose pages it does not list, the RSS it recorded of
    each), or None for any other core."""
    facts = core.capture_facts()
    if facts.get("residency") != "segments":
        return None
    kept = [(vaddr, vaddr + filesz) for vaddr, _, _, filesz in core.loads if filesz]
    absent = [(a, b) for a, b in facts.get("not_resident", ()) if isinstance(a, int) and isinstance(b, int)]
    runs = ranges_without(merged(kept), absent)
    return Residency(_with_mapping_rss(runs, kept, facts.get("mapping_rss", ())),
                     "the page map the capture recorded in its core")


def in_core(core: CoreFile, seen: tuple[list[tuple[int, int]], list[tuple[int, int]]] | None = None) -> Residency:
    """What a core that says nothing of residency holds of each address: the pages of its load segments that
    hold anything but zeros (the kernel leaves a page the process never touched out of its core, and gcore
    writes it as zeros).  Decided by the bytes, not by how the file is stored, so that a copy of the core says
    the same; the holes of a sparse file are skipped unread.  Not which pages were resident.  SEEN, when given,
    is what a walk already read of the core's memory: the whole pages it judged, and the runs of them that hold
    anything but zeros (`analysis.pages`); those pages are not read again."""
    judged, nonzero = (merged(seen[0]), merged(seen[1])) if seen is not None else ([], [])
    runs = []
    fd = core.fileno()
    for vaddr, _, offset, filesz in core.loads:
        if not filesz or vaddr >= 1 << 63:        # the kernel's vsyscall page lies above: never the process's
            continue
        runs += _clipped(nonzero, vaddr, vaddr + filesz)
        cut = _clipped(judged, vaddr, vaddr + filesz)
        wanted = [(vaddr + (a - offset) // PAGE * PAGE, vaddr - (-(b - offset) // PAGE) * PAGE)
                  for a, b in _data_runs(fd, offset, offset + filesz)]           # the pages each data run touches
        for lo_at, hi_at in ranges_without(wanted, cut) if cut else wanted:
            runs += _read_runs(fd, vaddr, offset, filesz, (lo_at - vaddr) // PAGE, (hi_at - vaddr) // PAGE)
    return Residency(merged(runs), "its pages that hold anything; a plain core does not say which were resident")


def _read_runs(fd: int, vaddr: int, offset: int, filesz: int, first: int, last: int) -> list[tuple[int, int]]:
    """The runs of pages FIRST to LAST of the load segment at VADDR (its bytes at OFFSET of the file FD, FILESZ
    of them) that hold anything but zeros, read a window at a time."""
    runs = []
    for lo in range(first, last, _WINDOW_PAGES):
        hi = min(last, lo + _WINDOW_PAGES)
        runs += [(vaddr + x * PAGE, vaddr + y * PAGE) for x, y in
                 _nonzero_pages(fd, offset + lo * PAGE, offset + min(hi * PAGE, filesz), lo)]
    return runs


def _clipped(ranges: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of RANGES (merged) inside [LO, HI)."""
    i = bisect.bisect_right(ranges, (lo, lo))
    i = i - 1 if i and ranges[i - 1][1] > lo else i
    out = []
    while i < len(ranges) and ranges[i][0] < hi:
        a, b = ranges[i]
        if b > lo:
            out.append((max(a, lo), min(b, hi)))
        i += 1
    return out


#: pages of a core read at once when looking for pages that hold anything
_WINDOW_PAGES = 4096


def _nonzero_pages(fd: int, lo: int, hi: int, first: int) -> list[tuple[int, int]]:
    """The runs (in pages, counted from FIRST) of the file FD's [LO, HI), read page by page in one read, whose
    pages hold anything but zeros."""
    data = os.pread(fd, hi - lo, lo)
    whole = len(data) // PAGE
    held = np.frombuffer(data, dtype=np.uint64, count=whole * PAGE // 8).reshape(whole, PAGE // 8).max(axis=1) != 0
    if len(data) > whole * PAGE:                  # a last page the segment ends inside
        held = np.append(held, any(data[whole * PAGE:]))
    return [(first + a // PAGE, first + b // PAGE) for a, b in runs_of(held, 0)]


def _data_runs(fd: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """The runs of [LO, HI) of the file FD that hold data (all of it where the file system cannot say)."""
    out, at = [], lo
    try:
        while at < hi:
            start = os.lseek(fd, at, os.SEEK_DATA)
            if start >= hi:
                break
            end = min(hi, os.lseek(fd, start, os.SEEK_HOLE))
            out.append((start, end))
            at = end
    except OSError as exc:
        if exc.errno != errno.ENXIO:        # past the last data
            return [(lo, hi)]
    return out


def _with_mapping_rss(runs: list[tuple[int, int]], kept: list[tuple[int, int]], recorded) -> list[tuple[int, int]]:
    """RUNS with, for each mapping whose pages the capture does not list (files, shared memory, the kernel's:
    RECORDED's [start, end, rss] from /proc/PID/smaps), runs as long as its RSS over what KEPT (the core's bytes)
    holds of it first: their resident bytes, not which pages."""
    listed = [(a, b, n) for a, b, n in (r for r in recorded if isinstance(r, (list, tuple)) and len(r) == 3)
              if isinstance(a, int) and isinstance(b, int) and isinstance(n, int) and 0 <= n <= b - a]
    if not listed:
        return runs
    runs = ranges_without(sorted(runs), sorted((a, b) for a, b, _ in listed))
    kept = merged(kept)
    ends = [y for _, y in kept]
    for a, b, n in listed:
        inside = []
        for x, y in kept[bisect.bisect_right(ends, a):]:      # the kept ranges that end past A, in order
            if x >= b:
                break
            inside.append((max(x, a), min(y, b)))
        for x, y in inside + ranges_without([(a, b)], inside):
            if n <= 0:
                break
            runs.append((x, min(y, x + n)))
            n -= min(y, x + n) - x
    return runs


def of_runs(runs: Iterable) -> Residency:
    """The residency of the resident RUNS ([start, end) pairs) the capture read while gcore wrote the core."""
    return Residency(((int(a), int(b)) for a, b in runs), "the page map the capture recorded in capture.json")


def load_runs(path: str | Path) -> Residency | None:
    """The residency in the JSON file PATH names ({"resident_runs": [...]}, and the RSS of the mappings whose
    pages it does not list from its "smaps"), or None when it has none."""
    try:
        record = json.loads(Path(path).read_text())
        runs = record.get("resident_runs")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(runs, list):
        return None
    smaps = record.get("smaps") if isinstance(record.get("smaps"), list) else []
    recorded = [[m.get("start"), m.get("end"), m.get("rss")] for m in smaps if isinstance(m, dict)
                and not ("w" in str(m.get("perms")) and "p" in str(m.get("perms")))]
    try:
        pairs = [(int(a), int(b)) for a, b in runs]
        return Residency(_with_mapping_rss(pairs, [], recorded), "the page map the capture recorded in capture.json")
    except (TypeError, ValueError):
        return None
