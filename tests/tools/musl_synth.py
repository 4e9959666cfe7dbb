"""A small mallocng heap written byte by byte as musl writes it (its context, a meta area, groups and their slots'
headers), for the unit tests of heapwalk.musl on synthetic memory."""

from __future__ import annotations

import struct

from heapwalk.inferior.image import ImageMemory
from heapwalk.musl.layout import AREA_HEADER, AREA_SIZE, AREA_SLOTS, IB, META_SIZE, SIZE_CLASSES, UNIT, Ctx

CTX, AREA, SECRET = 0x10000, 0x20000, 0x5EC2E7C0FFEE1234


class Heap:
    """A context, one meta area, and groups added one by one (each a mapping of its own unless said)."""

    def __init__(self):
        self.mem = ImageMemory({CTX: bytes(Ctx.size), AREA: bytes(AREA_SIZE)})
        self.metas = 0
        self.next_mem = 0x100000
        self.live: dict[int, int] = {}
        self.groups: list[dict] = []
        ctx = self.mem
        ctx.write_u64(CTX + Ctx.secret, SECRET)
        ctx.write(CTX + Ctx.init_done, struct.pack("<I", 1))
        ctx.write_u64(CTX + Ctx.meta_area_head, AREA)
        ctx.write_u64(CTX + Ctx.meta_area_tail, AREA)
        ctx.write_u64(AREA, SECRET)
        ctx.write(AREA + 16, struct.pack("<I", AREA_SLOTS))
        self._sync()

    def _sync(self) -> None:
        self.mem.write_u64(CTX + Ctx.avail_meta, AREA + AREA_HEADER + META_SIZE * self.metas)

    def group(self, sc: int, cnt: int, active: int | None = None, at: int | None = None, maplen: int | None = None,
              freeable: bool = True) -> dict:
        """A group of CNT slots of class SC (ACTIVE slots activated), all available: its meta and memory."""
        stride = UNIT * SIZE_CLASSES[sc]
        mem = at if at is not None else self.next_mem
        if maplen is None:
            maplen = -(-(UNIT + stride * cnt) // 4096)
        if at is None:
            self.mem.add(mem, bytes(max(4096 * maplen, UNIT + stride * cnt)))
            self.next_mem += 4096 * (maplen + 1)
        meta = AREA + AREA_HEADER + META_SIZE * self.metas
        self.metas += 1
        active = cnt if active is None else active
        g = {"meta": meta, "mem": mem, "sc": sc, "cnt": cnt, "stride": stride, "avail": (1 << active) - 1,
             "freed": ((1 << cnt) - 1) & ~((1 << active) - 1), "active": active - 1, "maplen": maplen,
             "freeable": freeable}
        self.groups.append(g)
        self.mem.write_u64(mem, meta)
        self.mem.write(mem + 8, bytes([active - 1]))
        for i in range(cnt + 1):
            if UNIT + i * stride - IB + 4 <= 4096 * maplen or at is not None:
                self.mem.write(mem + UNIT + i * stride - IB, bytes(1))
        self._meta(g)
        self._sync()
        return g

    def _meta(self, g: dict) -> None:
        bits = (g["cnt"] - 1) | (int(g["freeable"]) << 5) | (g["sc"] << 6) | (g["maplen"] << 12)
        self.mem.write(g["meta"], struct.pack("<QQQIIQ", g.get("prev", 0), g.get("next", 0), g["mem"], g["avail"],
                                              g["freed"], bits))

    def allocate(self, g: dict, idx: int, size: int, offset: int = 0) -> int:
        """Slot IDX of G handed out for SIZE bytes, OFFSET units into the slot: its address."""
        start = g["mem"] + UNIT + g["stride"] * idx
        p = start + UNIT * offset
        end = start + g["stride"] - IB
        if offset:
            self.mem.write(start - 2, struct.pack("<H", offset))
            self.mem.write(start - 3, bytes([7 << 5]))
            self.mem.write(p - 4, bytes(1))
        self.mem.write(p - 2, struct.pack("<H", (p - g["mem"] - UNIT) // UNIT))
        reserved = end - p - size
        if reserved:
            self.mem.write(end - reserved, bytes(1))
        if reserved >= 5:
            self.mem.write(end - 4, struct.pack("<I", reserved))
            self.mem.write(end - 5, bytes(1))
        self.mem.write(p - 3, bytes([idx | min(reserved, 5) << 5]))
        g["avail"] &= ~(1 << idx)
        g["freed"] &= ~(1 << idx)
        self._meta(g)
        self.live[p] = size
        return p

    def free(self, g: dict, p: int) -> None:
        """The allocation at P of G freed as free() does."""
        idx = self.mem.read(p - 3, 1)[0] & 31
        self.mem.write(p - 3, bytes([255]))
        self.mem.write(p - 2, bytes(2))
        g["freed"] |= 1 << idx
        self._meta(g)
        del self.live[p]

    def ring(self, sc: int, members: list[dict]) -> None:
        """MEMBERS as class SC's ring of groups with free slots."""
        for i, g in enumerate(members):
            g["next"] = members[(i + 1) % len(members)]["meta"]
            g["prev"] = members[i - 1]["meta"]
            self._meta(g)
        self.mem.write_u64(CTX + Ctx.active + 8 * sc, members[0]["meta"] if members else 0)
