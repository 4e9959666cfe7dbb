"""Every object of every live span cut into objects, and where each free one waits: on its span's own free list
(the central free list's), in a transfer cache, in a CPU's slab, in a thread cache; the rest the program holds.

A span keeps its free objects as a bitmap (objects of 64 bytes and more) or as 8-byte-unit indexes: a cache of up
to 8, then a chain of free objects, each holding the next one's index and, after it, the indexes of more free
objects (the first as many as the span's count says, the others full).  A span of one object (the largest
classes) is never cut: its object is out, in use or in a cache.  Each cached pointer must be an object of its
class; a pointer that is not, or an object found in two places, is a finding at the word that holds it, and the
objects of that class are then unknown (neither in use nor free: the leak scan takes them as roots)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.gtcmalloc.decode import GtcState
from heapwalk.gtcmalloc.layout import PAGE, GtcLayout
from heapwalk.gtcmalloc.pageheaps import KIND
from heapwalk.gtcmalloc.sampled import read_sampled
from heapwalk.inferior.memory import Memory, ReadError, u64

__all__ = ["Objects", "object_places", "IN_USE", "CENTRAL", "TRANSFER", "CPU", "THREAD", "PROXY", "PLACES"]

IN_USE, CENTRAL, TRANSFER, CPU, THREAD, PROXY = range(6)
PLACES = ("in use", "on its span's free list", "in a transfer cache", "in a CPU's slab", "in a thread cache",
          "a sampled allocation's proxy")
#: objects of this size and more are kept free in a bitmap; an index counts 8-byte units; the end of a chain
BITMAP_MIN, UNIT, LIST_END = 64, 8, 0xFFFF


@dataclass(frozen=True)
class Objects:
    """The live spans cut into objects, by first page (arrays, one entry per span), and each object's place."""

    rows: np.ndarray            # each span's row in `GtcState.spans`
    start: np.ndarray           # uint64: its first byte
    size: np.ndarray            # int64: its objects' size
    count: np.ndarray           # int64: its objects
    size_class: np.ndarray
    first: np.ndarray           # int64: its first object's index in PLACE
    place: np.ndarray           # uint8: each object's place (IN_USE ... THREAD)
    broken: frozenset           # size classes whose objects' places are not known
    findings: tuple

    def addresses(self) -> np.ndarray:
        """Every object's address, in PLACE's order."""
        index = np.arange(len(self.place), dtype=np.int64) - np.repeat(self.first, self.count)
        return np.repeat(self.start, self.count) + (index * np.repeat(self.size, self.count)).astype(np.uint64)

    def span_of(self, addresses: np.ndarray) -> np.ndarray:
        """The span (index into these arrays) each of ADDRESSES lies in, -1 for none."""
        if not len(self.start):
            return np.full(len(np.atleast_1d(addresses)), -1, dtype=np.int64)
        at = np.searchsorted(self.start, np.asarray(addresses, dtype=np.uint64), side="right") - 1
        inside = (at >= 0) & (np.asarray(addresses, dtype=np.uint64) <
                              self.start[np.maximum(at, 0)] + (self.count * self.size)[np.maximum(at, 0)].astype(
                                  np.uint64))
        return np.where(inside, at, -1)


def object_places(mem: Memory, state: GtcState) -> Objects:
    """The objects of STATE's live spans and their places, walked (`Objects`)."""
    spans, L = state.spans, state.located.layout
    classes = {c.index: c for c in state.classes}
    rows = np.array([r for r in range(len(spans)) if spans.size_class[r] and not spans.sampled[r]
                     and int(spans.size_class[r]) in classes], dtype=np.int64) if spans is not None else \
        np.zeros(0, dtype=np.int64)
    rows = rows[np.argsort(spans.first_page[rows], kind="stable")] if len(rows) else rows
    size_class = spans.size_class[rows].astype(np.int64) if len(rows) else np.zeros(0, dtype=np.int64)
    size = np.array([classes[int(c)].size for c in size_class.tolist()], dtype=np.int64)
    count = np.array([classes[int(c)].objects_per_span for c in size_class.tolist()], dtype=np.int64)
    start = (spans.first_page[rows] * np.uint64(PAGE)).astype(np.uint64) if len(rows) else np.zeros(0, np.uint64)
    first = np.cumsum(count) - count
    walk = _Walk(mem, L, Objects(rows, start, size, count, size_class, first, np.zeros(int(count.sum()), np.uint8),
                                 frozenset(), ()))
    if spans is None:
        return walk.objects              # no page map: no span, no object to place
    for k in range(len(rows)):
        if count[k] > 1 and int(spans.allocated[rows[k]]) < count[k]:
            walk.span(k, int(spans.address[rows[k]]), int(spans.allocated[rows[k]]))
    walk.transfer(state)
    walk.slabs(state)
    walk.threads(state)
    walk.proxies(state)
    o = walk.objects
    return Objects(o.rows, o.start, o.size, o.count, o.size_class, o.first, walk.place, frozenset(walk.broken),
                   tuple(walk.findings))


class _Walk:
    """The walks of the free objects, marking each object's place."""

    def __init__(self, mem: Memory, L: GtcLayout, objects: Objects):
        self.mem, self.L, self.objects = mem, L, objects
        self.place = objects.place
        self.broken: set[int] = set()
        self.findings: list[Finding] = []

    def mark(self, pointers: list[int], holders: list[int], size_class: int, where: int) -> None:
        """POINTERS (held at HOLDERS) as objects of SIZE_CLASS free in WHERE; any that is no object of its class,
        or is already free elsewhere, is a finding at its holder, and its class broken."""
        o = self.objects
        if not pointers:
            return
        at = np.array(pointers, dtype=np.uint64)
        span = o.span_of(at)
        ok = span >= 0
        offset = np.where(ok, (at - o.start[np.maximum(span, 0)]).astype(np.int64), 0)
        ok &= (o.size_class[np.maximum(span, 0)] == size_class) & (offset % np.maximum(o.size[np.maximum(span, 0)],
                                                                                        1) == 0)
        index = o.first[np.maximum(span, 0)] + offset // np.maximum(o.size[np.maximum(span, 0)], 1)
        for k in np.nonzero(~ok)[0][:1].tolist():
            self._bad(holders[k], f"it holds {pointers[k]:#x}, which is no object of size class {size_class}",
                      size_class)
        found, index = at[ok], index[ok]
        again = self.place[index] != IN_USE
        _, firsts = np.unique(index, return_index=True)
        again[np.setdiff1d(np.arange(len(index)), firsts)] = True
        if again.any():
            k = int(np.argmax(again))
            self.findings.append(Finding(Severity.ERROR, int(found[k]), f"an object of size class {size_class}",
                                         f"it is free in two places ({PLACES[int(self.place[index[k]]) or where]} "
                                         f"and {PLACES[where]})", Kind.DOUBLE_FREE))
            self.broken.add(size_class)
        self.place[index] = where

    def _bad(self, holder: int, message: str, size_class: int) -> None:
        self.findings.append(Finding(Severity.ERROR, holder, f"a free object of size class {size_class}", message,
                                     KIND))
        self.broken.add(size_class)

    def span(self, k: int, address: int, allocated: int) -> None:
        """Span K's own free objects (bitmap, or cache and chain), against its count of objects handed out."""
        o, L = self.objects, self.L
        size, count, start = int(o.size[k]), int(o.count[k]), int(o.start[k])
        try:
            raw = self.mem.read(address, 64)
            free = _bitmap(raw, L) if size >= BITMAP_MIN else self._chain(raw, start, size, count)
        except ReadError as exc:
            self._bad(exc.address, "its span's free list cannot be read", int(o.size_class[k]))
            return
        if free is None or len(free) != count - allocated or len(set(free)) != len(free) \
                or any(not 0 <= i < count for i in free):
            self.findings.append(Finding(Severity.ERROR, address + L.span_allocated, f"a span of size class "
                                         f"{int(o.size_class[k])}", f"its free list holds "
                                         f"{'no readable list' if free is None else len(free)} objects, of {count}, "
                                         f"and it says {allocated} are handed out", KIND))
            self.broken.add(int(o.size_class[k]))
            return
        self.place[int(o.first[k]) + np.array(free, dtype=np.int64)] = CENTRAL

    def _chain(self, raw: bytes, start: int, size: int, count: int) -> list[int] | None:
        """The objects of a span's index cache and its chain of free objects (None: not a chain)."""
        L, units = self.L, size // UNIT
        cached = raw[L.span_cache_size] & 0xF
        indexes = list(struct.unpack_from(f"<{cached}H", raw, L.span_cache))
        host, embedded = struct.unpack_from("<H", raw, L.span_freelist)[0], \
            struct.unpack_from("<H", raw, L.span_embed_count)[0]
        while host != LIST_END and len(indexes) <= count:
            words = struct.unpack(f"<{embedded + 1}H", self.mem.read(start + host * UNIT, 2 * (embedded + 1)))
            indexes += [host, *words[1:]]
            host, embedded = words[0], size // 2 - 1
        if host != LIST_END or any(i % units for i in indexes):
            return None
        return [i // units for i in indexes]

    def transfer(self, state: GtcState) -> None:
        L = self.L
        for c in state.classes:
            if not c.transfer_objects:
                continue
            entry = state.located.transfer + c.index * L.tc_stride
            try:
                slots = u64(self.mem, entry + L.tc_slots)
                held = list(struct.unpack(f"<{c.transfer_objects}Q", self.mem.read(slots, 8 * c.transfer_objects)))
            except ReadError as exc:
                self._bad(exc.address, "its transfer cache's slots cannot be read", c.index)
                continue
            self.mark(held, [slots + 8 * i for i in range(len(held))], c.index, TRANSFER)

    def slabs(self, state: GtcState) -> None:
        L, base = self.L, state.located.cpu_cache
        if base is None or not state.cpus:
            return
        begins = struct.unpack(f"<{L.classes}H", self.mem.read(u64(self.mem, base + L.cpu_begins), 2 * L.classes))
        for slab in state.cpus:
            headers = struct.unpack(f"<{L.classes}I", self.mem.read(slab.address, 4 * L.classes))
            for c in state.classes:
                n = (headers[c.index] & 0xFFFF) - begins[c.index]
                if c.cpu_objects and n > 0:
                    at = slab.address + 8 * begins[c.index]
                    held = list(struct.unpack(f"<{n}Q", self.mem.read(at, 8 * n)))
                    self.mark(held, [at + 8 * i for i in range(n)], c.index, CPU)

    def threads(self, state: GtcState) -> None:
        for cache in state.threads:
            for c in state.classes:
                head = cache.address + 24 * c.index
                try:
                    link, length = u64(self.mem, head), struct.unpack("<I", self.mem.read(head + 8, 4))[0]
                    held, holders = [], []
                    while link and len(held) < length:
                        held.append(link)
                        holders.append(head if len(holders) == 0 else held[-2])
                        link = u64(self.mem, link)
                except ReadError as exc:
                    self._bad(exc.address, "a thread cache's list cannot be read", c.index)
                    continue
                if len(held) != length:
                    self._bad(head + 8, f"its thread cache's list holds {len(held)} objects, its count says {length}",
                              c.index)
                self.mark(held, holders, c.index, THREAD)


    def proxies(self, state: GtcState) -> None:
        """The objects that stand in for sampled allocations (tcmalloc's own: in use, and the program's data in
        them is stale), from each live sampled span's SampledAllocation."""
        sampled, findings = read_sampled(self.mem, self.L, state.spans)
        self.findings.extend(findings)
        for s in sampled:
            if s.proxy:
                span = int(self.objects.span_of(np.array([s.proxy], dtype=np.uint64))[0])
                size_class = int(self.objects.size_class[span]) if span >= 0 else 0
                self.mark([s.proxy], [s.record + self.L.sampled_proxy], size_class, PROXY)


def _bitmap(raw: bytes, L: GtcLayout) -> list[int]:
    """The free objects a span's bitmap marks."""
    low, high = struct.unpack_from("<QQ", raw, L.span_cache)
    bits = low | high << 64
    return [i for i in range(128) if bits >> i & 1]
