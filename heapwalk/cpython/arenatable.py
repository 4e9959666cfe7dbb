"""obmalloc's arena table found without symbols: the vector of arena objects (48 bytes each: the arena's
address as mmap returned it, the next pool to carve, the free and total pool counts, the free pool list, two
list links) that malloc holds for the interpreter.  Its slot for an arena whose pools were found holds that
arena's address (at most a pool before its first pool) and a carving mark past its last pool; the slot is
found by searching the memory scanned for those addresses, and the table is taken only when every arena's slot
agrees.  It gives what the pool headers cannot: where an arena starts, so whether its first pool lost room to
alignment, and how many pools it has."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from heapwalk.inferior.elf import readable_runs
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["ARENA_OBJECT", "Slot", "ArenaTable", "find_table", "read_slot"]

#: bytes of one arena object
ARENA_OBJECT = 48
_SLOT = struct.Struct("<QQIIQQQ")
_PAGE = 4096
_WINDOW = 8 << 20
#: arena sizes CPython builds use: 256 KiB, 1 MiB, 2 MiB (huge pages)
ARENA_SIZES = (1 << 18, 1 << 20, 1 << 21)


@dataclass(frozen=True)
class Slot:
    """One arena object: the arena's ADDRESS (0: a slot no arena uses), the next pool to carve, the pools free
    and in all, the free pool list's head."""

    address: int
    pool_address: int
    nfreepools: int
    ntotalpools: int
    freepools: int


@dataclass(frozen=True)
class ArenaTable:
    """The arena table at ADDRESS, and the slots of the arenas found (index -> slot)."""

    address: int
    slots: dict


def read_slot(mem: Memory, table: int, index: int) -> Slot:
    """Slot INDEX of the table at TABLE (ReadError where it cannot be read)."""
    address, pool_address, nfree, ntotal, freepools, _, _ = _SLOT.unpack(mem.read(table + index * ARENA_OBJECT,
                                                                               ARENA_OBJECT))
    return Slot(address, pool_address, nfree, ntotal, freepools)


def find_table(mem: Memory, ranges: Sequence[tuple[int, int]], arenas: dict, pool_size: int) -> ArenaTable | None:
    """The arena table, searched for in RANGES: ARENAS maps each arena index found to (first pool, last pool);
    None when no place in RANGES holds a table every arena agrees with."""
    if not arenas:
        return None
    index = min(arenas)
    first = arenas[index][0]
    candidates = np.array([first - k * _PAGE for k in range(pool_size // _PAGE)], dtype=np.uint64)
    for at in _hits(mem, ranges, candidates):
        table = at - index * ARENA_OBJECT
        slots = _agreeing(mem, table, arenas, pool_size)
        if slots is not None:
            return ArenaTable(table, slots)
    return None


def _hits(mem: Memory, ranges: Iterable[tuple[int, int]], values: np.ndarray):
    """Every 8-aligned address in RANGES whose word is one of VALUES, in order."""
    for start, end in ranges:
        lo = start + (-start) % 8
        for at in range(lo, end - 7, _WINDOW):
            for base, data in readable_runs(mem, at, min(_WINDOW, (end - at) // 8 * 8)):
                words = np.frombuffer(data, dtype=np.uint64, count=len(data) // 8)
                for i in np.flatnonzero(np.isin(words, values)).tolist():
                    yield base + 8 * i


def _agreeing(mem: Memory, table: int, arenas: dict, pool_size: int) -> dict | None:
    """The slots of the table at TABLE for each of ARENAS, or None when one disagrees with its pools."""
    slots = {}
    for index, (first, last) in arenas.items():
        try:
            slot = read_slot(mem, table, index)
        except ReadError:
            return None
        if not first - pool_size < slot.address <= first or slot.address % _PAGE:
            return None
        size = (slot.ntotalpools + (1 if slot.address % pool_size else 0)) * pool_size
        if size not in ARENA_SIZES or slot.nfreepools > slot.ntotalpools:
            return None
        if not last + pool_size <= slot.pool_address <= slot.address + size or slot.pool_address % pool_size:
            return None
        slots[index] = slot
    return slots
