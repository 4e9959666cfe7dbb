"""The graph of blocks as the leak scan finds it, window by window: only the rows it needs, kept small.

The scan reads the roots first, then the heaps in address order.  What `report` and `leaks` need is which
blocks are reached and, for the blocks that are not, where their words point (`leaks.find_leaks` follows the
leaked blocks' rows).  So, by default, a block already reached when its words are read marks at once the
blocks they point into and keeps no row: only the blocks not reached yet keep their edges, and `close` follows
those rows from every block reached, which gives the same reached blocks as following every edge (the tests
hold the two equal).  A row costs 4 bytes an edge and 12 for its block; a block without a row costs nothing.
`heapwalk chunk` asks for a path from a root (`paths`): then every block keeps its row, and the search keeps
which block led to which (`SparseRows.graph`).

In C when `pip install` built heapwalk's small library (`_reach.c`: `hw_scan_rows`, `hw_close`); numpy's form
keeps every row (its reached blocks are the same).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from heapwalk.analysis.graph import Graph
from heapwalk.analysis.lookup import Locator
from heapwalk.inferior.clib import declared_library

__all__ = ["Rows", "SparseRows"]

#: entries a slab holds (4 MiB of targets), more when one window needs more
SLAB = 1 << 18
#: words of a window the C pass judges at a time (its room: 16 bytes a word)
BATCH = 1 << 15

#: the built library's close, or None (see `inferior.clib`)
_LIB = declared_library(Path(__file__).parent, "_reach", {"hw_close": (
    ctypes.c_int64, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                     ctypes.c_void_p])})


class _Column:
    """An array appended to a window at a time, in slabs, joined once at the end (each slab given back as it is
    copied).  A window asks room for as many entries as it has words, and most keep few."""

    def __init__(self, dtype):
        self.dtype = dtype
        self._slabs: list[np.ndarray] = []
        self._used = 0

    def room(self, n: int) -> np.ndarray:
        """Room for N more, in the last slab or a new one (write, then `took`)."""
        if not self._slabs or self._used + n > len(self._slabs[-1]):
            if self._slabs:          # a copy: the slab's unused room (a window's worth) is given back
                self._slabs[-1] = self._slabs[-1][:self._used].copy()
            self._slabs.append(np.empty(max(SLAB, n), dtype=self.dtype))
            self._used = 0
        return self._slabs[-1][self._used:]

    def took(self, n: int) -> None:
        self._used += n

    def joined(self, extra: int = 0) -> np.ndarray:
        """Everything appended, as one array (with EXTRA entries more at its end, unset)."""
        if self._slabs:
            self._slabs[-1] = self._slabs[-1][:self._used]
        out = np.empty(sum(len(s) for s in self._slabs) + extra, dtype=self.dtype)
        at = 0
        while self._slabs:
            part = self._slabs.pop(0)
            out[at:at + len(part)] = part
            at += len(part)
        return out


class SparseRows:
    """The rows kept: node KEYS[k] (int32, ascending) leads to TARGETS[STARTS[k]:STARTS[k + 1]] (STARTS int64,
    one more than the keys); a node not among the keys leads nowhere that was kept."""

    def __init__(self, n: int, keys: np.ndarray, starts: np.ndarray, targets: np.ndarray):
        self.n, self.keys, self.starts, self.targets = n, keys, starts, targets

    def close(self, seen: np.ndarray) -> int:
        """Marks in SEEN (uint8, a node each, changed in place) every node the nodes it marks lead to; returns how
        many."""
        if _LIB is not None:
            order = np.empty(len(self.keys), dtype=np.int64)
            return int(_LIB.hw_close(self.keys.ctypes.data, self.starts.ctypes.data, len(self.keys),
                                     self.targets.ctypes.data, seen.ctypes.data, order.ctypes.data))
        frontier, marked = self.keys[seen[self.keys] != 0], 0
        while len(frontier):
            _, reached = self.rows_of(frontier)
            reached = np.unique(reached)
            frontier = reached[seen[reached] == 0]
            seen[frontier] = 1
            marked += len(frontier)
        return marked

    def rows_of(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every edge kept from NODES (ascending), as (sources, targets) in the rows' order."""
        k = np.searchsorted(self.keys, nodes)
        inside = k < len(self.keys)
        found = np.flatnonzero(inside)
        found = found[self.keys[k[found]] == nodes[found]]
        k = k[found]
        first, counts = self.starts[k], self.starts[k + 1] - self.starts[k]
        total = int(counts.sum())
        at = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(total)
        return np.repeat(nodes[found], counts), self.targets[at]

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Every edge kept, as (sources, targets)."""
        return np.repeat(self.keys, np.diff(self.starts)), self.targets

    def graph(self) -> Graph:
        """The rows as a graph of all N nodes in compressed rows (for the search that keeps paths)."""
        offsets = np.zeros(self.n + 1, dtype=np.int64)
        offsets[self.keys.astype(np.int64) + 1] = np.diff(self.starts)
        np.cumsum(offsets, out=offsets)
        return Graph.of_rows(offsets, self.targets)


class Rows:
    """The rows of COUNT blocks as they are found; DEFER: blocks already reached keep no row (see the module)."""

    def __init__(self, count: int, defer: bool):
        self.count = count
        self.defer = defer
        self._targets, self._keys, self._starts = _Column(np.int32), _Column(np.int32), _Column(np.int64)
        self._edges = 0
        self._last = ctypes.c_int64(-1)
        self._scratch: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def window(self, locate: Locator, base: int, words: np.ndarray, seen: np.ndarray,
               followed: np.ndarray | None = None, firsts: tuple[int, int, int] | None = None) -> None:
        """Judges the words WORDS read from BASE (a window of a heap, after every window below it): see the
        module.  SEEN (uint8, a block each) marks the blocks reached so far; in C, the words of the blocks FOLLOWED
        (int32, ascending: reached, their words followed already) are passed by (numpy's form keeps every row), and
        the first words of the blocks the window holds go to FIRSTS when given (`Locator.window_rows`)."""
        n = len(words)
        if not locate.native or not n:
            self._append(*locate.window_edges(base, words))
            return
        if self._scratch is None:
            self._scratch = (np.empty(BATCH, dtype=np.uint64), np.empty(BATCH, dtype=np.int32),
                             np.empty(BATCH, dtype=np.int32))
        targets, keys, starts = self._targets.room(n), self._keys.room(n), self._starts.room(n)
        nkeys = ctypes.c_int64(0)
        count = locate.window_rows(base, words, self._scratch, seen, self.defer, self._edges, targets, keys, starts,
                                   ctypes.addressof(nkeys), ctypes.addressof(self._last), followed, firsts)
        self._took(count, nkeys.value)

    def _append(self, source: np.ndarray, target: np.ndarray) -> None:
        """Keeps the edges SOURCE -> TARGET (in order, sources ascending from the last kept), every one."""
        if not len(source):
            return
        new = np.flatnonzero(np.diff(source, prepend=np.int32(self._last.value)) != 0)
        self._targets.room(len(target))[:len(target)] = target
        self._keys.room(len(new))[:len(new)] = source[new]
        self._starts.room(len(new))[:len(new)] = new + self._edges
        self._last.value = int(source[-1])
        self._took(len(target), len(new))

    def _took(self, edges: int, keys: int) -> None:
        self._targets.took(edges)
        self._keys.took(keys)
        self._starts.took(keys)
        self._edges += edges

    def rows(self) -> SparseRows:
        """The rows found (the slabs given back as they are joined)."""
        self._scratch = None
        targets = self._targets.joined()
        keys = self._keys.joined()
        starts = self._starts.joined(1)
        starts[-1] = self._edges
        return SparseRows(self.count, keys, starts, targets)
