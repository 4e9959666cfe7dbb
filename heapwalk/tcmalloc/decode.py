"""tcmalloc's state read where discovery found it: the size map, the page heap's statistics, each class's
central free list and transfer cache, each thread's cache; and the figures its MallocExtension statistics
give, computed as it computes them."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Sequence
import numpy as np

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.inferior.memory import Memory, ReadError, u64
from heapwalk.inferior.residency import Residency
from heapwalk.tcmalloc.discovery import TcDiscovery
from heapwalk.tcmalloc.spans import Spans, TcSpan, columns, read_spans

__all__ = ["TcClass", "TcSpan", "TcThread", "TcState", "decode_tcmalloc", "STATS_FIELDS", "IN_USE", "NORMAL",
           "RETURNED"]

#: the page heap's statistics, in their order
STATS_FIELDS = ("system_bytes", "free_bytes", "unmapped_bytes", "committed_bytes", "scavenge_count", "commit_count",
                "total_commit_bytes", "decommit_count", "total_decommit_bytes", "reserve_count",
                "total_reserve_bytes")
#: a span's location: in use, free (its pages resident unless the kernel dropped them), free and given back
IN_USE, NORMAL, RETURNED = 0, 1, 2
#: thread caches followed at most (a list longer than this is damaged)
_MAX_THREADS = 1 << 16


@dataclass(frozen=True)
class TcClass:
    """One size class: its size, pages per span, objects moved at once; what its central free list holds (free
    objects, spans) and its transfer cache (batches), and the objects the thread caches hold."""

    index: int
    size: int
    pages: int
    move: int
    central_objects: int
    spans: int
    transfer_batches: int
    thread_objects: int

    def central_bytes(self, page_size: int) -> int:
        """The central list's free objects and what its spans lose to rounding (OverheadBytes); a damaged
        counter counts as none."""
        if self.size <= 0:
            return 0
        return self.size * max(self.central_objects, 0) + max(self.spans, 0) * (
            (max(self.pages, 0) * page_size) % self.size)

    @property
    def transfer_bytes(self) -> int:
        return max(self.size, 0) * max(self.move, 0) * max(self.transfer_batches, 0)


@dataclass(frozen=True)
class TcThread:
    """One thread's cache: where it is, the thread (its pthread_t; None where the cache does not keep it, from
    2.16), the bytes it holds."""

    address: int
    tid: int | None
    size: int
    max_size: int = 0            # its limit (max_size_), which grows by stealing from the others
    objects: int = 0             # the free objects it holds, all classes
    lists: tuple[tuple[int, int, int], ...] = ()   # each class it holds objects of: (class, list head, length)


@dataclass(frozen=True)
class TcState:
    """tcmalloc in one target."""

    target: str
    discovery: TcDiscovery
    stats: dict
    classes: tuple[TcClass, ...]
    threads: tuple[TcThread, ...]
    spans: Sequence[TcSpan] = ()              # every span the page map names (`spans.Spans`)
    metadata: int | None = None               # bytes tcmalloc took from the system for its own use
    overall: int | None = None                # the thread caches' total limit
    findings: tuple[Finding, ...] = field(default=())
    residency: Residency | None = None        # which pages were in RAM, when the target says
    leaves: tuple[int, ...] = ()              # the page map's leaves (each of pagemap_leaf words)
    metadata_next: int | None = None          # the metadata allocator's next free byte (its current chunk's end)

    @property
    def page_size(self) -> int:
        return self.discovery.page_size

    def class_sizes(self) -> np.ndarray:
        """The object size of each size class a Span may name (int64, by its byte; 0 where none)."""
        sizes = np.zeros(256, dtype=np.int64)
        for c in self.classes:
            if c.index and c.size > 0 and c.index < 256:
                sizes[c.index] = c.size
        return sizes

    def span_bytes(self, location: int) -> int:
        """Bytes of the spans at LOCATION (IN_USE, NORMAL, RETURNED)."""
        spans = columns(self.spans)
        return int(spans.pages[spans.location == location].sum()) * self.page_size

    def resident(self, location: int | None = None) -> int | None:
        """Bytes in RAM of the spans at LOCATION (None: every span); None when the target cannot say."""
        if self.residency is None:
            return None
        spans = columns(self.spans)
        starts, ends = spans.starts_ends(self.page_size)
        if location is not None:
            starts, ends = starts[spans.location == location], ends[spans.location == location]
        return self.residency.resident_sum(starts, ends) if len(starts) else 0

    def properties(self) -> dict:
        """The figures MallocExtension_GetNumericProperty gives, by its names."""
        central = sum(c.central_bytes(self.page_size) for c in self.classes if c.index)
        transfer = sum(c.transfer_bytes for c in self.classes if c.index)
        thread = sum(max(t.size, 0) for t in self.threads)
        s = self.stats
        return {"generic.current_allocated_bytes": max(s["system_bytes"] - thread - central - transfer
                                                       - s["free_bytes"] - s["unmapped_bytes"], 0),
                "generic.heap_size": s["system_bytes"],
                "tcmalloc.pageheap_free_bytes": s["free_bytes"],
                "tcmalloc.pageheap_unmapped_bytes": s["unmapped_bytes"],
                "tcmalloc.central_cache_free_bytes": central,
                "tcmalloc.transfer_cache_free_bytes": transfer,
                "tcmalloc.thread_cache_free_bytes": thread,
                "tcmalloc.current_total_thread_cache_bytes": thread,
                "tcmalloc.slack_bytes": s["free_bytes"] + s["unmapped_bytes"],
                "tcmalloc.pageheap_committed_bytes": s["committed_bytes"],
                "tcmalloc.aggressive_memory_decommit": s["aggressive_decommit"],
                **({"generic.total_physical_bytes": s["system_bytes"] + self.metadata - s["unmapped_bytes"]}
                   if self.metadata is not None else {}),
                **({"tcmalloc.max_total_thread_cache_bytes": self.overall} if self.overall is not None else {})}


def decode_tcmalloc(mem: Memory, found: TcDiscovery, description: str, residency: Residency | None = None
                    ) -> TcState:
    """tcmalloc's state where FOUND says it is (RESIDENCY: which pages of the target were in RAM, if known)."""
    findings: list[Finding] = []
    stats = dict(zip(STATS_FIELDS, struct.unpack(f"<{len(STATS_FIELDS)}Q",
                                                 mem.read(found.stats, 8 * len(STATS_FIELDS)))))
    stats["aggressive_decommit"] = mem.read(found.stats + found.layout.aggressive_after_stats, 1)[0]
    threads, cached = _threads(mem, found, findings)
    classes = _classes(mem, found, cached)
    if found.thread_heaps is None and dict(found.facts).get("thread caches", "").startswith("none found") and any(
            c.spans for c in classes if c.index):
        findings.append(Finding(Severity.ERROR, 0, "thread cache", "no thread cache was found by its shape, though "
                                "a stripped tcmalloc's process normally has one per thread that allocated: the first "
                                "may be damaged or missing from the core, and the objects the caches hold, if any, "
                                "count as in use", Kind.TCACHE))
    metadata, overall = (_word(mem, at) for at in (found.metadata, found.overall))
    after = _metadata_next(mem, found.metadata)
    spans, leaves = _spans(mem, found, findings)
    page = found.page_size
    known = residency.covering(zip(*(x.tolist() for x in spans.starts_ends(page)))) if residency else None
    return TcState(description, found, stats, classes, tuple(threads), spans, metadata,
                   overall, tuple(findings), known, leaves, after)


def _metadata_next(mem: Memory, counter: int | None) -> int | None:
    """The metadata allocator's next free byte, the static before its COUNTER (with the bytes left, the static
    before it, it ends a chunk on a page boundary); None when that shape is not there."""
    if counter is None:
        return None
    try:
        avail, after = struct.unpack("<QQ", mem.read(counter - 16, 16))
    except ReadError:
        return None
    return after if after and (after + avail) & 0xFFF == 0 and avail <= 8 << 20 else None


def _word(mem: Memory, at: int | None) -> int | None:
    """The 8-byte word at AT (None when AT is, or it cannot be read)."""
    if at is None:
        return None
    try:
        return u64(mem, at)
    except ReadError:
        return None


def _spans(mem: Memory, found: TcDiscovery, findings: list[Finding]) -> tuple[Spans, tuple[int, ...]]:
    """Every span of the page heap, walked as tcmalloc walks its page map: at each page that names a span
    starting there, that span, then on past its last page (a free span names only its ends: the pages inside
    may still name the spans merged into it); sorted.  And the page map's leaves that could be read."""
    lay = found.layout
    root_at = found.free_lists - lay.pagemap_before_free
    try:
        root = np.frombuffer(mem.read(root_at, 8 * lay.pagemap_root), dtype=np.uint64)
    except ReadError:
        findings.append(Finding(Severity.ERROR, root_at, "page map", "tcmalloc's page map cannot be read: its "
                                "spans are not known", Kind.UNMAPPED))
        return Spans.of(()), ()
    pages: list[np.ndarray] = []                 # every page that names a span, and that span
    named: list[np.ndarray] = []
    leaves: list[int] = []
    for r in np.flatnonzero(root).tolist():
        leaf = int(root[r])
        try:
            values = np.frombuffer(mem.read(leaf, 8 * lay.pagemap_leaf), dtype=np.uint64)
        except ReadError:
            findings.append(Finding(Severity.ERROR, leaf, "page map", "a leaf of tcmalloc's page map cannot be "
                                    "read: the spans it names are left out", Kind.UNMAPPED))
            continue
        leaves.append(leaf)
        at = np.flatnonzero(values)
        pages.append(at.astype(np.uint64) + np.uint64(r * lay.pagemap_leaf))
        named.append(values[at])
    if not pages:
        return Spans.of(()), tuple(leaves)
    return read_spans(mem, np.concatenate(pages), np.concatenate(named)), tuple(leaves)


def _classes(mem: Memory, found: TcDiscovery, cached: np.ndarray) -> tuple[TcClass, ...]:
    """Each class: the size map's figures, its central list's and transfer cache's, the thread caches'."""
    lay, n = found.layout, found.classes
    sizes = np.frombuffer(mem.read(found.sizemap, 4 * n), dtype=np.int32)
    moves = np.frombuffer(mem.read(found.sizemap - lay.sizemap_move_before, 4 * n), dtype=np.int32)
    pages_at = (found.sizemap + lay.sizemap_pages_after + 7) & ~7
    pages = np.frombuffer(mem.read(pages_at, 8 * n), dtype=np.uint64)
    out = []
    for k in range(n):
        entry = found.central + k * lay.central_stride
        spans, counter = struct.unpack("<QQ", mem.read(entry + lay.central_num_spans, 16))
        used, = struct.unpack("<i", mem.read(entry + lay.central_used_slots, 4))
        out.append(TcClass(k, int(sizes[k]), int(pages[k]), int(moves[k]), counter, spans, used, int(cached[k])))
    return tuple(out)


def _threads(mem: Memory, found: TcDiscovery, findings: list[Finding]) -> tuple[list[TcThread], np.ndarray]:
    """The thread caches, from the list's head, and the objects they hold per class."""
    lay = found.layout
    cached = np.zeros(lay.classes_max, dtype=np.int64)
    out, seen, at = [], set(), found.thread_heaps
    while at:
        if at in seen or len(out) >= _MAX_THREADS:
            findings.append(Finding(Severity.ERROR, at, "thread cache", "the list of thread caches loops back on "
                                    "itself", Kind.LIST_CYCLE))
            break
        seen.add(at)
        try:
            data = mem.read(at, lay.thread_prev + 8)
        except ReadError:
            findings.append(Finding(Severity.ERROR, at, "thread cache", "a thread cache of tcmalloc's list "
                                    "cannot be read: the caches after it are left out", Kind.UNMAPPED))
            break
        entries = data[:lay.classes_max * lay.thread_list_entry]
        lists = np.frombuffer(entries, dtype=np.uint32).reshape(
            lay.classes_max, lay.thread_list_entry // 4)[:, lay.thread_list_length // 4]
        heads = np.frombuffer(entries, dtype=np.uint64).reshape(lay.classes_max, lay.thread_list_entry // 8)[:, 0]
        cached += lists.astype(np.int64)
        size, = struct.unpack_from("<i", data, lay.thread_size)
        limit, = struct.unpack_from("<i", data, lay.thread_max_size)
        tid = struct.unpack_from("<Q", data, lay.thread_tid)[0] if lay.thread_tid is not None else None
        held = tuple((k, int(heads[k]), int(lists[k])) for k in np.flatnonzero(lists).tolist())
        out.append(TcThread(at, tid, size, limit, int(lists.sum()), held))
        at, = struct.unpack_from("<Q", data, lay.thread_next)
    return out, cached
