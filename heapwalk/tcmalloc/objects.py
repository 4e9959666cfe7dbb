"""tcmalloc's objects one by one: which spans hold objects of which class, where each free object is (a thread's
cache, a transfer cache's batch, its span's own list in a central free list), and so which objects the program
holds.

A span in use with a size class is cut into objects of the class's size from its first byte (the rest of its
pages is lost to rounding); its refcount counts the objects taken out of it, to the program or to a cache, and
its list holds the others.  The caches' lists and the transfer cache's batches are linked through each free
object's first word.  Each walk stops where damage starts and says so at the address."""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass

import numpy as np

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.inferior.slots import CUT, OUTSIDE, TWICE, slot_list
from heapwalk.inferior.memory import Memory, ReadError, hop_u64, links_from, read_once
from heapwalk.tcmalloc.decode import IN_USE, TcState
from heapwalk.tcmalloc.spans import columns

__all__ = ["SpanTable", "Cached", "cached_objects", "span_free_objects", "span_list", "THREAD", "TRANSFER", "CENTRAL", "PLACES"]

#: where a free object is
THREAD, TRANSFER, CENTRAL = 0, 1, 2
PLACES = ("a thread cache", "a transfer cache", "its span's free list (central cache)")


@dataclass(frozen=True)
class SpanTable:
    """The page heap's spans as arrays, in address order: where each starts and ends, its state, its size class,
    the size and number of its objects (0 for a span that is not cut into objects), its refcount and the head
    of its free list."""

    start: np.ndarray        # uint64
    end: np.ndarray          # uint64
    location: np.ndarray     # uint8
    size_class: np.ndarray   # uint8
    size: np.ndarray         # int64: the object size (0: not cut)
    count: np.ndarray        # int64: objects it is cut into
    refcount: np.ndarray     # uint16
    objects: np.ndarray      # uint64
    header: np.ndarray       # uint64: its Span's address

    @classmethod
    def of(cls, state: TcState) -> "SpanTable":
        """STATE's spans; a span in use counts as cut into objects when its class is one of the size map's.  The
        columns the spans keep are the table's own (none copied: a million spans' copies would cost 28 MiB)."""
        spans = columns(state.spans)
        start, end = spans.starts_ends(state.page_size)
        size = np.where((spans.location == IN_USE) & ~spans.sampled, state.class_sizes()[spans.size_class], 0)
        count = np.where(size > 0, (end - start).astype(np.int64) // np.maximum(size, 1), 0)
        return cls(start, end, spans.location, spans.size_class, size, count, spans.refcount, spans.objects,
                   spans.header)

    def __len__(self) -> int:
        return len(self.start)

    def rows(self, addresses: np.ndarray) -> np.ndarray:
        """The span holding each of ADDRESSES (-1: none)."""
        rows = np.searchsorted(self.start, addresses, side="right") - 1
        inside = (rows >= 0) & (addresses < self.end[np.maximum(rows, 0)])
        return np.where(inside, rows, -1)

    def small(self) -> np.ndarray:
        """The rows of the spans cut into objects."""
        return np.flatnonzero(self.size > 0)

    def large(self) -> np.ndarray:
        """The rows of the spans in use that each hold one allocation (large, or sampled)."""
        return np.flatnonzero((self.location == IN_USE) & (self.size == 0))


@dataclass(frozen=True)
class Cached:
    """The free objects tcmalloc's caches hold outside their spans: their addresses, where (THREAD, TRANSFER),
    whose (the thread cache's place in the list, or the class of the transfer cache) and their class; the classes
    whose lists broke off (which of their objects are free is then not known)."""

    address: np.ndarray      # uint64
    place: np.ndarray        # uint8
    owner: np.ndarray        # unsigned, as narrow as its values allow: a thread's place in the list, or a class
    size_class: np.ndarray   # unsigned, as narrow as its values allow
    broken: frozenset = frozenset()


class _Locator:
    """Whether an address is an object boundary in a span of a class, without numpy's cost per call."""

    def __init__(self, table: SpanTable):
        self.table = table
        self.starts = table.start.tolist()
        self.ends = table.end.tolist()
        self.classes = table.size_class.tolist()
        self.sizes = table.size.tolist()
        self.counts = table.count.tolist()

    def fits(self, address: int, size_class: int) -> bool:
        row = bisect.bisect_right(self.starts, address) - 1
        if row < 0 or address >= self.ends[row] or self.classes[row] != size_class or not self.sizes[row]:
            return False
        offset = address - self.starts[row]
        return offset % self.sizes[row] == 0 and offset // self.sizes[row] < self.counts[row]


    def fits_all(self, addresses: np.ndarray, size_class: int) -> np.ndarray:
        """`fits` of each of ADDRESSES (uint64) at once."""
        t = self.table
        row = np.searchsorted(t.start, addresses, side="right") - 1
        ok = row >= 0
        row = np.maximum(row, 0)
        size = np.maximum(t.size[row], 1).astype(np.uint64)
        offset = addresses - t.start[row]
        return ok & (addresses < t.end[row]) & (t.size_class[row] == size_class) & (t.size[row] > 0) & \
            (offset % size == 0) & (offset // size < t.count[row].astype(np.uint64))


def _sound(where: _Locator, links: list[int], count: int, size_class: int) -> int:
    """How many of the first nodes of LINKS (`links_from`: the nodes, then the link after the last) `_follow` takes
    as they are: none null, none met before, each an object of SIZE_CLASS; COUNT at most."""
    nodes = np.array(links[:min(count, len(links))], dtype=np.uint64)
    bad = (nodes == 0) | ~where.fits_all(nodes, size_class)
    order = np.argsort(nodes, kind="stable")
    again = order[1:][nodes[order[1:]] == nodes[order[:-1]]]       # each node met before, where met again
    first = min(int(np.argmax(bad)) if bad.any() else len(nodes), int(again.min()) if len(again) else len(nodes))
    return first


def _follow(mem: Memory, head: int, count: int, size_class: int, where: _Locator, at: int, structure: str,
            findings: list[Finding]) -> list[int]:
    """The COUNT objects of class SIZE_CLASS linked from HEAD (a list whose head word is at AT), as far as they
    are objects of that class; a finding where the list breaks off.  The part of the list the memory reads at once
    (`links_from`) is judged at once; the loop goes on from the first node it does not take."""
    links = links_from(mem, head, count) or [head]
    taken = _sound(where, links, count, size_class) if len(links) > 16 else 0
    out: list[int] = links[:taken]
    seen: set[int] = set(out)
    link = links[taken] if taken < len(links) else _hop(mem, out, count, structure, findings)
    while link is not None and len(out) < count:
        if link == 0:
            findings.append(Finding(Severity.ERROR, at, structure, f"a list of class {size_class} ends after "
                                    f"{len(out)} of the {count} objects it counts", Kind.TCACHE_COUNT,
                                    str(count), str(len(out))))
            break
        if link in seen:
            findings.append(Finding(Severity.ERROR, link, structure, f"a list of class {size_class} loops back "
                                    "on itself", Kind.LIST_CYCLE))
            break
        if not where.fits(link, size_class):
            findings.append(Finding(Severity.ERROR, link, structure, f"a list of class {size_class} leads to an "
                                    "address that is no object of that class in the page heap", Kind.OTHER))
            break
        seen.add(link)
        out.append(link)
        link = links[len(out)] if len(out) < len(links) else _hop(mem, out, count, structure, findings)
    else:
        if link is not None:
            _ends(link, seen, out, size_class, at, structure, findings)
    return out


def _hop(mem: Memory, out: list[int], count: int, structure: str, findings: list[Finding]) -> int | None:
    """The link of the last of OUT, read on its own; None (and a finding, unless OUT holds COUNT already) where it
    cannot be read."""
    try:
        return hop_u64(mem, out[-1])
    except ReadError:
        if len(out) < count:
            findings.append(Finding(Severity.ERROR, out[-1], structure, "a free object cannot be read: the "
                                    "list after it is left out", Kind.UNMAPPED))
        return None


def _ends(link: int, seen: set[int], out: list[int], size_class: int, at: int, structure: str,
          findings: list[Finding]) -> None:
    """A finding unless LINK, the link of a list's last counted object, ends the list: tcmalloc's lists end
    with a null link (a batch popped is cut off, a list pushed onto an empty one inherits its null)."""
    if not out or link == 0:
        return
    if link in seen:
        findings.append(Finding(Severity.ERROR, link, structure, f"a list of class {size_class} loops back on "
                                "itself", Kind.LIST_CYCLE))
    else:
        findings.append(Finding(Severity.ERROR, at, structure, f"a list of class {size_class} goes on past the "
                                f"{len(out)} objects it counts (the last, {out[-1]:#x}, links to {link:#x})",
                                Kind.TCACHE_COUNT, str(len(out)), "more"))


def cached_objects(mem: Memory, state: TcState, table: SpanTable) -> tuple[Cached, list[Finding]]:
    """Every object each thread cache's lists and each transfer cache's batches hold, walked, and what broke."""
    findings: list[Finding] = []
    where = _Locator(table)
    address: list[int] = []
    place: list[int] = []
    owner: list[int] = []
    klass: list[int] = []
    broken: set[int] = set()

    def add(objects: list[int], p: int, o: int, k: int) -> None:
        if len(findings) > found[0]:
            broken.add(k)
            found[0] = len(findings)
        address.extend(objects)
        place.extend([p] * len(objects))
        owner.extend([o] * len(objects))
        klass.extend([k] * len(objects))

    found = [0]
    lay = state.discovery.layout
    for n, t in enumerate(state.threads):
        for k, head, length in t.lists:
            at = t.address + k * lay.thread_list_entry
            add(_follow(mem, head, length, k, where, at, "thread cache", findings), THREAD, n, k)
    for c in state.classes:
        if not c.index or not 0 < c.transfer_batches <= lay.transfer_entries or c.move <= 0:
            continue
        slots = state.discovery.central + c.index * lay.central_stride + lay.central_slots
        try:
            heads = struct.unpack(f"<{2 * c.transfer_batches}Q", mem.read(slots, 16 * c.transfer_batches))[::2]
        except ReadError:
            findings.append(Finding(Severity.ERROR, slots, "transfer cache", f"class {c.index}'s transfer cache "
                                    "cannot be read", Kind.UNMAPPED))
            broken.add(c.index)
            found[0] = len(findings)
            continue
        for j, head in enumerate(heads):
            add(_follow(mem, head, c.move, c.index, where, slots + 16 * j, "transfer cache", findings),
                TRANSFER, c.index, c.index)
    cached = Cached(np.array(address, dtype=np.uint64), np.array(place, dtype=np.uint8), _narrow(owner),
                    _narrow(klass))
    twice = _twice(cached)
    broken |= {int(k) for k in cached.size_class[np.isin(cached.address, twice)].tolist()}
    findings += [Finding(Severity.ERROR, a, "thread cache", "a free object is held twice by tcmalloc's caches",
                         Kind.DOUBLE_FREE) for a in twice[:100].tolist()]
    return Cached(cached.address, cached.place, cached.owner, cached.size_class, frozenset(broken)), findings


def _narrow(values: list[int]) -> np.ndarray:
    """VALUES (none negative) in the narrowest unsigned type that holds them all."""
    return np.array(values, dtype=np.min_scalar_type(max(values, default=0)))


def _twice(cached: Cached) -> np.ndarray:
    """The objects two caches (or one twice) hold."""
    values, counts = np.unique(cached.address, return_counts=True)
    return values[counts > 1]


def span_free_objects(mem: Memory, table: SpanTable, row: int, findings: list[Finding]) -> np.ndarray | None:
    """The objects on span ROW's own free list (its Span's objects), read from the span's pages in one piece;
    None when the list is damaged (a finding says where)."""
    start, size, count = int(table.start[row]), int(table.size[row]), int(table.count[row])
    try:
        data = read_once(mem, start, count * size) if count * size else b""
    except ReadError:
        data = None
    slots = span_list(table, row, data, np.zeros(count, dtype=np.uint8), findings)
    return None if slots is None else np.uint64(start) + slots.astype(np.uint64) * np.uint64(size)


def span_list(table: SpanTable, row: int, data: bytes | None, seen: np.ndarray, findings: list[Finding]
              ) -> np.ndarray | None:
    """The slots on span ROW's own free list (uint32 indexes), walked through DATA (the bytes of its objects; None
    when they cannot be read) and marked in SEEN (uint8, one a slot of it); None when the list is damaged (a
    finding says where)."""
    start, size, count = int(table.start[row]), int(table.size[row]), int(table.count[row])
    header = int(table.header[row])
    expected = count - int(table.refcount[row])
    if expected < 0:
        findings.append(Finding(Severity.ERROR, header, "span", f"a span of class {int(table.size_class[row])} "
                                "counts more objects taken out of it than it holds", Kind.OTHER,
                                f"at most {count}", str(int(table.refcount[row]))))
        return None
    link = int(table.objects[row])
    if link == 0:
        if expected:
            findings.append(Finding(Severity.ERROR, header, "span", "a span's free list is empty, but its refcount "
                                    "leaves objects free", Kind.TCACHE_COUNT, str(expected), "0"))
            return None
        return np.zeros(0, dtype=np.uint32)
    if data is None:
        findings.append(Finding(Severity.ERROR, start, "span", "a span's pages cannot be read: its free list is not "
                                "known", Kind.UNMAPPED))
        return None
    walked = slot_list(data, start, size, count, link, seen)
    if walked.stop == OUTSIDE:
        findings.append(Finding(Severity.ERROR, walked.at, "span", "a span's free list leads out of its objects",
                                Kind.OTHER, f"an object in {start:#x}-{start + count * size:#x}"))
        return None
    if walked.stop == TWICE:
        findings.append(Finding(Severity.ERROR, walked.at, "span", "a span's free list loops back on itself",
                                Kind.LIST_CYCLE))
        return None
    if walked.stop == CUT:
        findings.append(Finding(Severity.ERROR, walked.at, "span", "a free object cannot be read", Kind.UNMAPPED))
        return None
    if len(walked.slots) != expected:
        findings.append(Finding(Severity.ERROR, header, "span", "a span's free list does not hold the objects its "
                                "refcount leaves free", Kind.TCACHE_COUNT, str(expected), str(len(walked.slots))))
        return None
    return walked.slots
