"""What holds an address in jemalloc: the extent (through the table the radix tree gave), and in a slab the
region, with whether it is in use or free (the slab's bitmap, checked against its count of free regions), or
held by a thread's cache; in a large extent, the allocation.  For 'heapwalk chunk ADDRESS'."""

from __future__ import annotations

from typing import Any

import numpy as np

from heapwalk.analysis.report import human
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.jemalloc.extents import ACTIVE
from heapwalk.jemalloc.model import JeState

__all__ = ["locate_region", "region_text", "SLAB_BITMAP"]

#: where a slab's bitmap of regions lies in its extent header (5.2.1 extent_t, 5.3.0 edata_t): one bit per region
#: (8 words with 4 KiB pages; with 64 KiB pages, 128, then the levels of a tree over them), stored inverted (a set
#: bit is a free region, so that finding the first free one is a find-first-set)
SLAB_BITMAP = 64
_STATES = {0: "active", 1: "dirty", 2: "muzzy", 3: "retained"}


def locate_region(mem: Memory, state: JeState, address: int) -> dict[str, Any] | None:
    """What holds ADDRESS, as a document (None when no extent of jemalloc's does)."""
    table = state.extents
    i = int(np.searchsorted(table.address, np.uint64(address), side="right")) - 1
    if i < 0 or address >= int(table.address[i]) + int(table.size[i]):
        return None
    start, size = int(table.address[i]), int(table.size[i])
    out: dict[str, Any] = {"arena": int(table.arena[i]), "extent": start, "extent_size": size,
                           "extent_state": _STATES.get(int(table.state[i]), str(int(table.state[i]))),
                           "header": int(table.header[i])}
    if int(table.state[i]) != ACTIVE:
        return {**out, "kind": "free extent"}
    classes = table.classes
    szind = int(table.szind[i])
    if not table.slab[i]:
        usize = table.usize(i) if szind < classes.nbins + classes.nlextents else None
        first = start + int(table.offset[i])
        return {**out, "kind": "large", "allocation": first, "usize": usize,
                "offset": address - first if address >= first else None}
    cls = classes.bins[szind] if szind < classes.nbins else None
    if cls is None:
        return {**out, "kind": "slab", "region": None}
    index = (address - start) // cls.size
    region = start + index * cls.size
    out.update(kind="slab", size_class=cls.size, nregs=cls.nregs, region_index=index, region=region,
               offset=address - region, nfree=int(table.nfree[i]))
    if index >= cls.nregs:
        return {**out, "region": None, "use": "past the slab's last region"}
    cached = state.cached.get(region)
    if cached is not None:
        return {**out, "use": "free: in a thread's cache", "thread": cached}
    return {**out, "use": _bit(mem, int(table.header[i]), index, cls.nregs, int(table.nfree[i]))}


def _bit(mem: Memory, header: int, index: int, nregs: int, nfree: int) -> str:
    """Whether region INDEX of the slab whose header is at HEADER is handed out, from its bitmap (a set bit: free),
    checked against the slab's count of free regions ("not known" when they disagree or it is unreadable)."""
    try:
        raw = mem.read(header + SLAB_BITMAP, 8 * ((nregs + 63) // 64))
    except ReadError:
        return "not known (the slab's bitmap is unreadable)"
    bits = int.from_bytes(raw, "little") & ((1 << nregs) - 1)
    if bin(bits).count("1") != nfree:
        return "not known (the slab's bitmap disagrees with its count of free regions)"
    return "free" if bits >> index & 1 else "in use"


def region_text(where: dict[str, Any]) -> str:
    """'heapwalk chunk' in words."""
    head = (f"in arena {where['arena']}'s {where['extent_state']} extent {where['extent']:#x}-"
            f"{where['extent'] + where['extent_size']:#x} ({human(where['extent_size'])})")
    if where["kind"] == "free extent":
        return f"{head}: free pages, no allocation"
    if where["kind"] == "large":
        usize = human(where["usize"]) if where["usize"] is not None else "an unknown size"
        into = f", {where['offset']} bytes into it" if where["offset"] is not None else ", before its start"
        return f"{head}: a large allocation of {usize} at {where['allocation']:#x}{into}"
    if where.get("region") is None:
        return f"{head}: a slab" + (f", {where['use']}" if "use" in where else "")
    use = f"free: held by thread {where['thread']}'s cache" if "thread" in where else where["use"]
    return (f"{head}: a slab of {where['nregs']} regions of {where['size_class']} B ({where['nfree']} free); "
            f"region {where['region_index']} at {where['region']:#x}, {where['offset']} bytes into it: {use}")
