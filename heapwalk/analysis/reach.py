"""Which allocations the program can still reach: a conservative scan, as chap makes on cores.

Every aligned 8-byte word of a root (`heapwalk.inferior.roots`: stacks, registers, TLS, writable data,
anonymous mappings, allocations with their own mapping) that points into an allocation (its first byte or
anywhere before its end) marks that allocation reached, and so does every such word of a reached
allocation.  Memory is read once, a window at a time: the roots, then the allocator's heaps, where each
word that points into a block from inside another block becomes an edge of a graph (`graph.Graph`); the
closure over that graph from the blocks the roots reach gives every reached block.  The words of free
memory and of the allocator's bookkeeping are never roots.

Each lookup is vectorised: a window's words are looked up among the blocks at once (`locate`: in C through a
table of slots, else numpy's searchsorted).  The heaps whose words the decode kept as it read them
(`heapwords`) are not read again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from heapwalk.analysis.graph import Graph
from heapwalk.analysis.heapwords import HeapWords, PagesSeen
from heapwalk.analysis.lookup import FirstHits, Locator
from heapwalk.inferior.memory import Memory, merged, ranges_without
from heapwalk.inferior.roots import RegisterRoot, Root
from heapwalk.inferior.window import read_window
from heapwalk.common.view import Blocks

__all__ = ["Reach", "scan", "WINDOW"]

#: bytes of memory looked at at once
WINDOW = 8 << 20
_PAGE = 4096
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Reach:
    """What the scan found: each block reached or not, how (PARENT: the block that led to it, -1 a root,
    -2 never reached; for blocks a root reached, the word and the root), each block's first word, the graph
    of blocks, the roots and what could not be read."""

    blocks: Blocks
    reached: np.ndarray          # bool per block
    parent: np.ndarray           # int32 per block
    hit_root: np.ndarray         # int32 per block: the first root that points into it (an index of roots, then of
    #                              registers), -1 for none
    hit_word: np.ndarray         # uint64 per block: the address of that root's word (a register: its value)
    first_words: np.ndarray      # uint64 per block (0 where unread)
    graph: Graph
    roots: tuple[Root, ...]
    registers: tuple[RegisterRoot, ...]
    root_bytes: int              # bytes of root memory read
    unread: tuple[tuple[int, int], ...]   # memory the scan wanted and could not read

    @property
    def root_blocks(self) -> np.ndarray:
        """The blocks a root points into (int32, ascending)."""
        return np.flatnonzero(self.hit_root >= 0).astype(np.int32)

    @property
    def root_words(self) -> np.ndarray:
        """For each of `root_blocks`, the address of the first root word that points into it."""
        return self.hit_word[self.root_blocks]

    @property
    def root_index(self) -> np.ndarray:
        """For each of `root_blocks`, that word's root."""
        return self.hit_root[self.root_blocks]

    def root_of(self, block: int) -> tuple[Root | RegisterRoot, int] | None:
        """The root that points into BLOCK and the address of its word (a register's value), or None."""
        k = int(self.hit_root[block])
        if k < 0:
            return None
        root = self.roots[k] if k < len(self.roots) else self.registers[k - len(self.roots)]
        return root, int(self.hit_word[block])

    def path(self, block: int) -> list[int]:
        """The blocks from one a root points into down to BLOCK (BLOCK last); [] when it was not reached."""
        if not self.reached[block]:
            return []
        out = [block]
        while self.parent[out[-1]] >= 0 and len(out) <= self.blocks.count:
            out.append(int(self.parent[out[-1]]))
        return out[::-1]


class _Scanner:
    """The scan's running state: the blocks' bounds, the edges and root hits found so far."""

    def __init__(self, mem: Memory, blocks: Blocks, progress: Callable[[int, int], None] | None, total: int,
                 pages: PagesSeen | None = None):
        self.mem, self.blocks, self.pages = mem, blocks, pages
        self.starts, self.ends = blocks.starts, blocks.ends
        self.locate = Locator(blocks.starts, blocks.ends)
        self.lo = int(self.starts[0]) if blocks.count else 1
        self.hi = int(self.ends[-1]) if blocks.count else 0
        self.first = np.zeros(blocks.count, dtype=np.uint64)
        self.sources: list[np.ndarray] = []
        self.targets: list[np.ndarray] = []
        self.hits = FirstHits(blocks.count)
        self.unread: list[tuple[int, int]] = []
        self.progress, self.total, self.done = progress, total, 0

    def windows(self, lo: int, hi: int):
        """(base, words) of [LO, HI) a window at a time; what cannot be read is noted and passed by."""
        base = lo & ~7
        while base < hi:
            data = read_window(self.mem, base, hi, WINDOW)
            n = min(len(data) // 8, (hi - base + 7) // 8)     # a window reads 16 bytes at the least
            if n == 0:
                skip = min(hi, (base | (_PAGE - 1)) + 1)
                self.unread.append((base, skip))
                base = skip
                continue
            words = np.frombuffer(data, dtype="<u8", count=n)
            if self.pages is not None:
                self.pages.note(base, words)
            yield base, words
            base += n * 8
            self.done += n * 8
            if self.progress is not None:
                self.progress(self.done, self.total)

    def root(self, index: int, root: Root) -> None:
        for base, words in self.windows(root.start, root.end):
            self.locate.root_hits(base, words, index, self.hits)

    def registers(self, first: int, registers: Sequence[RegisterRoot]) -> None:
        values = np.array([r.value for r in registers], dtype=np.uint64)
        where, block = self.locate.pointing(values)
        for w, b in zip(where.tolist(), block.tolist()):
            self.hits.add(np.array([b]), np.array([registers[w].value], dtype=np.uint64), first + w)

    def heap(self, lo: int, hi: int) -> None:
        for base, words in self.windows(lo, hi):
            self._first_words(base, words)
            source, target = self.locate.window_edges(base, words)
            self.sources.append(source)
            self.targets.append(target)

    def kept(self, words: HeapWords) -> None:
        """The heap words WORDS kept for the memory it covers, judged as `heap` judges the words it reads."""
        for at, values in words.pairs():     # in address order
            source, target = self.locate.edges(at, values)
            self.sources.append(source)
            self.targets.append(target)
        for at, first in words.firsts():     # in address order
            block = self.locate.ascending(at)
            ok = np.flatnonzero(block >= 0)
            ok = ok[self.starts[block[ok]] == at[ok]]
            self.first[block[ok]] = first[ok]
        self.done += sum(hi - lo for lo, hi in words.covered)

    def _first_words(self, base: int, words: np.ndarray) -> None:
        i0 = int(np.searchsorted(self.starts, np.uint64(base)))
        i1 = int(np.searchsorted(self.starts, np.uint64(base + 8 * len(words) - 7)))
        if i1 > i0:
            self.first[i0:i1] = words[((self.starts[i0:i1] - np.uint64(base)) >> np.uint64(3)).astype(np.int64)]


def scan(mem: Memory, blocks: Blocks, roots: Sequence[Root], registers: Sequence[RegisterRoot] = (),
         progress: Callable[[int, int], None] | None = None, words: HeapWords | None = None,
         pages: PagesSeen | None = None) -> Reach:
    """Scans ROOTS, REGISTERS and BLOCKS' heaps in MEM once, and follows the graph (see the module); the heaps
    WORDS covers (the words the decode kept as it read them) are taken from there, when its values were kept
    for every heap, and given back (`HeapWords.release`: what follows reuses their memory).  PAGES, when given,
    hears which pages of what the scan read hold anything."""
    heaps = merged(blocks.heaps)
    root_bytes = sum(r.end - r.start for r in roots)
    s = _Scanner(mem, blocks, progress, root_bytes + sum(hi - lo for lo, hi in heaps), pages)
    if words is not None and words.covered and words.holds(heaps):
        s.kept(words)                    # first, so that the roots' windows reuse what they give back
        heaps = ranges_without(heaps, words.covered)
        words.release()
    for i, root in enumerate(roots):
        s.root(i, root)
    s.registers(len(roots), registers)
    for lo, hi in heaps:
        s.heap(lo, hi)
    graph = Graph(blocks.count, _joined(s.sources), _joined(s.targets))
    seen = np.zeros(blocks.count, dtype=np.uint8)
    parent = np.full(blocks.count, -2, dtype=np.int32)
    graph.reach_marked(s.hits.root, seen, parent)
    return Reach(blocks, seen.view(bool), parent, s.hits.root, s.hits.word, s.first, graph,
                 tuple(roots), tuple(registers), root_bytes, tuple(merged(s.unread)))


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """PARTS (block indices) as one int32 array, copied once."""
    return np.concatenate(parts).astype(np.int32, copy=False) if parts else _EMPTY.astype(np.int32)
