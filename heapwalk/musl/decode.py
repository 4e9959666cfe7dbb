"""mallocng decoded from its context: every meta area (its check word against the context's secret), every meta
in use and its group, and each slot the masks say is in use read from its in-band header, which gives the
address malloc returned and the size asked for.  Memory is never trusted: a meta area off the context's secret,
a group whose header does not point back to its meta, masks that overlap or name slots the group lacks, a slot
header whose index, offset or reserved bytes disagree become findings at the bytes that are wrong."""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np

from heapwalk.arch import USER_SPACE_END
from heapwalk.common.findings import Finding, Severity
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.musl.layout import (AREA_HEADER, AREA_SIZE, AREA_SLOTS, CLASSES, IB, META_DTYPE, META_SIZE, MMAPPED,
                                  UNIT, Ctx)
from heapwalk.musl.kinds import AREA, GROUP, SLOT
from heapwalk.musl.model import IN_USE, Group, MuslState

__all__ = ["decode_musl", "Context", "read_context", "MAX_AREAS"]

#: meta areas walked at most (each is 4 KiB and describes 101 groups: 2**22 of them is 400 M groups)
MAX_AREAS = 1 << 22
_Q, _I, _H = struct.Struct("<Q"), struct.Struct("<I"), struct.Struct("<H")



class Context:
    """The fields of the context the walk starts from."""

    def __init__(self, raw: bytes, address: int):
        q = lambda at: _Q.unpack_from(raw, at)[0]     # noqa: E731
        self.address = address
        self.secret = q(Ctx.secret)
        self.init_done = _I.unpack_from(raw, Ctx.init_done)[0]
        self.area_head, self.area_tail = q(Ctx.meta_area_head), q(Ctx.meta_area_tail)
        self.avail_meta, self.avail_meta_count = q(Ctx.avail_meta), q(Ctx.avail_meta_count)
        self.active = tuple(q(Ctx.active + 8 * i) for i in range(CLASSES))
        self.usage = tuple(q(Ctx.usage_by_class + 8 * i) for i in range(CLASSES))
        self.brk = q(Ctx.brk)


def read_context(mem: Memory, address: int) -> Context:
    return Context(mem.read(address, Ctx.size), address)


def decode_musl(mem: Memory, address: int, found_by: str, library: str, version: str, page_size: int,
                target: str = "", progress: Callable[[int, int], None] | None = None) -> MuslState:
    """mallocng's state from its context at ADDRESS (FOUND_BY says how it was found, in LIBRARY of VERSION)."""
    ctx = read_context(mem, address)
    findings: list[Finding] = []
    areas, metas = _meta_areas(mem, ctx, findings)
    groups = _groups(mem, metas, findings)
    by_mem = {g.mem: i for i, g in enumerate(groups)}
    used: list[tuple[int, int, int]] = []
    nested: dict[int, int] = {}
    for gi, g in enumerate(groups):
        if progress is not None and gi % 4096 == 0:
            progress(gi, len(groups))
        for idx in range(g.slots):
            if g.state(idx) is IN_USE:
                _in_use(mem, g, gi, idx, by_mem, used, nested, findings)
    for mem_at, gi in by_mem.items():
        g = groups[gi]
        if g.source == "nested" and gi not in nested:
            findings.append(Finding(Severity.ERROR, g.mem, "group", f"no slot in use holds this group of class "
                                    f"{g.sizeclass} (its meta at {g.meta:#x} says it lies inside another group)",
                                    GROUP))
    used.sort()
    arr = np.array(used, dtype=np.uint64).reshape(-1, 3)
    return MuslState(target, address, ctx.secret, found_by, library, version, page_size, tuple(groups), tuple(areas),
                     arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].astype(np.int64), nested, tuple(findings),
                     ctx.usage, ctx.active)


def _meta_areas(mem: Memory, ctx: Context, findings: list[Finding]) -> tuple[list[int], list[tuple[int, np.ndarray]]]:
    """The meta areas from the context's list, and each one's metas in use (address of its first, the array)."""
    areas, metas, seen = [], [], set()
    area = ctx.area_head
    while area and len(areas) < MAX_AREAS:
        if area in seen or area % AREA_SIZE:
            findings.append(Finding(Severity.ERROR, area, "meta area", "the list of meta areas " + (
                "comes back to this area" if area in seen else "points to an address not 4 KiB-aligned"),
                AREA))
            break
        seen.add(area)
        try:
            raw = mem.read(area, AREA_SIZE)
        except ReadError:
            findings.append(Finding(Severity.ERROR, area, "meta area", "unreadable", AREA))
            break
        check, nxt, nslots = _Q.unpack_from(raw, 0)[0], _Q.unpack_from(raw, 8)[0], _I.unpack_from(raw, 16)[0]
        if check != ctx.secret:
            findings.append(Finding(Severity.ERROR, area, "meta area", f"its check word is {check:#x}, not the "
                                    f"context's secret {ctx.secret:#x}", AREA, f"{ctx.secret:#x}",
                                    f"{check:#x}"))
        if nslots != AREA_SLOTS:
            findings.append(Finding(Severity.ERROR, area + 16, "meta area", f"it says it holds {nslots} metas, not "
                                    f"{AREA_SLOTS}", AREA, str(AREA_SLOTS), str(nslots)))
        count = AREA_SLOTS
        first = area + AREA_HEADER
        if area == ctx.area_tail and first <= ctx.avail_meta <= first + META_SIZE * AREA_SLOTS:
            count = (ctx.avail_meta - first) // META_SIZE      # the rest never handed out yet
        table = np.frombuffer(raw, dtype=META_DTYPE, count=count, offset=AREA_HEADER)
        metas.append((first, table))
        areas.append(area)
        area = nxt
    return areas, metas


def _groups(mem: Memory, metas: list[tuple[int, np.ndarray]], findings: list[Finding]) -> list[Group]:
    """The groups of the metas in use (a meta whose group pointer is set), each checked against its meta."""
    groups = []
    for first, table in metas:
        for i in np.flatnonzero(table["mem"]):
            m = table[i]
            meta = first + META_SIZE * int(i)
            bits = int(m["bits"])
            last, sc, maplen = bits & 31, (bits >> 6) & 63, bits >> 12
            try:
                header = mem.read(int(m["mem"]), UNIT)
            except ReadError:
                findings.append(Finding(Severity.ERROR, int(m["mem"]), "group", f"its header is unreadable (its "
                                        f"meta at {meta:#x})", GROUP))
                continue
            g = Group(meta, int(m["mem"]), sc, last, bool(bits >> 5 & 1), maplen, int(m["avail"]), int(m["freed"]),
                      header[8] & 31, int(m["prev"]), int(m["next"]))
            if _sound(g, _Q.unpack_from(header, 0)[0], findings):
                groups.append(g)
    return groups


def _sound(g: Group, back: int, findings: list[Finding]) -> bool:
    """Whether group G can be walked: its header points back to its meta, its class is one, its masks are its
    slots'.  Each fault is a finding; a group that cannot be walked is left out (its memory then unaccounted)."""
    def bad(address: int, message: str, expected: str = "", found: str = "") -> None:
        findings.append(Finding(Severity.ERROR, address, "group", message, GROUP, expected, found))

    if back != g.meta:
        bad(g.mem, f"its header points to {back:#x}, not to its meta at {g.meta:#x}", f"{g.meta:#x}", f"{back:#x}")
        return False
    if g.sizeclass >= CLASSES and g.sizeclass != MMAPPED:
        bad(g.meta + 32, f"its meta says size class {g.sizeclass}, which mallocng does not have")
        return False
    if g.sizeclass == MMAPPED and (g.last_idx or not g.maplen):
        bad(g.meta + 32, "its meta says a request mapped on its own, yet not one slot in a mapping of its own")
        return False
    if g.maplen and (g.maplen * 4096 < UNIT + g.stride * g.slots or g.mem + g.maplen * 4096 > USER_SPACE_END):
        bad(g.meta + 32, f"its meta says a mapping of {g.maplen} pages of 4 KiB at {g.mem:#x}, which cannot hold its "
                         f"{g.slots} slots of {g.stride} bytes")
        return False
    full = (2 << g.last_idx) - 1
    if (g.avail | g.freed) & ~full & 0xFFFFFFFF:
        bad(g.meta + 24, f"its masks name slots beyond its last, {g.last_idx} (available {g.avail:#x}, freed "
                         f"{g.freed:#x})")
    if g.avail & g.freed:
        bad(g.meta + 24, f"slots both available and freed: {g.avail & g.freed:#x}")
    if g.active_idx > g.last_idx:
        bad(g.mem + 8, f"its header says slot {g.active_idx} activated, beyond its last, {g.last_idx}")
    return True


def _in_use(mem: Memory, g: Group, gi: int, idx: int, by_mem: dict[int, int], used: list, nested: dict,
            findings: list[Finding]) -> None:
    """Slot IDX of group G (index GI), in use by its masks: the program's allocation, or a smaller group it holds,
    read from its in-band header."""
    start = g.storage + g.stride * idx
    end = start + g.stride - IB

    def bad(address: int, message: str) -> None:
        findings.append(Finding(Severity.ERROR, address, "slot", f"slot {idx} of the group at {g.mem:#x} (class "
                                f"{g.sizeclass}), in use by its meta's masks: {message}", SLOT))

    try:
        head = mem.read(start - IB, IB)
        p = start + UNIT * _H.unpack_from(head, 2)[0] if head[1] >> 5 == 7 else start
        h = mem.read(p - IB, IB) if p != start else head
    except ReadError:
        bad(start, "its header is unreadable")
        return
    if p >= end:
        bad(start - IB, f"its header puts the allocation at {p:#x}, past the slot's end")
        return
    offset = _H.unpack_from(h, 2)[0]
    if h[0]:
        try:
            offset = _I.unpack_from(mem.read(p - 8, 4), 0)[0] if not offset else -1
        except ReadError:
            offset = -1
    if h[1] & 31 != idx or offset != (p - g.storage) // UNIT:
        bad(p - IB, f"the header at {p:#x} says slot {h[1] & 31}, {offset} units from the group's storage "
                    f"(it is {(p - g.storage) // UNIT})")
        used.append((p, end - p, gi))
        return
    reserved = h[1] >> 5
    if reserved == 6:
        inner = by_mem.get(p)
        if inner is None:
            bad(p - IB, f"its header says it holds a group at {p:#x}, and no meta names one there")
        else:
            nested[inner] = gi
        return
    if reserved == 5:
        try:
            reserved = _I.unpack_from(mem.read(end - 4, 4), 0)[0]
        except ReadError:
            bad(end - 4, "the count of its reserved bytes is unreadable")
            used.append((p, end - p, gi))
            return
    if reserved > end - p or reserved < (5 if h[1] >> 5 == 5 else 0):
        bad(p - IB, f"its header reserves {reserved} bytes of its {end - p}")
        used.append((p, end - p, gi))
        return
    used.append((p, end - reserved - p, gi))
