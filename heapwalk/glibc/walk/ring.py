"""The arena ring and each thread arena's heaps, walked as `heapwalk.glibc.walk.lists` walks the free lists:
every pointer checked before it is followed, a bound and a visited set, and each anomaly a `Finding`."""

from __future__ import annotations

import dataclasses
import struct

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.locate.layout import HEAP_MAX_SIZE, Layout
from heapwalk.glibc.locate.arenashape import plausible_arena
from heapwalk.glibc.walk.lists import ListWalk
from heapwalk.glibc.model import Heap
from heapwalk.inferior.memory import Memory, ReadError, u64

__all__ = ["walk_arena_ring", "walk_heaps", "ring_shortcut"]


def walk_arena_ring(mem: Memory, layout: Layout, main_arena: int, bound: int = 1 << 16
                    ) -> tuple[list[int], list[Finding]]:
    """The arenas in ring order from main_arena (malloc_info's order), following ``next``."""
    walk = ListWalk("arena ring", bound)
    arenas = [main_arena]
    walk.visited.add(main_arena)
    current = main_arena
    while True:
        try:
            nxt = u64(mem, current + layout.off_next)
        except ReadError as exc:
            walk.fail(current, f"cannot read arena.next: {exc}", Kind.ARENA_RING)
            break
        if nxt == main_arena:
            break
        if nxt == 0:
            walk.fail(current, "arena.next is NULL; the ring is broken", Kind.ARENA_RING, expected="an arena",
                      found="NULL")
            break
        if not walk.admit(nxt, "arena", current, alignment=8):
            walk.findings[-1] = dataclasses.replace(walk.findings[-1], kind=Kind.ARENA_RING)
            break
        try:
            mem.read(nxt, layout.arena_size)
        except ReadError:
            walk.unreadable(current, nxt, "arena")
            walk.findings[-1] = dataclasses.replace(walk.findings[-1], kind=Kind.ARENA_RING)
            break
        if not plausible_arena(mem, layout, nxt):
            walk.fail(current, f"arena.next is {nxt:#x}, where no arena is (its mutex, flags, top or bins are not "
                      "an arena's); the ring is broken", Kind.ARENA_RING, expected="an arena", found=f"{nxt:#x}")
            break
        arenas.append(nxt)
        current = nxt
    return arenas, walk.findings


def walk_heaps(mem: Memory, layout: Layout, arena: int, top: int, heap_max_size: int = HEAP_MAX_SIZE,
               bound: int = 1 << 16) -> tuple[list[Heap], list[Finding]]:
    """A thread arena's heaps, newest first: the heap holding top, then each heap_info.prev."""
    walk = ListWalk(f"heaps of arena {arena:#x}", bound)
    heaps: list[Heap] = []
    address = top & ~(heap_max_size - 1)
    holder = arena
    while address:
        if address % heap_max_size:
            walk.fail(holder, f"heap_info.prev {address:#x} is not aligned to the heap size {heap_max_size:#x}",
                      Kind.HEAP_INFO, expected=f"a multiple of {heap_max_size:#x}", found=f"{address:#x}")
            break
        if not walk.admit(address, "heap", holder):
            walk.findings[-1] = dataclasses.replace(walk.findings[-1], kind=Kind.HEAP_INFO)
            break
        try:
            ar_ptr, prev, size, mprotect_size = struct.unpack("<QQQQ", mem.read(address, 32))
            pagesize = u64(mem, address + 32) if layout.heap_info_size >= 48 else None
        except ReadError as exc:
            walk.fail(address, f"cannot read heap_info: {exc}", Kind.HEAP_INFO)
            break
        if ar_ptr != arena:
            walk.fail(address, f"heap_info.ar_ptr is {ar_ptr:#x}, not the arena {arena:#x}", Kind.HEAP_INFO,
                      expected=f"{arena:#x}", found=f"{ar_ptr:#x}")
            break
        if size > heap_max_size or mprotect_size > heap_max_size or size < layout.heap_info_size:
            walk.fail(address, f"heap_info.size {size:#x} / mprotect_size {mprotect_size:#x} do not fit the heap "
                               f"size {heap_max_size:#x}", Kind.HEAP_INFO, expected=f"at most {heap_max_size:#x}",
                      found=f"{size:#x}")
            break
        heaps.append(Heap(address, size, mprotect_size, ar_ptr, prev, pagesize))
        holder = address
        address = prev
    if walk.findings:
        heaps += _own_heap(mem, layout, arena, heap_max_size, heaps)
    return heaps, walk.findings


def _own_heap(mem: Memory, layout: Layout, arena: int, heap_max_size: int, found: list[Heap]) -> list[Heap]:
    """The heap that holds the arena itself (its first, oldest one), when the chain from top broke before it
    and its heap_info is readable and names the arena: its chunks are then walked too (and where they stop,
    named), rather than none of the arena's."""
    address = arena - layout.heap_info_size
    if address % heap_max_size or any(h.address == address for h in found):
        return []
    try:
        ar_ptr, prev, size, mprotect_size = struct.unpack("<QQQQ", mem.read(address, 32))
        pagesize = u64(mem, address + 32) if layout.heap_info_size >= 48 else None
    except ReadError:
        return []
    if ar_ptr != arena or prev or not layout.heap_info_size <= size <= heap_max_size or mprotect_size > heap_max_size:
        return []
    return [Heap(address, size, mprotect_size, ar_ptr, prev, pagesize)]


def _next_of(mem: Memory, layout: Layout, arena: int) -> int | None:
    try:
        return u64(mem, arena + layout.off_next)
    except ReadError:
        return None


def ring_shortcut(mem: Memory, layout: Layout, ring: list[int], lost: list[int]) -> Finding:
    """The link of a ring that closes but skips LOST arenas (found by their heaps): the ring arena whose next
    is also a lost arena's next (it jumps over the lost ones to where they lead), else the ring's last arena
    (its next closes the ring early)."""
    lost_next = {_next_of(mem, layout, a): a for a in lost}
    culprit, skipped = ring[-1], lost[0]
    for arena in ring:
        nxt = _next_of(mem, layout, arena)
        if nxt in lost_next:
            culprit, skipped = arena, lost_next[nxt]
            break
    found = _next_of(mem, layout, culprit)
    where = "arena 0 (main_arena)" if culprit == ring[0] else f"arena {ring.index(culprit)}"
    return Finding(Severity.ERROR, culprit, where, (
        f"arena.next is {found:#x}: the ring closes after {len(ring)} arena(s), skipping {len(lost)} arena(s) "
        f"whose heaps say they exist (such as {skipped:#x}); the ring is broken"), Kind.ARENA_RING,
        expected=f"{skipped:#x} or an arena before it", found=f"{found:#x}")
