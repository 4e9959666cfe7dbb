"""Which blocks point to which, as a graph in compressed rows, and the search that follows it: in C when
`pip install` built heapwalk's small library (`_reach.c`, loaded with ctypes), in numpy otherwise.

A chain of a million blocks (a linked list) is a million steps that each need the one before: in C a few
nanoseconds each; numpy's search goes a level at a time, fast on wide graphs and slow on long chains, so it
is the fallback.  Both visit the same nodes (tests/unit/analysis/test_leaks.py holds them equal); HEAPWALK_PURE=1 in the
environment turns the library off.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from heapwalk.inferior.clib import built_library

__all__ = ["Graph", "NATIVE"]


def _load():
    """The built library's search, or None (see `inferior.clib`; also when it was built from older sources that
    lack a function)."""
    lib = built_library(Path(__file__).parent, "_reach", ("hw_reach", "hw_reach_marked", "hw_rows"))
    if lib is not None:
        for name in ("hw_reach", "hw_reach_marked"):
            getattr(lib, name).restype = ctypes.c_int64
            getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                           ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.hw_rows.restype = ctypes.c_int64
        lib.hw_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    return lib


_LIB = _load()
#: whether the C search is in use
NATIVE = _LIB is not None


class Graph:
    """N nodes and the edges SOURCES[i] -> TARGETS[i] (int32 arrays), kept in compressed rows."""

    def __init__(self, n: int, sources: np.ndarray, targets: np.ndarray, native: bool = True):
        self.n = n
        self.sources = np.ascontiguousarray(sources, dtype=np.int32)
        self.edge_targets = np.ascontiguousarray(targets, dtype=np.int32)
        self.offsets = np.zeros(n + 1, dtype=np.int64)
        if native and _LIB is not None:
            ordered = bool(_LIB.hw_rows(self.sources.ctypes.data, len(self.sources), n, self.offsets.ctypes.data))
        else:
            ordered = len(sources) < 2 or bool(np.all(sources[1:] >= sources[:-1]))
            np.cumsum(np.bincount(sources, minlength=n), out=self.offsets[1:])
        if ordered:                                         # the scan finds them in order
            self.targets = self.edge_targets
        else:
            self.targets = np.ascontiguousarray(targets[np.argsort(sources, kind="stable")], dtype=np.int32)

    @classmethod
    def of_rows(cls, offsets: np.ndarray, targets: np.ndarray) -> "Graph":
        """The graph whose node v leads to TARGETS[OFFSETS[v]:OFFSETS[v + 1]] (OFFSETS int64, one more than the
        nodes; TARGETS int32), kept as given."""
        graph = cls.__new__(cls)
        graph.n = len(offsets) - 1
        graph.offsets, graph.targets = offsets, np.ascontiguousarray(targets, dtype=np.int32)
        return graph

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Every edge, as (sources, targets), in the rows' order."""
        return np.repeat(np.arange(self.n, dtype=np.int32), np.diff(self.offsets)), self.targets

    def rows_of(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every edge from NODES, as (sources, targets) in the rows' order: as many steps as they have edges."""
        first, counts = self.offsets[nodes], self.offsets[nodes + 1] - self.offsets[nodes]
        total = int(counts.sum())
        at = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(total)   # each edge's place
        return np.repeat(nodes, counts), self.targets[at]

    def reach(self, seeds: np.ndarray, seen: np.ndarray, parent: np.ndarray) -> np.ndarray:
        """Visits every node reachable from SEEDS, skipping and marking nodes in SEEN (uint8, changed in
        place); a node reached along an edge gets in PARENT (int32, changed in place) the node it came from.
        Returns the nodes visited, seeds first."""
        seeds = np.ascontiguousarray(seeds, dtype=np.int32)
        if _LIB is None:
            return self._reach_numpy(seeds, seen, parent)
        order = np.empty(self.n, dtype=np.int32)
        count = _LIB.hw_reach(self.offsets.ctypes.data, self.targets.ctypes.data, seeds.ctypes.data, len(seeds),
                              seen.ctypes.data, parent.ctypes.data, order.ctypes.data)
        return order[:count]

    def reach_marked(self, marks: np.ndarray, seen: np.ndarray, parent: np.ndarray) -> np.ndarray:
        """`reach` from the nodes whose MARKS (int32, one a node) are 0 or more, in order, each one's PARENT set
        to -1 first: without making the array of seeds."""
        marks = np.ascontiguousarray(marks, dtype=np.int32)
        if _LIB is None:
            seeds = np.flatnonzero(marks >= 0).astype(np.int32)
            parent[seeds] = -1
            return self._reach_numpy(seeds, seen, parent)
        order = np.empty(self.n, dtype=np.int32)
        count = _LIB.hw_reach_marked(self.offsets.ctypes.data, self.targets.ctypes.data, marks.ctypes.data, self.n,
                                     seen.ctypes.data, parent.ctypes.data, order.ctypes.data)
        return order[:count]

    def _reach_numpy(self, seeds: np.ndarray, seen: np.ndarray, parent: np.ndarray) -> np.ndarray:
        """`reach` a level at a time on whole arrays."""
        _, first = np.unique(seeds, return_index=True)
        frontier = seeds[np.sort(first)]
        frontier = frontier[seen[frontier] == 0]
        seen[frontier] = 1
        visited = [frontier]
        while len(frontier):
            begin, end = self.offsets[frontier], self.offsets[frontier + 1]
            counts = end - begin
            total = int(counts.sum())
            if not total:
                break
            shift = np.repeat(begin - np.cumsum(counts) + counts, counts)
            edges = shift + np.arange(total, dtype=np.int64)
            reached, came_from = self.targets[edges], np.repeat(frontier, counts)
            new = seen[reached] == 0
            reached, came_from = reached[new], came_from[new]
            reached, first = np.unique(reached, return_index=True)
            parent[reached] = came_from[first]
            seen[reached] = 1
            frontier = reached
            visited.append(frontier)
        return np.concatenate(visited).astype(np.int32)
