"""obmalloc decoded in a target: the interpreter found by the file that holds it (python3.X, libpython3.X, or
any object that exports CPython's runtime state), its pools found by their headers in the anonymous memory no
other allocator claims, grouped by arena, and placed by the arena table when it is found."""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence

import numpy as np

from heapwalk.cpython.arenatable import ArenaTable, find_table
from heapwalk.cpython.model import ObArena, ObState, arena_figures, class_rows
from heapwalk.cpython.pools import HEADER, Pools, block_size, blocks_per_pool, find_pools
from heapwalk.common.errors import HeapwalkError
from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.inferior.elf import ElfImage
from heapwalk.inferior.memory import ReadError
from heapwalk.inferior.ranges import merged, ranges_without

__all__ = ["find_python", "load_obmalloc", "NoObmalloc"]

_NAME = re.compile(r"(?:^|/)(?:lib)?python(\d)\.(\d+)[a-z]*(?:\.so[.\d]*)?$")
#: what marks an object as CPython's when its name does not
_EXPORTS = ("_PyRuntime", "Py_Initialize")
#: the arena size of each pool size when the arena table is not found: CPython's defaults on 64-bit builds
_DEFAULT_ARENA = {4096: 1 << 18, 16384: 1 << 20}


class NoObmalloc(HeapwalkError):
    """The process holds no obmalloc arena (not CPython, or CPython whose small objects go to malloc)."""


def find_python(mem, mappings) -> tuple[str, str] | None:
    """(path, version) of the object that holds the interpreter (its version "3.11.2", or "3.11" from its name
    when it does not say): one named python3.X or libpython3.X, else the program itself when it exports
    CPython's runtime (an interpreter linked into another program); None when there is none."""
    firsts = [(m.start, m.path) for m in mappings if m.offset == 0 and m.path.startswith("/")]
    for base, path in firsts:
        match = _NAME.search(path)
        if match:
            image = _image(mem, base, path)
            return path, (_version(mem, image) if image else None) or f"{match.group(1)}.{match.group(2)}"
    for base, path in firsts:
        image = _image(mem, base, path)
        if image is not None and image.is_program:
            if any(image.dynamic_symbol(name) is not None for name in _EXPORTS):
                return path, _version(mem, image) or "3"
            return None
    return None


def _image(mem, base: int, path: str) -> ElfImage | None:
    try:
        return ElfImage.read(mem, base, path)
    except ReadError:
        return None


def _version(mem, image: ElfImage) -> str | None:
    """The interpreter's version from its Py_Version constant (3.11 and later), e.g. "3.11.2"."""
    at = image.dynamic_symbol("Py_Version")
    if at is None:
        return None
    try:
        hexversion, = struct.unpack("<I", mem.read(at, 4))
    except ReadError:
        return None
    major, minor, micro = hexversion >> 24, (hexversion >> 16) & 0xFF, (hexversion >> 8) & 0xFF
    return f"{major}.{minor}.{micro}" if major == 3 else None


def load_obmalloc(target, claimed: Sequence[tuple[int, int]]) -> ObState:
    """obmalloc decoded in TARGET (a `heapwalk.inferior.space.Target`), its pools searched for in the writable
    anonymous memory outside CLAIMED (the other allocators' heaps); NoObmalloc when there is none."""
    found = find_python(target.mem, target.space.mappings)
    if found is None:
        raise NoObmalloc("CPython is not mapped")
    path, version = found
    writable = _writable(target)
    pools = find_pools(target.mem, ranges_without(writable, merged(list(claimed))))
    if pools is None:
        raise NoObmalloc(f"CPython {version} holds no obmalloc arena")
    pools = pools.take(np.lexsort((pools.address, pools.arena)))     # by arena, then address
    rows = _by_arena(pools)
    spans = _spans(pools, rows)
    table = find_table(target.mem, _table_ranges(writable, claimed, spans, pools.pool_size), spans,
                       pools.pool_size)
    arenas, findings, counted = _arenas(pools, rows, table, target)
    if table is None:
        findings.insert(0, Finding(Severity.WARNING, 0, "obmalloc arena table", "obmalloc's arena table was not "
                                   "found: each arena is taken to start at its first pool, with CPython's default "
                                   "size, so what alignment costs is not counted", Kind.DISCOVERY))
    residency = target.residency.source if target.residency is not None else ""
    sizes = {a.size for a in arenas}
    return ObState(target.description, f"CPython {version} ({path})", pools.pool_size,
                   max(sizes) if sizes else _DEFAULT_ARENA.get(pools.pool_size, 0), tuple(arenas),
                   class_rows(counted), table.address if table else None, residency,
                   tuple(findings))


def _writable(target) -> list[tuple[int, int]]:
    """The memory searched for pools and for the arena table: the writable regions, and only their resident
    pages when the target says which are (a pool's header is written, so its page is in RAM or swap)."""
    regions = merged(target.space.regions)
    if target.space.writable is not None:
        writable = merged(target.space.writable)
        regions = [(max(a, c), min(b, d)) for a, b in regions for c, d in writable if max(a, c) < min(b, d)]
    if target.residency is None:
        return regions
    residency = target.residency.covering(regions)
    return [(int(s), int(e)) for a, b in regions for s, e in residency.within(a, b).tolist()]


def _by_arena(pools: Pools) -> dict:
    """Each arena index's pools (sorted by address, as a slice of POOLS sorted by arena then address), in one
    sort: index -> (first row, end row)."""
    if not len(pools):
        return {}
    cuts = np.flatnonzero(np.diff(pools.arena)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [len(pools)]))
    return {int(pools.arena[a]): (int(a), int(b)) for a, b in zip(starts.tolist(), ends.tolist())}


def _spans(pools: Pools, rows: dict) -> dict:
    """Each arena index's first and last pool found (POOLS sorted by arena, ROWS from `_by_arena`)."""
    return {index: (int(pools.address[a]), int(pools.address[b - 1])) for index, (a, b) in rows.items()}


def _table_ranges(writable, claimed, spans: dict, pool_size: int) -> list[tuple[int, int]]:
    """Where the arena table may be (malloc holds it): the other allocators' heaps first, then the rest of the
    writable memory, less the arenas; the smallest regions first."""
    arenas = merged([(first, last + pool_size) for first, last in spans.values()])
    rest = ranges_without(writable, arenas)
    inside = ranges_without(rest, ranges_without(rest, merged(list(claimed))))
    return sorted(inside, key=lambda r: r[1] - r[0]) + sorted(ranges_without(rest, merged(list(claimed))),
                                                              key=lambda r: r[1] - r[0])


def _arenas(pools: Pools, rows: dict, table: ArenaTable | None, target) -> tuple[list[ObArena], list[Finding], Pools]:
    """Each arena of ROWS (`_by_arena` over POOLS) with its figures, placed by the TABLE's slot (else from its
    first pool, at the default arena size); findings for pools that lie outside their arena or could not be
    read; and the pools counted (those in the carved part of their own arena)."""
    size_of = pools.pool_size
    arenas, findings, counted = [], [], []
    for index, (lo, hi) in sorted(rows.items()):
        mine = pools.take(slice(lo, hi))
        first, last = int(mine.address[0]), int(mine.address[-1])
        slot = table.slots.get(index) if table is not None else None
        if slot is not None:
            address, npools, carved_end = slot.address, slot.ntotalpools, slot.pool_address
            size = (npools + (1 if address % size_of else 0)) * size_of
        else:
            address, carved_end = first, last + size_of
            size = max(_DEFAULT_ARENA.get(size_of, size_of), carved_end - first)
            npools = size // size_of
        first_pool = -(-address // size_of) * size_of
        inside = (mine.address >= first_pool) & (mine.address < carved_end)
        stray = int((~inside).sum())
        if stray:
            findings.append(Finding(Severity.WARNING, first_pool, "obmalloc arena", f"{stray} pool header(s) "
                                    f"name arena {index} but lie outside its carved pools", Kind.ARENA))
        own = mine.take(inside)
        counted.append(np.arange(lo, hi)[inside])
        carved = (carved_end - first_pool) // size_of
        if carved > len(own):
            findings.append(Finding(Severity.WARNING, first_pool, "obmalloc arena", f"{carved - len(own)} of the "
                                    f"{carved} pools arena {index} carved could not be read: its figures leave "
                                    "them out", Kind.ARENA))
        figures = arena_figures(own)
        nfree = slot.nfreepools if slot is not None else npools - figures["used"]
        resident, free_resident = _resident(target, own, address, size, first_pool, carved_end, npools)
        arenas.append(ObArena(index, address, size, first_pool, npools, carved, figures["used"], nfree,
                              figures["in_use"], figures["free_blocks"], figures["headers"], figures["quantization"],
                              size - npools * size_of, resident, free_resident, _summed(figures["free_by_size"])))
    keep = np.concatenate(counted) if counted else np.zeros(0, dtype=np.int64)
    return arenas, findings, pools.take(keep)


def _resident(target, own: Pools, address: int, size: int, first_pool: int, carved_end: int, npools: int):
    """The arena's resident bytes, and those of its free memory: its empty and never-carved pools, the blocks
    never handed out of its pools in use, and their freed blocks (as the share of their carved part in RAM)."""
    if target.residency is None:
        return None, None
    res = target.residency.covering([(address, address + size)])
    pool = own.pool_size
    empty = own.take(~own.used)
    unused = res.resident_sum(empty.address, empty.address + np.uint64(pool)) + \
        res.resident(carved_end, first_pool + npools * pool)
    used = own.take(own.used)
    block = block_size(used.szidx)
    room = blocks_per_pool(used.szidx, pool)
    carved = (used.nextoffset - HEADER) // block
    virgin = res.resident_each(used.address + used.nextoffset.astype(np.uint64),
                               used.address + (HEADER + room * block).astype(np.uint64))
    touched = used.nextoffset - HEADER
    in_carved = res.resident_each(used.address + np.uint64(HEADER), used.address + used.nextoffset.astype(np.uint64))
    freed = ((carved - used.count) * block * in_carved) // np.maximum(touched, 1)
    return res.resident(address, address + size), int(unused + virgin.sum() + freed.sum())


def _summed(pairs) -> tuple:
    """(size, count) PAIRS summed by size, sizes with no count left out."""
    out: dict = {}
    for size, count in pairs:
        out[size] = out.get(size, 0) + count
    return tuple((s, n) for s, n in sorted(out.items()) if n)
