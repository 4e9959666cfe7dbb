"""jemalloc's allocations as the leak scan takes them (`view.Blocks`): every region a slab hands out (its bitmap
says which, checked against the slab's count of free regions) and every large allocation, less the regions the
thread caches hold (free, from the program's side) and jemalloc's own allocations for its threads (their cache
stacks hold freed regions' addresses: never roots, never judged).

All of jemalloc's extents are its heaps (scanned only inside the allocations), and its base blocks (its arenas,
extent headers, radix tree) its private memory: neither is ever a root.  Nor are the keys of each thread's
radix tree cache in its tsd: addresses rounded down to a leaf's span, each beside the leaf it found (in a base
block), which may fall inside any allocation.  A slab whose bitmap cannot be read or
disagrees with its free count is scanned as unknown memory (a root, never judged)."""

from __future__ import annotations

import numpy as np

from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.inferior.ranges import merged, merged_arrays
from heapwalk.inferior.ownmemory import give_back
from heapwalk.inferior.records import read_records
from heapwalk.analysis.lookup import NATIVE, merge_blocks
from heapwalk.jemalloc.native import compact_edit, slab_regions, slab_regions_compact
from heapwalk.jemalloc.extents import ACTIVE, ExtentTable
from heapwalk.jemalloc.model import JeState
from heapwalk.jemalloc.region import SLAB_BITMAP
from heapwalk.common.view import LENGTH_UNIT, Blocks, retagged, tags_held

__all__ = ["jemalloc_blocks"]


def jemalloc_blocks(mem: Memory, state: JeState) -> Blocks | None:
    """The allocations the program holds in STATE's extents (None when the extents are not known)."""
    table = state.extents
    if table is None:
        return None
    active = table.state == ACTIVE
    slabs = np.flatnonzero(active & table.slab & (table.szind < table.classes.nbins))
    large = np.flatnonzero(active & ~table.slab)
    excluded = np.array(sorted(_not_the_programs(state)), dtype=np.uint64)
    found = _in_address_order(mem, table, slabs, large, excluded)
    if found is None:
        found = (*_sorted(mem, table, slabs, large, excluded), None)
    start, end, arena, unknown, lengths = found
    heaps = merged_arrays(table.address, table.address + table.size.astype(np.uint64))
    bases = merged((at, at + size) for a in state.arenas for at, size in a.base_blocks)
    private = merged([*bases, *_cache_keys(mem, state, bases)])
    return Blocks(start, end, arena, 0, 0, heaps=tuple(heaps), private=tuple(private), unknown=tuple(merged(unknown)),
                  lengths=lengths)


#: the span of memory a radix tree leaf covers, at the least (a 57-bit tree's: 2**15 pages of 4 KiB)
_LEAF_SPAN = 1 << 27


def _cache_keys(mem: Memory, state: JeState, bases: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The words of the threads' tsds that are radix tree cache keys: a multiple of a leaf's span, followed by a
    pointer into a base block (the leaf)."""
    starts = np.array([lo for lo, _ in bases], dtype=np.uint64)
    ends = np.array([hi for _, hi in bases], dtype=np.uint64)
    out = []
    for t in state.threads:
        if not t.tsd or not t.tsd_size:
            continue
        try:
            words = np.frombuffer(mem.read(t.tsd, t.tsd_size & ~7), dtype=np.uint64)
        except ReadError:
            continue
        keys, leaves = words[:-1], words[1:]
        where = np.searchsorted(starts, leaves, side="right") - 1
        in_base = (where >= 0) & (leaves < ends[np.maximum(where, 0)]) if len(starts) else np.zeros(len(keys), bool)
        hits = np.flatnonzero(in_base & (keys != 0) & (keys % np.uint64(_LEAF_SPAN) == 0))
        out += [(t.tsd + 8 * int(i), t.tsd + 8 * int(i) + 8) for i in hits]
    return out


def _large(table: ExtentTable, large: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The large allocations at rows LARGE of TABLE: starts, ends (never past their extent) and arenas."""
    first = table.address[large] + table.offset[large].astype(np.uint64)
    sizes = table.usizes(large).astype(np.uint64)
    return (first, np.minimum(first + sizes, table.address[large] + table.size[large].astype(np.uint64)),
            table.arena[large].astype(np.int32))


def _in_address_order(mem: Memory, table: ExtentTable, slabs: np.ndarray, large: np.ndarray, excluded: np.ndarray
                      ) -> tuple | None:
    """The blocks as `_sorted` finds them, made in address order (the slabs' rows and the large ones sorted by
    address) rather than sorted afterwards, as (starts, ends or None, arenas, unknown, lengths or None): in the
    compact form the leak scan keeps (`_compact`) where it holds them, else merged whole in C; None without the
    library, or when damage makes two blocks start together or out of order (then `_sorted` decides, as
    always)."""
    if not NATIVE:
        return None
    slabs = slabs[np.argsort(table.address[slabs], kind="stable")]
    large = large[np.argsort(table.address[large], kind="stable")]
    big = _large(table, large)
    if _compactable(table, slabs, big):
        return _compact(mem, table, slabs, big, excluded)
    starts, ends, arenas, unknown = _slab_regions(mem, table, slabs)
    if len(starts) != 1 or not _apart(starts[0], big[0]):
        return None
    found = merge_blocks((starts[0], ends[0], arenas[0]), big, excluded)
    return None if found is None else (*found, unknown, None)


def _compactable(table: ExtentTable, slabs: np.ndarray, big: tuple) -> bool:
    """Whether the compact form holds these blocks: every size a multiple of `LENGTH_UNIT` below 32 GiB, at most
    256 arenas."""
    sizes = np.array([b.size for b in table.classes.bins], dtype=np.int64)
    lengths = big[1] - big[0]
    arenas = np.union1d(table.arena[slabs], big[2])
    return not np.any(sizes % LENGTH_UNIT) and not np.any(lengths % np.uint64(LENGTH_UNIT)) and \
        int(lengths.max(initial=0)) // LENGTH_UNIT < 1 << 32 and len(arenas) <= 256


def _compact(mem: Memory, table: ExtentTable, slabs: np.ndarray, big: tuple, excluded: np.ndarray) -> tuple | None:
    """The blocks of SLABS and BIG made straight into the arrays the leak scan keeps (`native.slab_regions_compact`:
    a start, a 32-bit length and a byte for the arena each, with room for BIG), those starting at one of
    EXCLUDED taken out and BIG merged in, in place; None when damage makes two blocks start together or out of
    order."""
    l_start, l_end, l_arena = big
    numbers = np.union1d(table.arena[slabs], l_arena).astype(np.int32)
    bitmaps, nregs_of, size_of = _bitmaps(mem, table, slabs)
    szind = table.szind[slabs].astype(np.int64)
    starts, lengths, tags, n, good = slab_regions_compact(
        bitmaps.data, nregs_of[szind], size_of[szind], table.nfree[slabs], bitmaps.readable, table.address[slabs],
        np.searchsorted(numbers, table.arena[slabs]), len(l_start))
    del bitmaps, szind
    give_back()                                              # the bitmaps' and the decode's holes, before the scan
    if not _apart(starts[:n], l_start):
        return None
    keep = _without(l_start, excluded)
    l_units = ((l_end - l_start)[keep] // np.uint64(LENGTH_UNIT)).astype(np.uint32)
    l_tag = np.searchsorted(numbers, l_arena[keep]).astype(np.uint8)
    n = compact_edit((starts, lengths, tags), n, excluded, (l_start[keep], l_units, l_tag))
    starts, lengths, tags = starts[:n], lengths[:n], tags[:n]
    held = tags_held(tags, len(numbers))
    if not held.all():                                       # an arena whose blocks were all taken out
        tags = retagged(tags, held)
        numbers = numbers[held]
    return starts, None, (numbers, tags), _spans(table, slabs[~good]), lengths


def _apart(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the starts A and B (each ascending) are each strictly ascending, and none of B is one of A."""
    if np.any(a[1:] <= a[:-1]) or np.any(b[1:] <= b[:-1]):
        return False
    at = np.searchsorted(a, b)
    inside = at < len(a)
    return not np.any(a[at[inside]] == b[inside])


def _sorted(mem: Memory, table: ExtentTable, slabs: np.ndarray, large: np.ndarray, excluded: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """The regions the slabs at rows SLABS hand out and the large allocations at rows LARGE, in address order
    (a stable sort: where damage makes two start together, the slabs' first, in their rows' order), less those
    starting at one of EXCLUDED; and the slabs read as unknown memory."""
    starts, ends, arenas, unknown = _slab_regions(mem, table, slabs)
    if len(large):
        for parts, column in zip((starts, ends, arenas), _large(table, large)):
            parts.append(column)
    start, end, arena = (np.concatenate(parts) if parts else np.zeros(0, dtype=t)
                         for parts, t in ((starts, np.uint64), (ends, np.uint64), (arenas, np.int32)))
    order = np.argsort(start, kind="stable")
    start = start[order]
    keep = _without(start, excluded)
    order = order[keep]
    return start[keep], end[order], arena[order], unknown


def _without(ordered: np.ndarray, excluded: np.ndarray) -> np.ndarray:
    """Whether each of ORDERED (ascending) is none of EXCLUDED (ascending, apart): a mask.  Each excluded value
    drops the run of its equals in ORDERED (+1 where it starts, -1 where it ends); the runs do not overlap, so each
    mark and each running sum is -1, 0 or 1, and a byte holds them (an absent value's +1 and -1 cancel, in any
    order, modulo 256)."""
    marks = np.zeros(len(ordered) + 1, dtype=np.int8)
    np.add.at(marks, np.searchsorted(ordered, excluded, side="left"), 1)
    np.add.at(marks, np.searchsorted(ordered, excluded, side="right"), -1)
    return np.cumsum(marks[:-1], dtype=np.int8) == 0


def _not_the_programs(state: JeState) -> set[int]:
    """The regions in use that the program does not hold: those a thread cache holds, and jemalloc's own."""
    return set(state.cached) | {address for t in state.threads for address in t.internal}


#: slabs whose bitmaps are unpacked at once (a bit a byte: this many times 512 bytes with 4 KiB pages)
_BATCH = 8192


def _bitmaps(mem: Memory, table: ExtentTable, slabs: np.ndarray) -> tuple:
    """The bitmaps of the slabs at rows SLABS, read together (`records.Records`), and each size class's number of
    regions and region size (indexed by szind)."""
    bins = table.classes.bins
    return (read_records(mem, table.header[slabs] + np.uint64(SLAB_BITMAP), table.classes.slab_maxregs // 8),
            np.array([b.nregs for b in bins], dtype=np.int64), np.array([b.size for b in bins], dtype=np.uint64))


def _slab_regions(mem: Memory, table: ExtentTable, slabs: np.ndarray
                  ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[tuple[int, int]]]:
    """The regions the slabs at rows SLABS of TABLE hand out (their bitmaps' clear bits: a set bit is a free
    region), as starts, ends and arenas, slab by slab in the rows' order and each slab's in address order;
    and the slabs whose bitmap is unreadable or does not count the slab's free regions (unknown memory)."""
    bitmaps, nregs_of, size_of = _bitmaps(mem, table, slabs)
    szind = table.szind[slabs].astype(np.int64)
    native = slab_regions(bitmaps.data, nregs_of[szind], size_of[szind], table.nfree[slabs], bitmaps.readable,
                          table.address[slabs], table.arena[slabs])
    if native is not None:
        starts, ends, arenas, good = native
        return [starts], [ends], [arenas], _spans(table, slabs[~good])
    return _slab_regions_numpy(table, slabs, bitmaps, nregs_of, size_of)


def _slab_regions_numpy(table: ExtentTable, slabs: np.ndarray, bitmaps, nregs_of: np.ndarray, size_of: np.ndarray
                        ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[tuple[int, int]]]:
    """`_slab_regions` in numpy, _BATCH slabs' bitmaps (`records.Records`) unpacked at once."""
    columns = np.arange(table.classes.slab_maxregs, dtype=np.int64)
    starts, ends, arenas, unknown = [], [], [], []
    batch = max(1, _BATCH * 512 // table.classes.slab_maxregs)
    for lo in range(0, len(slabs), batch):
        rows = slabs[lo:lo + batch]
        szind = table.szind[rows].astype(np.int64)
        inside = columns < nregs_of[szind][:, None]
        free = np.unpackbits(bitmaps.data[lo:lo + batch], axis=1, bitorder="little").view(bool) & inside
        good = bitmaps.readable[lo:lo + batch] & (free.sum(axis=1) == table.nfree[rows])
        slab, region = np.nonzero(inside & ~free & good[:, None])
        size = size_of[szind[slab]]
        first = table.address[rows[slab]] + region.astype(np.uint64) * size
        starts.append(first)
        ends.append(first + size)
        arenas.append(table.arena[rows[slab]].astype(np.int32))
        unknown += _spans(table, rows[~good])
    return starts, ends, arenas, unknown


def _spans(table: ExtentTable, rows: np.ndarray) -> list[tuple[int, int]]:
    """The memory [address, address + size) of the extents at ROWS of TABLE."""
    return list(zip(table.address[rows].tolist(), (table.address[rows] + table.size[rows].astype(np.uint64)).tolist()))
