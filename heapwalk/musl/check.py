"""mallocng's invariants beyond what the decode holds it to (`musl.decode`: meta areas, groups, slots in use):
each size class's list of groups with free slots is a ring of metas in use of that class, each one's neighbours
pointing back; each freed slot's header says freed (free writes 255 over its index and zero over its offset; a slot that held
a smaller group keeps the header that said so when that group is freed), so that a slot the masks call free yet
whose header names it in use, or a header written over, is named."""

from __future__ import annotations

import struct

from heapwalk.common.findings import Finding, Severity
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.musl.kinds import LIST, SLOT
from heapwalk.musl.layout import IB, UNIT
from heapwalk.musl.model import FREED, MuslState

__all__ = ["check_musl", "CHECKED"]

CHECKED = ("every meta area against the context's secret", "every group against its meta",
           "every slot in use by its header", "every freed slot's header", "each size class's ring of groups")

_H = struct.Struct("<H")


def check_musl(state: MuslState, mem: Memory) -> list[Finding]:
    """What the decode found and what these checks find, errors first, then by address."""
    out = list(state.findings) + _rings(state) + _freed(state, mem)
    return sorted(out, key=lambda f: (f.severity is not Severity.ERROR, f.address))


def _rings(state: MuslState) -> list[Finding]:
    """Each class's active ring: metas in use of that class, next and prev agreeing, back at its head."""
    by_meta = {g.meta: g for g in state.groups}
    out = []
    for sc, head in enumerate(state.active):
        if not head:
            continue
        m, seen = head, set()
        while True:
            g = by_meta.get(m)
            if g is None or g.sizeclass != sc:
                what = "no meta in use" if g is None else f"a group of class {g.sizeclass}"
                out.append(Finding(Severity.ERROR, m, "size class ring", f"class {sc}'s ring of groups reaches "
                                   f"{m:#x}, {what}", LIST))
                break
            nxt = by_meta.get(g.next)
            if nxt is None or nxt.prev != g.meta:
                out.append(Finding(Severity.ERROR, g.meta + 8, "size class ring", f"class {sc}'s ring: the meta at "
                                   f"{g.meta:#x} points on to {g.next:#x}, which does not point back", LIST))
                break
            seen.add(m)
            m = g.next
            if m == head:
                break
            if m in seen or len(seen) > len(by_meta):
                out.append(Finding(Severity.ERROR, g.meta + 8, "size class ring", f"class {sc}'s ring of groups "
                                   "loops without coming back to its head", LIST))
                break
    return out


def _freed(state: MuslState, mem: Memory) -> list[Finding]:
    """Each freed slot's header: freed where the slot starts, or at the offset the start names."""
    out = []
    for g in state.groups:
        for idx in range(g.slots):
            if g.state(idx) != FREED:
                continue
            start = g.storage + g.stride * idx
            try:
                h = mem.read(start - IB, IB)
                p = start
                if h[1] != 255 and h[1] >> 5 == 7:
                    p = start + UNIT * _H.unpack_from(h, 2)[0]
                    h = mem.read(p - IB, IB)
            except ReadError:
                continue
            if h[1] == (6 << 5 | idx):
                continue                     # a smaller group's slot once: freed with it, its header left as was
            if h[1] != 255 or _H.unpack_from(h, 2)[0]:
                said = "in use" if h[1] & 31 == idx and _H.unpack_from(h, 2)[0] == (p - g.storage) // UNIT \
                    else "written over"
                out.append(Finding(Severity.ERROR, p - IB, "slot", f"slot {idx} of the group at {g.mem:#x} (class "
                                   f"{g.sizeclass}) is freed by its meta's masks, yet its header at {p:#x} is {said} "
                                   f"({h.hex()})", SLOT))
    return out
