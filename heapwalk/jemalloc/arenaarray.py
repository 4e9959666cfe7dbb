"""Where jemalloc's arena array is, found without symbols: ``arenas[]`` holds a pointer to each arena by its
index (MALLOCX_ARENA_LIMIT slots, the unused ones zero).

It is what the atexit hook after an exported ``malloc_stats_print`` loops over (that hook also reads
``narenas_total``), else what ``arenas.lookup``'s function loads, else the array in the object's writable
data whose first slot points to an arena.  An array counts only when its slots hold cache-line aligned
pointers or nothing and one of its first arenas shows the version's layout: the states of its dirty, muzzy
and retained extent containers read 1, 2 and 3.
"""

from __future__ import annotations

import struct

import numpy as np

from heapwalk.arch import USER_SPACE_END
from heapwalk.inferior.elf import ElfImage, readable_runs
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.jemalloc.find import JemallocImage, JemallocNotFound
from heapwalk.jemalloc.layout import JeLayout
from heapwalk.jemalloc.mallctl import MallctlTree

__all__ = ["arena_array", "container_states", "CONTAINER_STATES", "ARENA_LIMIT"]

_HOOK_SPAN = 0x600      # bytes of a function searched for its loads
#: what the dirty, muzzy and retained containers' states read in every sound arena
CONTAINER_STATES = [1, 2, 3]


def container_states(mem: Memory, layout: JeLayout, arena: int) -> list[int]:
    """The states of the arena at ARENA's dirty, muzzy and retained extent containers (ReadError when gone)."""
    return [_u32(mem, arena + off) for off in (layout.dirty_state, layout.muzzy_state, layout.retained_state)]


def arena_array(mem: Memory, found: JemallocImage, tree: MallctlTree | None, layout: JeLayout
                 ) -> tuple[int, int, int | None, str]:
    """(arenas, how many slots to read, narenas_total or None, how): from the atexit hook after an exported
    malloc_stats_print, else arenas.lookup's function, else the object's data."""
    said = []
    start = found.entry("malloc_stats_print")
    if start is not None:
        try:
            arenas, narenas, how = _hook_loads(found.image, start)
            count = _u32(mem, narenas)
            if 0 < count <= ARENA_LIMIT and _arenas_at(mem, layout, arenas) is not None:
                return arenas, count, narenas, how
            said.append(f"the arena loop after {found.prefix}malloc_stats_print reads {count} arenas at "
                        f"{arenas:#x}, which hold no arena")
        except (JemallocNotFound, ReadError) as exc:
            said.append(str(exc))
    node = tree.node("arenas.lookup") if tree is not None else None
    if node is not None and node.ctl:
        try:
            code = mem.read(node.ctl, _HOOK_SPAN)
        except ReadError as exc:
            said.append(f"arenas.lookup's function is unreadable ({exc.reason})")
            code = b""
        for at, block, what in _with_callees(mem, found.image, node.ctl, code):
            for load in found.image.through_slots(found.image.code.address_refs(block, at)):
                target = load.target
                if load.computes and found.image.contains(target):
                    slots = _arenas_at(mem, layout, target)
                    if slots is not None:
                        return target, slots, None, \
                            f"arenas.lookup's function{what} (code at {at + load.offset:#x}); its last arena"
        said.append("arenas.lookup's function loads no arena array")
    at = _scan_arenas(mem, found.image, layout)
    if at is not None:
        return at[0], at[1], None, "the array in the object's data whose first slot holds an arena; its last arena"
    raise JemallocNotFound(f"heapwalk found no arena array in jemalloc {layout.name.split()[1]} "
                           f"(in {found.path}): " + "; ".join(said + ["no array of arenas in its data"]))


#: the functions arenas.lookup's calls that are searched too (unoptimised code loads arenas[] in one of them)
_CALLEES = 12


def _with_callees(mem: Memory, image: ElfImage, start: int, code: bytes):
    """(address, code, how it is named) of the function at START and of the functions it calls, in order."""
    yield start, code, ""
    for callee in list(dict.fromkeys(image.code.calls(code, start)))[:_CALLEES]:
        if image.contains(callee):
            try:
                yield callee, mem.read(callee, _HOOK_SPAN), f", in a function it calls at {callee:#x}"
            except ReadError:
                continue


#: arenas[]'s slots (MALLOCX_ARENA_LIMIT)
ARENA_LIMIT = 4095


def _arenas_at(mem: Memory, layout: JeLayout, at: int) -> int | None:
    """How many slots of the array at AT to read (its last arena's index + 1) when AT is arenas[]: its slots
    hold cache-line aligned pointers or nothing, and one of its first arenas shows LAYOUT; None otherwise."""
    if at % 8:
        return None
    raw = b""
    for size in (8 * ARENA_LIMIT, 4096 - at % 4096):
        try:
            raw = mem.read(at, size)
            break
        except ReadError:
            continue
    slots = struct.unpack("<%dQ" % (len(raw) // 8), raw)
    if not slots or not slots[0]:
        return None
    if any(p and (p % 64 or p >= USER_SPACE_END) for p in slots):
        return None
    live = [p for p in slots if p][:8]
    for arena in live:
        try:
            if container_states(mem, layout, arena) == CONTAINER_STATES:
                return max(i for i, p in enumerate(slots) if p) + 1
        except ReadError:
            continue
    return None


_SCAN_CANDIDATES = 4096


def _scan_arenas(mem: Memory, image: ElfImage, layout: JeLayout) -> tuple[int, int] | None:
    """arenas[] and its slots to read, found in IMAGE's writable data as the array whose first slot points to
    an arena of LAYOUT (the array that lists the most arenas, when several do)."""
    best = None
    checked: dict[int, bool] = {}
    for seg in image.writable():
        for start, data in readable_runs(mem, seg.address, seg.memsz):
            skip = (-start) % 8
            words = np.frombuffer(data, dtype=np.uint64, count=(len(data) - skip) // 8, offset=skip)
            likely = np.flatnonzero((words % 64 == 0) & (words > 0xFFFF) & (words < USER_SPACE_END))
            for index in likely[:_SCAN_CANDIDATES * 8]:
                value = int(words[index])
                if value not in checked:
                    if len(checked) >= _SCAN_CANDIDATES:
                        break
                    try:
                        checked[value] = container_states(mem, layout, value) == CONTAINER_STATES
                    except ReadError:
                        checked[value] = False
                if checked[value]:
                    at = start + skip + 8 * int(index)
                    slots = _arenas_at(mem, layout, at)
                    if slots is not None and (best is None or slots > best[1]):
                        best = (at, slots)
    return best


def _hook_loads(image: ElfImage, start: int) -> tuple[int, int, str]:
    """(arenas, narenas_total, how) from the code after malloc_stats_print at START."""
    try:
        code = image.mem.read(start, _HOOK_SPAN)
    except ReadError as exc:
        raise JemallocNotFound(f"the code of malloc_stats_print is unreadable ({exc.reason})") from None
    counts = [r for r in image.code.loads32(code, start) if r.argument == 3]  # the loop's count, in a register
    if not counts:
        raise JemallocNotFound("no 32-bit load of narenas_total after malloc_stats_print")
    narenas = counts[0]
    leas = [r for r in image.code.address_refs(code, start) if r.computes and r.offset > narenas.offset]
    if not leas:
        raise JemallocNotFound("no address of arenas[] computed after the load of narenas_total")
    return leas[0].target, narenas.target, \
        f"the arena loop after malloc_stats_print (code at {start + narenas.offset:#x})"


def _u32(mem: Memory, address: int) -> int:
    return int.from_bytes(mem.read(address, 4), "little")


