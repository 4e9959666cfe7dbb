"""mimalloc 3's arenas: each a reservation of 64 KiB slices whose description (and bitmaps) fill its first
slices (from 3.6 after the table of its first 4096 slices' mi_page_t).  Found through the subprocess the main
thread's tld names: a count, then that many pointers to arenas whose description points back to it.  Each
arena's bitmaps say, a bit per slice: free, committed, touched (dirty), waiting for its purge, and the first
slice of each page."""

from __future__ import annotations

from dataclasses import dataclass, replace

from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.mimalloc.bits import bit_runs, bits_in
from heapwalk.mimalloc.v3.layout import Mi3Layout

__all__ = ["Mi3Arena", "read_arenas"]

_NAMES = ("free", "committed", "dirty", "purge", "pages")


@dataclass(frozen=True)
class Mi3Arena:
    """One arena: its description's address (its memory's start), its slices, and its bitmaps as integers (bit
    I: slice I).  COMMITTED holds the slices mimalloc counts committed: when the arena was committed as a
    whole on a system that overcommits, those touched once (its figure counts them on first use), else those
    its committed bitmap holds; its description's own slices are not counted."""

    address: int
    id: int
    blocks: int                 # slices
    info: int                   # slices of its description and bitmaps
    free: int
    committed: int
    purge: int
    pages: int
    commit_map: int = 0         # its committed bitmap as it is (a purge decommits, and counts off, those it holds)
    page_infos: int = 0         # from 3.3: where its pages' mi_page_t are, one per slice (0: at each page's start)
    block_size: int = 65536
    meta: int = 0               # never: its description is in its own slices
    base: int = 0               # 3.6: where its memory starts (0: at its description)
    purge_group: int = 1        # a purge takes only whole aligned groups of this many slices all waiting (from 3.3:
    #                             its minimal purge size; 32 in 3.6 by default where the system has huge pages)

    @property
    def start(self) -> int:
        return self.base or self.address

    @property
    def reserved(self) -> int:
        return self.blocks * self.block_size

    def committed_blocks(self) -> int:
        return bin(self.committed & ((1 << self.blocks) - 1)).count("1")

    def block_of(self, address: int) -> int:
        return (address - self.start) // self.block_size

    def page_info(self, index: int, size: int) -> int:
        """Where the mi_page_t of the page at slice INDEX is (SIZE: a mi_page_t's bytes)."""
        return self.page_infos + index * size if self.page_infos else self.start + index * self.block_size

    def free_bytes(self) -> int:
        return bits_in(self.free, 0, self.blocks) * self.block_size

    def purge_ranges(self) -> list[tuple[int, int]]:
        """The committed free slices whose purge waits, as address ranges."""
        return self._ranges(self.purge & self.commit_map & self.free)

    def purged_ranges(self) -> list[tuple[int, int]]:
        """What a purge takes of them now (and decommits, and takes off the committed figure): those in whole
        groups of PURGE_GROUP slices, aligned within each 64-bit word of the bitmap, whose every slice waits."""
        group = min(self.purge_group, 64)
        if group <= 1:
            return self.purge_ranges()
        whole, mask = 0, (1 << group) - 1
        for word in range(0, self.blocks, 64):
            for shift in range(word, word + 64 - group + 1, group):
                if self.purge >> shift & mask == mask:
                    whole |= mask << shift
        return self._ranges(whole & self.commit_map & self.free)

    def _ranges(self, bits: int) -> list[tuple[int, int]]:
        return [(self.start + a * self.block_size, self.start + b * self.block_size) for a, b in bit_runs(bits)]


def read_arenas(mem: Memory, lay: Mi3Layout, subproc: int, overcommit: bool | None) -> tuple[Mi3Arena, ...] | None:
    """The arenas of the subprocess at SUBPROC (None when it does not read as one: a count, then that many
    arenas that point back to it).  OVERCOMMIT: whether the system overcommits (None: unknown, taken as Linux's
    default, yes)."""
    try:
        count = u64(mem, subproc + lay.sub_arena_count)
        if count > lay.max_arenas:
            return None
        pointers = [u64(mem, subproc + lay.sub_arenas + 8 * i) for i in range(count)]
    except ReadError:
        return None
    out = []
    for i, at in enumerate(pointers):
        arena = _arena(mem, lay, at, i + 1, subproc, overcommit is not False)
        if arena is None:
            return None
        out.append(arena)
    if not lay.arena_pages:
        try:
            out = [replace(a, pages=_heaps_pages(mem, lay, subproc, a)) for a in out]
        except ReadError:
            return None
    return tuple(out)


def _heaps_pages(mem: Memory, lay: Mi3Layout, subproc: int, arena: Mi3Arena) -> int:
    """From 3.2: the pages of ARENA, every heap's (each heap of the subprocess keeps a bitmap of its pages in
    each arena), as one bitmap."""
    bits, seen = 0, set()
    index = u64(mem, arena.address + lay.arena_index)
    heap = u64(mem, subproc + lay.sub_heaps)
    while heap and heap not in seen and len(seen) < 1 << 12:
        seen.add(heap)
        pages = u64(mem, heap + lay.heap_arena_pages + 8 * index) if index < lay.max_arenas else 0
        if pages:
            bits |= _bitmap(mem, lay, u64(mem, pages), arena.blocks, False) or 0
        heap = u64(mem, heap + lay.heap_list_next)
    return bits


def _arena(mem: Memory, lay: Mi3Layout, at: int, id_: int, subproc: int, overcommit: bool) -> Mi3Arena | None:
    """The arena described at AT, or None when it does not read as one of SUBPROC's."""
    try:
        names = _NAMES if lay.arena_pages else _NAMES[:-1]
        head = mem.read(at, max(lay.arena_bitmaps + 8 * len(names), (lay.arena_page_infos or 0) + 8))
        word = lambda off: int.from_bytes(head[off:off + 8], "little")     # noqa: E731
        slices, info = word(lay.arena_slice_count), word(lay.arena_info_slices)
        base = word(lay.arena_start) if lay.arena_start is not None else at
        if word(lay.arena_subproc) != subproc or not 0 < info < slices <= 1 << 24 or at & 0xFFFF or base & 0xFFFF \
                or not base <= at < base + (info << lay.slice_shift):
            return None
        maps = {name: _bitmap(mem, lay, word(lay.arena_bitmaps + 8 * k), slices, name == "free")
                for k, name in enumerate(names)}
    except ReadError:
        return None
    if any(m is None for m in maps.values()):
        return None
    maps.setdefault("pages", 0)
    own = (1 << info) - 1
    eager = head[lay.arena_initially_committed] == 1 and head[lay.arena_memkind] in lay.mem_os and overcommit
    committed = (maps["dirty"] if eager else maps["committed"]) & ~own
    infos = word(lay.arena_page_infos) if lay.arena_page_infos is not None else 0
    return Mi3Arena(at, id_, slices, info, maps["free"], committed, maps["purge"], maps["pages"], maps["committed"],
                    infos, base=base if base != at else 0)


def _bitmap(mem: Memory, lay: Mi3Layout, at: int, bits: int, binned: bool) -> int | None:
    """The bitmap at AT (a binned one: BINNED) as an integer of BITS bits, or None when its chunk count does not
    cover them."""
    chunks = u64(mem, at)
    if chunks * 512 < bits or chunks > 512:
        return None
    data = mem.read(at + (lay.bbitmap_chunks if binned else lay.bitmap_chunks), chunks * 64)
    return int.from_bytes(data, "little") & ((1 << bits) - 1)
