"""Google's tcmalloc decoded from its static objects (`gtcmalloc.find`): every size class's central free list and
transfer cache, every CPU's slab, every thread cache, every huge-page-aware allocator of its page allocator, and
the figures MallocExtension computes from them, by its own names."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.gtcmalloc.find import GtcUnknown, Located
from heapwalk.gtcmalloc.layout import PAGE, GtcLayout
from heapwalk.gtcmalloc.pagemap import ROOT_LENGTH, Spans, read_spans
from heapwalk.gtcmalloc.pageheaps import KIND, PageHeap, read_allocator, read_heaps
from heapwalk.gtcmalloc.threads import ThreadCache, read_threads, thread_list
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["SizeClass", "CpuSlab", "ThreadCache", "PageHeap", "GtcState", "decode_gtcmalloc", "thread_list"]


@dataclass(frozen=True)
class SizeClass:
    """One size class: its object size and spans, and its free objects by where they wait."""

    index: int
    size: int
    pages: int                  # pages per span
    objects_per_span: int
    spans: int                  # spans the central free list holds (requested less returned)
    central_objects: int        # free objects in those spans
    transfer_objects: int
    transfer_capacity: int
    cpu_objects: int = 0

    @property
    def overhead(self) -> int:
        """The bytes at the end of its spans that no object fits in."""
        return self.spans * (self.pages * PAGE % self.size) if self.size else 0


@dataclass(frozen=True)
class CpuSlab:
    """One CPU's slab of per-CPU caches: its objects and their bytes."""

    cpu: int
    address: int
    objects: int
    bytes: int


@dataclass
class GtcState:
    """Google's tcmalloc in one target."""

    target: str
    library: str
    located: Located
    classes: list[SizeClass]
    cpus: list[CpuSlab]
    cpu_count: int
    shift: int
    threads: list[ThreadCache]
    heaps: list[PageHeap]
    spans: Spans | None = None
    findings: list[Finding] = field(default_factory=list)
    allocator: dict = field(default_factory=dict)     # the page allocator's limits and peaks (`read_allocator`)
    arena_nonresident: int = 0                        # the metadata arena's bytes no longer resident
    cpu_limit: int = 0                                # the bytes a CPU's slab may hold (per-CPU caches on)

    @property
    def per_cpu(self) -> bool:
        return self.located.cpu_cache is not None

    def properties(self) -> dict[str, int]:
        """MallocExtension's numeric properties, as tcmalloc computes them from the same state."""
        central = sum(c.size * c.central_objects + c.overhead for c in self.classes)
        transfer = sum(c.size * c.transfer_objects for c in self.classes)
        cpu = sum(s.bytes for s in self.cpus)
        thread = sum(t.bytes for t in self.threads)
        system = sum(h.system for h in self.heaps)
        free = sum(h.free for h in self.heaps)
        unmapped = sum(h.unmapped for h in self.heaps)
        in_use = max(0, system - (central + transfer + cpu + thread + free + unmapped))
        a = self.allocator
        released = [sum(h.released[k] for h in self.heaps) * PAGE for k in range(5)]
        peak_sampled = a.get("peak_sampled", 0)
        return {"generic.current_allocated_bytes": in_use, "generic.bytes_in_use_by_app": in_use,
                "generic.heap_size": system - unmapped,
                "generic.peak_memory_usage": a.get("peak_backed", 0),      # GetNumericProperty's (not GetProperties')
                "generic.realized_fragmentation": _fragmentation(a.get("peak_backed", 0), peak_sampled),
                "tcmalloc.page_heap_free": free, "tcmalloc.pageheap_free_bytes": free,
                "tcmalloc.page_heap_unmapped": unmapped + self.arena_nonresident,
                "tcmalloc.pageheap_unmapped_bytes": unmapped,
                "tcmalloc.central_cache_free": central, "tcmalloc.transfer_cache_free": transfer,
                "tcmalloc.cpu_free": cpu, "tcmalloc.sharded_transfer_cache_free": 0,
                "tcmalloc.thread_cache_free": thread, "tcmalloc.current_total_thread_cache_bytes": thread,
                "tcmalloc.thread_cache_count": len(self.threads),
                "tcmalloc.per_cpu_caches_active": int(self.per_cpu), "tcmalloc.local_bytes": cpu + thread,
                "tcmalloc.slack_bytes": free + unmapped,
                "tcmalloc.hard_usage_limit_bytes": a.get("hard_limit", 0) & (2**64 - 1),
                "tcmalloc.desired_usage_limit_bytes": a.get("soft_limit", 0) & (2**64 - 1),
                "tcmalloc.soft_limit_hits": a.get("soft_hits", 0), "tcmalloc.hard_limit_hits": a.get("hard_hits", 0),
                "tcmalloc.successful_shrinks_after_soft_limit_hit": a.get("soft_shrinks", 0),
                "tcmalloc.successful_shrinks_after_hard_limit_hit": a.get("hard_shrinks", 0),
                "tcmalloc.num_released_total_bytes": released[0],
                "tcmalloc.num_released_release_memory_to_system_bytes": released[1],
                "tcmalloc.num_released_process_background_actions_bytes": released[2],
                "tcmalloc.num_released_soft_limit_exceeded_bytes": released[3],
                "tcmalloc.num_released_hard_limit_exceeded_bytes": released[4]}


def _fragmentation(backed: int, sampled: int) -> int:
    """generic.realized_fragmentation as tcmalloc computes it: 100 times the backed bytes' excess over the sampled
    ones (unsigned, so a deficit wraps) over the sampled ones, in doubles, cut to an integer."""
    if not sampled:
        return 0
    return int(100.0 * (float((backed - sampled) % (1 << 64)) / float(sampled))) % (1 << 64)


def decode_gtcmalloc(mem: Memory, located: Located, library: str, target: str,
                     threads: tuple[int | None, dict]) -> GtcState:
    """Everything LOCATED leads to in MEM; THREADS: the thread caches' list (`thread_list`).  Its static objects
    unreadable (a core cut short): GtcUnknown, in one line."""
    try:
        return _decode(mem, located, library, target, threads)
    except ReadError as exc:
        raise GtcUnknown(f"heapwalk: Google's tcmalloc's own state cannot be read at {exc.address:#x} (the core "
                         "lacks it): nothing of it can be told") from None


def _decode(mem: Memory, located: Located, library: str, target: str, threads: tuple[int | None, dict]) -> GtcState:
    L, findings = located.layout, []
    if located.sharded is not None and _q(mem, located.sharded + L.sharded_shards):
        raise GtcUnknown("heapwalk: this Google tcmalloc has its sharded transfer caches on, which heapwalk does "
                         "not decode yet: its figures would leave their objects out")
    classes = _classes(mem, located, findings)
    cpus, count, shift = _cpus(mem, located, classes, findings) if located.cpu_cache is not None else ([], 0, 0)
    if cpus:
        per_class = [0] * L.classes
        for slab in cpus:
            for c, n in slab.counts:
                per_class[c] += n
        classes = [SizeClass(**{**c.__dict__, "cpu_objects": per_class[c.index]}) for c in classes]
        cpus = [CpuSlab(s.cpu, s.address, s.objects, s.bytes) for s in cpus]
    arena = 0 if located.arena is None else _q(mem, located.arena + L.arena_nonresident)
    limit = 0 if located.cpu_cache is None else _q(mem, located.cpu_cache + L.cpu_max_size)
    return GtcState(target, library, located, classes, cpus, count, shift, read_threads(mem, located, threads, findings),
                    read_heaps(mem, located, findings), _spans(mem, located, findings), findings,
                    read_allocator(mem, located), arena, limit)


def _spans(mem: Memory, located: Located, findings: list) -> Spans | None:
    """Every span of the page map, when its root was found."""
    if located.pagemap is None:
        if located.probes:
            page, size_class = located.probes[0]
            findings.append(Finding(Severity.ERROR, page * PAGE, "the page map", f"no readable leaf says the size "
                                    f"class of page {page:#x} ({size_class}: an object of that class lies there): its "
                                    "root was not found, and its spans are not read", KIND))
        else:
            findings.append(Finding(Severity.WARNING, located.transfer, "the page map", "its root was not found (no "
                                    "transfer cache or central free list holds an object to find it by): its spans "
                                    "are not read", KIND))
        return None
    try:
        words = np.frombuffer(mem.read(located.pagemap, 8 * ROOT_LENGTH), dtype=np.uint64)
    except ReadError as exc:
        findings.append(Finding(Severity.ERROR, exc.address, "the page map", "its root cannot be read", KIND))
        return None
    spans, unread, lost = read_spans(mem, located.layout, located.pagemap, words, _freed(mem, located, findings))
    findings.extend(Finding(Severity.ERROR, leaf, "a leaf of the page map", "it cannot be read: the spans of its "
                            "pages are not counted", Kind.UNMAPPED) for leaf in unread)
    findings.extend(Finding(Severity.ERROR, span, "a span the page map names", "it cannot be read", Kind.UNMAPPED)
                    for span in lost)
    return spans


def _freed(mem: Memory, located: Located, findings: list) -> set[int]:
    """The objects on the metadata allocators' free lists (freed Spans among them): each list as long as the
    allocator's objects made less those in use, or it is not taken (a finding when its objects cannot be read)."""
    out: set[int] = set()
    for at in located.allocators:
        head, in_use, made = (_q(mem, at + off) for off in (16, 24, 32))
        chain, link = [], head
        try:
            while link and len(chain) < made - in_use:
                chain.append(link)
                link = _q(mem, link)
        except ReadError:
            findings.append(Finding(Severity.ERROR, chain[-1] if chain else at + 16, "a metadata allocator's free "
                                    "list", f"the object it links to ({link:#x}) cannot be read", Kind.UNMAPPED))
            continue
        if not link and len(chain) == made - in_use:
            out.update(chain)
    return out


def _q(mem: Memory, address: int) -> int:
    return struct.unpack("<Q", mem.read(address, 8))[0]


def _classes(mem: Memory, located: Located, findings: list) -> list[SizeClass]:
    """Each size class's central free list and transfer cache, by their counters."""
    L, out = located.layout, []
    for index in range(1, L.classes):
        entry = located.transfer + index * L.tc_stride
        raw = mem.read(entry, L.tc_stride)
        q = lambda off: struct.unpack_from("<Q", raw, off)[0]         # noqa: E731
        used, capacity = struct.unpack_from("<ii", raw, L.tc_used)
        central = L.tc_central
        size = q(central + L.cfl_object_size)
        if not size:
            continue
        spans = q(central + L.cfl_requested) - q(central + L.cfl_returned)
        counter = struct.unpack_from("<q", raw, central + L.cfl_counter)[0]
        bad = q(central + L.cfl_size_class) != index or not 0 <= used <= max(capacity, 0) or counter < 0 \
            or not 0 <= spans < 1 << 40
        if bad:
            findings.append(Finding(Severity.ERROR, entry, f"size class {index}'s transfer cache", "its counters are "
                                    f"impossible (size class {q(central + L.cfl_size_class)}, {used} of {capacity} "
                                    f"slots used, {counter} free objects in {spans} spans)", KIND))
        out.append(SizeClass(index, size, q(central + L.cfl_pages_per_span), q(central + L.cfl_objects_per_span),
                             max(0, min(spans, 1 << 40)), max(0, counter), max(0, used) if not bad else 0,
                             max(0, capacity)))
    return out


@dataclass(frozen=True)
class _Slab:
    cpu: int
    address: int
    objects: int
    bytes: int
    counts: tuple


def _cpus(mem: Memory, located: Located, classes: list[SizeClass], findings: list):
    """Each populated CPU's slab: its objects per size class (a header's current less the class's begin)."""
    L, base = located.layout, located.cpu_cache
    packed, stopped, begins_at, resize = (_q(mem, base + off) for off in (L.cpu_slabs, L.cpu_slabs + 8, L.cpu_begins,
                                                                          L.cpu_resize))
    slabs, shift = packed & ~0xFF, packed & 0xFF
    count = (stopped - slabs) >> shift if stopped > slabs else 0
    if not 0 < count <= 4096 or resize + count * L.resize_size > slabs:
        findings.append(Finding(Severity.ERROR, base, "the per-CPU caches", f"their slabs ({slabs:#x}, shift "
                                f"{shift}) do not lie between their resize records ({resize:#x}) and stopped flags "
                                f"({stopped:#x}): their CPUs cannot be counted", KIND))
        return [], 0, shift
    try:
        begins = struct.unpack(f"<{L.classes}H", mem.read(begins_at, 2 * L.classes))
        return _slabs(mem, L, (slabs, shift, resize, count), begins, classes, findings), count, shift
    except ReadError as exc:
        findings.append(Finding(Severity.ERROR, exc.address, "the per-CPU caches", "their begin offsets, resize "
                                "records or a CPU's slab cannot be read: the objects in the slabs are not counted",
                                Kind.UNMAPPED))
        return [], count, shift


def _slabs(mem: Memory, L: GtcLayout, where: tuple, begins: tuple, classes: list[SizeClass], findings: list):
    """Each populated CPU's slab (WHERE: slabs, shift, resize records, CPU count)."""
    slabs, shift, resize, count = where
    sizes = {c.index: c.size for c in classes}
    out = []
    for cpu in range(count):
        if not mem.read(resize + cpu * L.resize_size + L.resize_populated, 1)[0]:
            continue
        start = slabs + (cpu << shift)
        headers = struct.unpack(f"<{L.classes}I", mem.read(start, 4 * L.classes))
        counts = []
        for c in range(1, L.classes):
            current, end = headers[c] & 0xFFFF, headers[c] >> 16
            if current and (current < begins[c] - 1 or current > end):
                findings.append(Finding(Severity.ERROR, start + 4 * c, f"CPU {cpu}'s slab", f"size class {c}'s "
                                        f"header says {current} of begin {begins[c]} to end {end}", KIND))
                continue
            if current > begins[c] and c in sizes:
                counts.append((c, current - begins[c]))
        objects = sum(n for _, n in counts)
        out.append(_Slab(cpu, start, objects, sum(sizes[c] * n for c, n in counts), tuple(counts)))
    return out


