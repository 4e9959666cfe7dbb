"""Where mallocng's memory goes: every group's bytes by its slots' states, per size class and in all.

A group takes its memory from a mapping of its own, from the end of a program's or library's data given to malloc
at start (donated), or from a slot of a larger group (nested: that slot's bytes are then the nested group's, never
counted twice).  Its bytes are its 16-byte header, its slots, and the end of its mapping past its last slot; a
slot in use holds what the program asked for and the rest of the slot (the allocator's slack, counted as
overhead with the headers); a free slot was freed, is available (activated, handed out next), or was never
activated (its pages never touched).  Requests mapped on their own (class 63) are the large allocations, apart."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from heapwalk.musl.layout import AREA_SIZE, CLASSES, MMAPPED, UNIT
from heapwalk.musl.model import AVAILABLE, FREED, IN_USE, INSIDE, UNUSED, Group, MuslState

__all__ = ["Tally", "ClassRow", "tally", "FREE_KINDS"]

#: the kinds of free slots, as the report's columns name them
FREE_KINDS = (FREED, AVAILABLE, UNUSED)


@dataclass
class ClassRow:
    """One size class: its groups and slots, the allocations in it and the bytes asked for, its free slots."""

    sizeclass: int
    slot_size: int
    groups: int = 0
    slots: int = 0
    in_use: int = 0
    requested: int = 0
    nested: int = 0          # slots that hold a smaller group
    free: dict = field(default_factory=lambda: dict.fromkeys(FREE_KINDS, 0))       # slots by kind
    empty_groups: int = 0    # groups with no slot in use, kept


@dataclass
class Tally:
    """Every byte of the groups, by what holds it (the large allocations apart), and each class's row."""

    system: int = 0
    in_use: int = 0
    free: dict = field(default_factory=lambda: dict.fromkeys(FREE_KINDS, 0))
    overhead: int = 0
    meta: int = 0                  # the meta areas
    large_count: int = 0
    large_bytes: int = 0
    large_requested: int = 0
    trapped: int = 0               # free slot bytes in groups that hold an allocation: kept while it lives
    empty_bytes: int = 0           # bytes of groups with nothing in use, kept (donated, or their class bouncing)
    groups: dict = field(default_factory=dict)     # source -> groups
    rows: dict = field(default_factory=dict)       # size class -> ClassRow

    @property
    def free_total(self) -> int:
        return sum(self.free.values())


def tally(state: MuslState) -> Tally:
    """STATE's bytes by what holds them."""
    t = Tally()
    per_group = np.bincount(state.used_group, weights=state.used_size.astype(np.float64),
                            minlength=len(state.groups)) if len(state.groups) else np.zeros(0)
    counts = np.bincount(state.used_group, minlength=len(state.groups)) if len(state.groups) else np.zeros(0)
    inner_of = {}
    for inner, gi in state.nested.items():
        inner_of[(gi, (state.groups[inner].mem - state.groups[gi].storage) // max(1, state.groups[gi].stride))] = inner
    for gi, g in enumerate(state.groups):
        t.groups[g.source] = t.groups.get(g.source, 0) + 1
        if g.sizeclass == MMAPPED:
            t.large_count += 1
            t.large_bytes += g.extent
            t.large_requested += int(per_group[gi])
            continue
        if g.source != INSIDE:
            t.system += g.extent
            t.overhead += g.extent - UNIT - g.stride * g.slots
        _group(t, state, gi, g, int(per_group[gi]), int(counts[gi]), inner_of)
    t.meta = AREA_SIZE * len(state.meta_areas)
    t.system += t.meta
    t.overhead += t.meta
    return t


def _group(t: Tally, state: MuslState, gi: int, g: Group, requested: int, count: int, inner_of: dict) -> None:
    """Group G's header and slots into T (a nested group's own bytes come with its container slot)."""
    row = t.rows.get(g.sizeclass)
    if row is None:
        row = t.rows[g.sizeclass] = ClassRow(g.sizeclass, g.stride if g.sizeclass < CLASSES else 0)
    row.groups += 1
    row.slots += g.slots
    t.overhead += UNIT
    held, free = 0, 0
    for idx in range(g.slots):
        kind = g.state(idx)
        if kind == IN_USE:
            inner = inner_of.get((gi, idx))
            if inner is not None:
                row.nested += 1
                t.overhead += g.stride - state.groups[inner].extent
                continue
            held += 1
        else:
            row.free[kind] += 1
            t.free[kind] += g.stride
            free += g.stride
    row.in_use += count
    row.requested += requested
    t.in_use += requested
    t.overhead += g.stride * held - requested
    if held or row.nested and any(inner_of.get((gi, i)) is not None for i in range(g.slots)):
        t.trapped += free
    elif g.source != INSIDE:
        row.empty_groups += 1
        t.empty_bytes += g.extent
