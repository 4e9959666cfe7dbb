"""Leaked allocations, from a reachability scan (`reach.scan`): the blocks no root leads to, which of them
nothing else leaked points to (the unreferenced: where a leaked structure starts) and what each of those
holds, per arena and in total; and what any set of blocks is, by size and by signature (the first word,
when it points into a loaded file's read-only data: a C++ vtable, a type object; or text).

A conservative scan can only miss a leak (a stale word keeps a block reached), never invent one, unless a
pointer is hidden from it: XOR'd, compressed, tagged, or held only in a file or another process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from heapwalk.analysis.graph import Graph
from heapwalk.analysis.reach import Reach, scan
from heapwalk.analysis.signed import TEXT_CODE, Signed
from heapwalk.analysis.tally import tally
from heapwalk.inferior.memory import Memory, drop_cached
from heapwalk.inferior.ownmemory import give_back
from heapwalk.inferior.roots import image_data, readonly_images, register_roots, root_regions
from heapwalk.inferior.space import MemoryMap
from heapwalk.inferior.threads import ThreadRegs
from heapwalk.common.view import Blocks

__all__ = ["Leaks", "ArenaLeaks", "Group", "find_leaks", "arena_rows", "leaks_of",
           "signature_name", "TEXT", "by_size", "by_signature", "HIDDEN_POINTERS"]

#: the one line that says what a conservative scan cannot see
HIDDEN_POINTERS = ("A conservative scan can only miss a leak (a stale word keeps a chunk reached), never invent one, "
                   "unless the program hides its pointers (XOR'd, compressed, tagged, or kept only in a file or "
                   "in another process).")


@dataclass(frozen=True)
class ArenaLeaks:
    """One arena's blocks in use and leaked: counts and bytes."""

    number: int
    in_use_count: int
    in_use_bytes: int
    leaked_count: int
    leaked_bytes: int
    unreferenced_count: int


@dataclass(frozen=True)
class Leaks:
    """The leaked blocks (indices, in address order), the unreferenced among them (largest first) with the
    count and bytes each holds (itself included; a block two of them reach counts for the larger), and how
    many leaked blocks only rings of leaked blocks hold."""

    reach: Reach
    leaked: np.ndarray
    unreferenced: np.ndarray
    holds_count: np.ndarray
    holds_bytes: np.ndarray
    in_rings: int
    in_rings_bytes: int
    arenas: tuple[ArenaLeaks, ...]

    @property
    def in_use_count(self) -> int:
        return self.reach.blocks.count

    @property
    def in_use_bytes(self) -> int:
        return sum(a.in_use_bytes for a in self.arenas)

    @property
    def leaked_count(self) -> int:
        return len(self.leaked)

    @property
    def leaked_bytes(self) -> int:
        return sum(a.leaked_bytes for a in self.arenas)

    @property
    def unreferenced_count(self) -> int:
        return len(self.unreferenced)

    def leaked_chunks(self) -> np.ndarray:
        """The leaked blocks' chunk addresses (their headers'), sorted (uint64)."""
        blocks = self.reach.blocks
        return np.sort(blocks.starts[self.leaked] - np.uint64(blocks.header))


def find_leaks(reach: Reach) -> Leaks:
    """The leaked and unreferenced blocks of REACH, and what each unreferenced block holds.  The leaked blocks'
    rows are taken as a graph of their own (a leaked block each, by its place among them), so that what this
    keeps grows with the leaked blocks, not with every block."""
    blocks = reach.blocks
    sizes = blocks.sizes()
    leaked_mask = ~reach.reached
    leaked = np.flatnonzero(leaked_mask)
    sources, targets = reach.graph.rows_of(leaked)
    inner = leaked_mask[targets]
    sources = np.searchsorted(leaked, sources[inner]).astype(np.int32)
    targets = np.searchsorted(leaked, targets[inner]).astype(np.int32)
    inside = Graph(len(leaked), sources, targets)
    pointed = np.zeros(len(leaked), dtype=bool)
    pointed[targets] = True
    unreferenced = np.flatnonzero(~pointed)
    unreferenced = unreferenced[np.lexsort((unreferenced, -sizes[leaked[unreferenced]]))]
    has_leaked_child = np.zeros(len(leaked), dtype=bool)
    has_leaked_child[sources] = True
    holds_count, holds_bytes = _holds(inside, unreferenced, has_leaked_child, sizes[leaked])
    held = int(holds_count.sum())
    unreferenced = leaked[unreferenced]
    return Leaks(reach, leaked, unreferenced, holds_count, holds_bytes, len(leaked) - held,
                 int(sizes[leaked].sum()) - int(holds_bytes.sum()), _per_arena(reach, leaked_mask, unreferenced, sizes))


def _holds(inside: Graph, unreferenced: np.ndarray, has_leaked_child: np.ndarray,
           sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Count and bytes of the leaked blocks each unreferenced block leads to (itself included), taken in
    order so that a block two of them lead to counts once, for the first (INSIDE: the leaked blocks' graph,
    SIZES theirs)."""
    counts = np.ones(len(unreferenced), dtype=np.int64)
    total = sizes[unreferenced].astype(np.int64)
    seen = np.zeros(inside.n, dtype=np.uint8)
    parent = np.full(inside.n, -1, dtype=np.int32)
    for i in np.flatnonzero(has_leaked_child[unreferenced]).tolist():
        visited = inside.reach(unreferenced[i:i + 1], seen, parent)
        counts[i], total[i] = len(visited), int(sizes[visited].sum())
    return counts, total


def _per_arena(reach: Reach, leaked_mask: np.ndarray, unreferenced: np.ndarray,
               sizes: np.ndarray) -> tuple[ArenaLeaks, ...]:
    """Each arena's blocks in use and leaked, counted and summed at once."""
    numbers, arena = arena_rows(reach.blocks)
    n = len(numbers)
    counts, total, gone, gone_bytes = tally(sizes, arena, n, leaked_mask)
    unref = np.bincount(arena[unreferenced], minlength=n)
    return tuple(ArenaLeaks(int(numbers[i]), int(counts[i]), int(total[i]), int(gone[i]), int(gone_bytes[i]),
                            int(unref[i])) for i in range(n))


def arena_rows(blocks: Blocks) -> tuple[np.ndarray, np.ndarray]:
    """The arena numbers BLOCKS hold (ascending) and each block's index among them, as np.unique(return_inverse=True)
    would give them (the blocks keep them so: `view.Blocks.arena_index`)."""
    return blocks.arena_numbers, blocks.arena_index


@dataclass(frozen=True)
class Group:
    """Blocks alike (one size, or one signature): a KEY, how many, their bytes, and the first one (a row)."""

    key: object
    count: int
    bytes: int
    example: int


def by_size(sizes: np.ndarray, rows: np.ndarray) -> list[Group]:
    """The blocks at ROWS grouped by size (SIZES of every block), most bytes first."""
    if not len(rows):
        return []
    values, first, counts = np.unique(sizes[rows], return_index=True, return_counts=True)
    out = [Group(int(v), int(c), int(v) * int(c), int(rows[f])) for v, f, c in zip(values, first, counts)]
    return sorted(out, key=lambda g: (-g.bytes, g.key))


#: the key of the group of blocks that begin with text
TEXT = "text"


def by_signature(signed: Signed, sizes: np.ndarray, rows: np.ndarray) -> list[Group]:
    """The blocks at ROWS that have a signature (SIGNED's), grouped by it, most bytes first; the text group's key
    is TEXT, the others' the address their first word holds."""
    codes = signed.codes
    rows = rows[codes[rows] != 0]
    if not len(rows):
        return []
    kinds, first, inverse = np.unique(codes[rows], return_index=True, return_inverse=True)
    values = signed.values[kinds]
    counts = np.bincount(inverse, minlength=len(values))
    total = np.bincount(inverse, weights=sizes[rows].astype(np.float64), minlength=len(values))
    out = [Group(TEXT if int(v) == TEXT_CODE else int(v), int(c), int(b), int(rows[f]))
           for v, f, c, b in zip(values, first, counts, total)]
    return sorted(out, key=lambda g: (-g.bytes, str(g.key)))


def signature_name(key: object, images: Sequence[tuple[int, int, str]],
                   symbol: Callable[[int], str | None] | None = None) -> str:
    """How a signature reads: the symbol at its address when there is one, else file+offset; "text"."""
    if key == TEXT:
        return "text"
    address = int(key)
    name = symbol(address) if symbol is not None else None
    if name:
        return name
    for lo, hi, file in images:
        if lo <= address < hi:
            return f"{file}+{address - lo:#x}"
    return f"{address:#x}"


def leaks_of(mem: Memory, blocks: Blocks, space: MemoryMap, threads: Sequence[ThreadRegs],
             progress: Callable[[int, int], None] | None = None, pages=None, paths: bool = False) -> Leaks:
    """The leaks of a target: its roots (`target.roots`) around BLOCKS, scanned in MEM, then judged; PAGES
    (`pages.PagesSeen`), when given, hears which pages the scan read hold anything; PATHS keeps how each block
    is reached (`reach.scan`).  The decode's cached blocks and free pages are given back first, and the scan's
    before the leaks are judged (`ownmemory.give_back`)."""
    drop_cached(mem)
    give_back()
    roots = root_regions(space, threads, list(blocks.heaps) + list(blocks.private), blocks.large, blocks.unknown,
                         images=image_data(mem, space))
    reach = scan(mem, blocks, roots, register_roots(threads), progress, pages, paths, readonly_images(space),
                 space.readable if space.readable is not None else space.regions)
    give_back()
    return find_leaks(reach)
