"""mallocng as decoded: its groups, each slot's state, the allocations the program holds, and what the decode
found wrong.  A value, never changed once made."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from heapwalk.common.findings import Finding
from heapwalk.musl.layout import SIZE_CLASSES, UNIT

__all__ = ["Group", "MuslState", "IN_USE", "FREED", "AVAILABLE", "UNUSED", "NESTED", "STATES", "MAPPED", "DONATED",
           "INSIDE"]

#: a slot's state: the program holds it; free() gave it back; activated and never handed out since (or given
#: back and activated again); beyond the group's activated slots, never touched; holding a smaller group
IN_USE, FREED, AVAILABLE, UNUSED, NESTED = "in use", "freed", "available", "unused", "group"
STATES = (IN_USE, FREED, AVAILABLE, UNUSED, NESTED)
#: where a group's memory comes from: a mapping of its own; the unused end of a program's or library's data,
#: given to malloc at start; a slot of a larger group
MAPPED, DONATED, INSIDE = "mapped", "donated", "nested"


@dataclass(frozen=True)
class Group:
    """One group and its meta: where they are, its class, its slots' masks, and where its memory comes from."""

    meta: int
    mem: int
    sizeclass: int
    last_idx: int
    freeable: bool
    maplen: int                 # its mapping's length in 4 KiB units (0: not a mapping of its own)
    avail: int
    freed: int
    active_idx: int             # its highest activated slot, from the group's header
    prev: int
    next: int

    @property
    def slots(self) -> int:
        return self.last_idx + 1

    @property
    def stride(self) -> int:
        """Bytes from one slot to the next."""
        if not self.last_idx and self.maplen:
            return self.maplen * 4096 - UNIT
        return UNIT * SIZE_CLASSES[self.sizeclass] if self.sizeclass < len(SIZE_CLASSES) else 0

    @property
    def storage(self) -> int:
        return self.mem + UNIT

    @property
    def source(self) -> str:
        if self.maplen:
            return MAPPED
        return INSIDE if self.freeable else DONATED

    @property
    def extent(self) -> int:
        """Bytes of its memory: its mapping, or its header and slots."""
        return self.maplen * 4096 if self.maplen else UNIT + self.stride * self.slots

    def state(self, index: int) -> str:
        """Slot INDEX's state as the masks say (IN_USE also for a slot that holds a smaller group)."""
        bit = 1 << index
        if self.avail & bit:
            return AVAILABLE
        if self.freed & bit:
            return UNUSED if index > self.active_idx else FREED
        return IN_USE


@dataclass(frozen=True)
class MuslState:
    """mallocng in one target: its context and what was walked from it.

    USED_* are the allocations the program holds, sorted by address: each one's address (what malloc returned),
    the size it asked for, and its group's index in GROUPS.  NESTED maps a group's index to the index of the
    group it lies in (its container slot's group).  SLOT_BYTES: each state's bytes of slots, over every group
    not inside another (a container's bytes go to its group's slots)."""

    target: str
    context: int
    secret: int
    found_by: str
    library: str
    version: str
    page_size: int
    groups: tuple[Group, ...]
    meta_areas: tuple[int, ...]
    used_addr: np.ndarray
    used_size: np.ndarray
    used_group: np.ndarray
    nested: dict = field(default_factory=dict)
    findings: tuple[Finding, ...] = ()
    usage_by_class: tuple[int, ...] = ()
    active: tuple[int, ...] = ()
    facts: tuple[tuple[str, str], ...] = ()

    @property
    def in_use_bytes(self) -> int:
        return int(self.used_size.sum())
