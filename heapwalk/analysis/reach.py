"""Which allocations the program can still reach: a conservative scan, as chap makes on cores.

Every aligned 8-byte word of a root (`heapwalk.inferior.roots`: stacks, registers, TLS, writable data,
anonymous mappings, allocations with their own mapping) that points into an allocation (its first byte or
anywhere before its end) marks that allocation reached, and so does every such word of a reached
allocation.  Memory is read once, a window at a time: the roots, then the allocator's heaps in address order,
where each word that points into a block from inside another block is an edge of a graph (`graph.Graph`); the
closure over that graph from the blocks the roots reach gives every reached block.  A block already reached
when its words are read passes the mark on at once and keeps no edges (`rows`), so the graph holds the edges
of the blocks not reached then: the leaked blocks' always.  Big blocks the roots reach (containers) are read first
(`_Scanner.containers`), so that the blocks they hold are reached before their windows come.  The words of free memory and of the allocator's
bookkeeping are never roots.

Each lookup is vectorised: a window's words are looked up among the blocks at once (`lookup`: in C through a
table of slots, else numpy's searchsorted).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from heapwalk.common.beside import Beside
from heapwalk.inferior.ownmemory import give_back

from heapwalk.analysis.pages import PagesSeen
from heapwalk.analysis.lookup import FirstHits, Locator
from heapwalk.analysis.graph import Graph
from heapwalk.analysis.rows import Rows, SparseRows
from heapwalk.analysis.signed import Signed
from heapwalk.inferior.memory import Memory
from heapwalk.inferior.ranges import merged
from heapwalk.inferior.roots import RegisterRoot, Root, intersect
from heapwalk.inferior.window import read_window, window_ahead
from heapwalk.common.view import LENGTH_UNIT, Blocks

__all__ = ["Reach", "scan", "WINDOW", "BIG"]

#: bytes of memory looked at at once
WINDOW = 2 << 20
_PAGE = 4096
#: a block at least this big is a container (an array of pointers, a hash table's buckets): read first when reached
BIG = 64 << 10
#: of the heaps' bytes, at most this share is read first (`_Scanner.containers`)
BIG_SHARE = 4


@dataclass(frozen=True)
class Reach:
    """What the scan found: each block reached or not, how (PARENT: the block that led to it, -1 a root,
    -2 never reached; for blocks a root reached, the word and the root), each block's signature, the graph
    of blocks, the roots and what could not be read."""

    blocks: Blocks
    reached: np.ndarray          # bool per block
    parent: np.ndarray | None    # int32 per block; None: not kept (the scan was not asked for paths)
    hit_root: np.ndarray | None  # int32 per block: the first root that points into it (an index of roots, then of
    #                              registers), -1 for none; None: not kept (the scan was not asked for paths)
    hit_word: np.ndarray | None  # uint64 per block: the address of that root's word (a register: its value); None:
    #                              not kept (the scan was not asked for paths)
    signed: Signed               # each block's signature, from its first word (none where unread)
    graph: Graph | SparseRows    # every row, in compressed rows (a scan asked for paths); else the rows kept
    roots: tuple[Root, ...]
    registers: tuple[RegisterRoot, ...]
    root_bytes: int              # bytes of root memory read
    unread: tuple[tuple[int, int], ...]   # memory the scan wanted and could not read

    @property
    def root_blocks(self) -> np.ndarray:
        """The blocks a root points into (int32, ascending)."""
        return np.flatnonzero(self._roots() >= 0).astype(np.int32)

    @property
    def root_words(self) -> np.ndarray:
        """For each of `root_blocks`, the address of the first root word that points into it."""
        return self._words()[self.root_blocks]

    @property
    def root_index(self) -> np.ndarray:
        """For each of `root_blocks`, that word's root."""
        return self._roots()[self.root_blocks]

    def root_of(self, block: int) -> tuple[Root | RegisterRoot, int] | None:
        """The root that points into BLOCK and the address of its word (a register's value), or None."""
        k = int(self._roots()[block])
        if k < 0:
            return None
        root = self.roots[k] if k < len(self.roots) else self.registers[k - len(self.roots)]
        return root, int(self._words()[block])

    def _words(self) -> np.ndarray:
        """HIT_WORD, which only a scan asked for paths keeps."""
        if self.hit_word is None:
            raise ValueError("the scan kept no paths: scan(..., paths=True)")
        return self.hit_word

    def _roots(self) -> np.ndarray:
        """HIT_ROOT, which only a scan asked for paths keeps."""
        if self.hit_root is None:
            raise ValueError("the scan kept no paths: scan(..., paths=True)")
        return self.hit_root

    def path(self, block: int) -> list[int]:
        """The blocks from one a root points into down to BLOCK (BLOCK last); [] when it was not reached."""
        if not self.reached[block]:
            return []
        if self.parent is None:
            raise ValueError("the scan kept no paths: scan(..., paths=True)")
        out = [block]
        while self.parent[out[-1]] >= 0 and len(out) <= self.blocks.count:
            out.append(int(self.parent[out[-1]]))
        return out[::-1]


class _Scanner:
    """The scan's running state: the blocks' bounds, the edges and root hits found so far."""

    def __init__(self, mem: Memory, blocks: Blocks, progress: Callable[[int, int], None] | None, total: int,
                 pages: PagesSeen | None = None, paths: bool = False, images: Sequence[tuple[int, int, str]] = ()):
        self.mem, self.blocks, self.pages = mem, blocks, pages
        self.starts = blocks.starts
        self.locate = Locator(blocks.starts, blocks.whole_ends, blocks.lengths)
        self.lo = int(self.starts[0]) if blocks.count else 1
        self.hi = int(blocks.end_of(blocks.count - 1)) if blocks.count else 0
        self.signed = Signed(blocks.count, images)
        self.rows = Rows(blocks.count, defer=not paths)
        self.seen = np.zeros(blocks.count, dtype=np.uint8)
        self.hits = FirstHits(blocks.count, None if paths else self.seen)
        self.unread: list[tuple[int, int]] = []
        self.followed: np.ndarray | None = None    # the containers read whole (`containers`)
        self.firsts = _FirstWords(self.signed)
        self.progress, self.total, self.done = progress, total, 0

    def windows(self, lo: int, hi: int, note: bool = True):
        """(base, words) of [LO, HI) a window at a time; what cannot be read is noted and passed by.  NOTE: the
        pages hear of each window here (else the caller tells them)."""
        base = lo & ~7
        while base < hi:
            data = read_window(self.mem, base, hi, WINDOW)
            n = min(len(data) // 8, (hi - base + 7) // 8)     # a window reads 16 bytes at the least
            if n == 0:
                skip = min(hi, (base | (_PAGE - 1)) + 1)
                self.unread.append((base, skip))
                base = skip
                continue
            window_ahead(self.mem, base + n * 8, hi, WINDOW)      # read while this one is judged
            words = np.frombuffer(data, dtype="<u8", count=n)
            if note and self.pages is not None:
                self.pages.note(base, words)
            yield base, words
            del data, words                  # this window gone before the next is read ahead: two at a time
            base += n * 8
            self.done += n * 8
            if self.progress is not None:
                self.progress(self.done, self.total)

    def root(self, index: int, root: Root) -> None:
        for base, words in self.windows(root.start, root.end):
            self.locate.root_hits(base, words, index, self.hits)
            del words

    def registers(self, first: int, registers: Sequence[RegisterRoot]) -> None:
        values = np.array([r.value for r in registers], dtype=np.uint64)
        where, block = self.locate.pointing(values)
        for w, b in zip(where.tolist(), block.tolist()):
            self.hits.add(np.array([b]), np.array([registers[w].value], dtype=np.uint64), first + w)

    def heap(self, lo: int, hi: int, beside: Beside) -> None:
        """Reads the heap [LO, HI) (after the roots, and after every heap below it): each window's pages (and in
        numpy its signatures) judged on the thread BESIDE while its words are judged here, and done before the next
        is read; in C the rows' pass gives the blocks' first words for their signatures (`firsts`)."""
        firsts = self.firsts if self.locate.native else None
        for base, words in self.windows(lo, hi, note=False):
            if firsts is None or self.pages is not None:
                beside.start(self._beside, base, words, firsts is None)
            self.rows.window(self.locate, base, words, self.seen, self.followed,
                             None if firsts is None else firsts.room(len(words)))
            if firsts is not None:
                firsts.took()
            beside.done()
            del words

    def _beside(self, base: int, words: np.ndarray, signatures: bool) -> None:
        """What of a window of the heaps needs nothing the rows find: its pages, and its blocks' signatures
        where SIGNATURES."""
        if signatures:
            self._signatures(base, words)
        if self.pages is not None:
            self.pages.note(base, words)

    def containers(self, budget: int) -> None:
        """Reads first each big block (`BIG`) reached so far, then those they reach in turn, up to BUDGET bytes,
        passing their marks on: a program's containers (an array of pointers, a hash table) hold most of its
        pointers to its small blocks, so those are reached when the heaps' windows come to them and keep no rows,
        wherever the containers lie.  The heaps' windows read them again for their signatures and pages, not for
        their words (`followed`: each container read whole); what is reached is the same either way, only the rows
        kept are fewer."""
        if not self.rows.defer or not self.blocks.count:
            return
        b = self.blocks
        big = np.flatnonzero(b.lengths >= BIG // LENGTH_UNIT) if b.lengths is not None else \
            np.flatnonzero(b.whole_ends - b.starts >= np.uint64(BIG))
        done = np.zeros(len(big), dtype=bool)
        scratch, followed = Rows(b.count, defer=True), []
        while budget > 0:
            todo = np.flatnonzero(~done & (self.seen[big] != 0))
            if not len(todo):
                break
            done[todo] = True
            for block in big[todo].tolist():
                lo, hi = int(self.starts[block]), int(b.end_of(block))
                if hi - lo > budget:
                    continue
                budget -= hi - lo
                if self._follow(scratch, lo, hi) and not lo % 8:
                    followed.append(block)
        self.followed = np.array(sorted(followed), dtype=np.int32)

    def _follow(self, scratch: Rows, lo: int, hi: int) -> bool:
        """Marks the blocks the words of [LO, HI) point into (a container reached: SCRATCH keeps no rows); whether
        every word was read."""
        while lo < hi:
            data = read_window(self.mem, lo, hi, WINDOW)
            n = min(len(data) // 8, (hi - lo) // 8)
            if n == 0:
                return False
            window_ahead(self.mem, lo + n * 8, hi, WINDOW)
            words = np.frombuffer(data, dtype="<u8", count=n)
            if self.locate.native:
                scratch.window(self.locate, lo, words, self.seen)
            else:
                self.seen[self.locate.window_edges(lo, words)[1]] = 1
            lo += n * 8
        return True

    def _signatures(self, base: int, words: np.ndarray) -> None:
        """The signatures of the blocks that start in the window WORDS read from BASE, from their first words."""
        i0 = int(np.searchsorted(self.starts, np.uint64(base)))
        i1 = int(np.searchsorted(self.starts, np.uint64(base + 8 * len(words) - 7)))
        if i1 > i0:
            self.signed.add(i0, words[((self.starts[i0:i1] - np.uint64(base)) >> np.uint64(3)).astype(np.int64)])


class _FirstWords:
    """The first words of the blocks the heaps' windows hold, as the rows' C pass writes them, given to SIGNED for
    their signatures BATCH blocks or more at a time (numpy's steps once for many windows, not for each)."""

    BATCH = 1 << 16

    def __init__(self, signed: Signed):
        self.signed = signed
        self.words = np.empty(0, dtype=np.uint64)
        self.first = self.count = 0
        self._block, self._written = ctypes.c_int64(0), ctypes.c_int64(0)

    def room(self, n: int) -> tuple[int, int, int]:
        """Where a window of N words writes its blocks' first words, its first block and how many, for
        `Locator.window_rows` (`took` then counts them)."""
        if len(self.words) - self.count < n:
            self.flush()
            if len(self.words) < n:
                self.words = np.empty(max(n, self.BATCH), dtype=np.uint64)
        self._written.value = 0
        return (self.words.ctypes.data + 8 * self.count, ctypes.addressof(self._block),
                ctypes.addressof(self._written))

    def took(self) -> None:
        """Counts the first words a window wrote where `room` said; those of blocks that do not follow the ones
        kept (the heaps' windows skipped some) start a batch of their own."""
        k, block = self._written.value, self._block.value
        if not k:
            return
        if self.count and block != self.first + self.count:
            new = self.words[self.count:self.count + k].copy()
            self.flush()
            self.words[:k] = new
        if not self.count:
            self.first = block
        self.count += k
        if self.count >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        """Gives SIGNED the first words kept."""
        if self.count:
            self.signed.add(self.first, self.words[:self.count])
            self.count = 0


def scan(mem: Memory, blocks: Blocks, roots: Sequence[Root], registers: Sequence[RegisterRoot] = (),
         progress: Callable[[int, int], None] | None = None, pages: PagesSeen | None = None,
         paths: bool = False, images: Sequence[tuple[int, int, str]] = (),
         inside: Sequence[tuple[int, int]] | None = None) -> Reach:
    """Scans ROOTS, REGISTERS and BLOCKS' heaps in MEM once, and follows the graph (see the module).  PAGES, when
    given, hears which pages of what the scan read hold anything.  PATHS keeps every block's edges and which block led
    to which (`Reach.path`), where the scan otherwise keeps only the edges of blocks not yet reached when it
    read them (`rows`).  IMAGES (the loaded files' read-only mappings) say which first words are signatures.
    INSIDE, when given, is the target's memory: heaps are read only there (damaged bounds reach anywhere)."""
    heaps = merged(blocks.heaps) if inside is None else intersect(blocks.heaps, inside)
    root_bytes = sum(r.end - r.start for r in roots)
    s = _Scanner(mem, blocks, progress, root_bytes + sum(hi - lo for lo, hi in heaps), pages, paths, images)
    give_back()                          # the table's making's holes (`ownmemory`), before the windows' arrays
    for i, root in enumerate(roots):
        s.root(i, root)
    s.registers(len(roots), registers)
    s.locate.release()                   # the roots' room, for the heaps' windows to take
    s.containers(sum(hi - lo for lo, hi in heaps) // BIG_SHARE)
    with Beside("heapwalk-scan") as beside:
        for lo, hi in heaps:
            s.heap(lo, hi, beside)
    s.firsts.flush()
    rows = s.rows.rows()
    seen, parent, graph = s.seen, None, rows
    if s.rows.defer:
        rows.close(seen)
    else:
        graph = rows.graph()
        seen[:] = 0
        parent = np.full(blocks.count, -2, dtype=np.int32)
        graph.reach_marked(s.hits.root, seen, parent)
    return Reach(blocks, seen.view(bool), parent, s.hits.root, s.hits.word, s.signed, graph,
                 tuple(roots), tuple(registers), root_bytes, tuple(merged(s.unread)))

