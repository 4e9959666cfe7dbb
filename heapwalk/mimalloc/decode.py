"""mimalloc's memory, segment by segment: each segment's slices cut into pages of blocks and free spans, each
page's blocks in use and free (on its free, local-free and thread-free lists, and on its heap's delayed-free
list), what is committed and what waits for its purge delay; the heaps and the threads they belong to."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.common.slotted import slotted
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.inferior.residency import Residency
from heapwalk.mimalloc.arenas import segment_arena
from heapwalk.mimalloc.bits import bit_runs
from heapwalk.mimalloc.discovery import MiDiscovery
from heapwalk.mimalloc.heaps import MiHeap, find_heaps, visit_order
from heapwalk.mimalloc.layout import MiLayout
from heapwalk.mimalloc.lists import count_delayed, walk_pages
from heapwalk.mimalloc.page import MiPage

__all__ = ["SEGMENT", "MiPage", "MiSpan", "MiSegment", "MiHeap", "MiState", "decode_mimalloc", "good_size"]

SEGMENT = Kind("mi_segment", "segment unreadable or inconsistent")
_HUGE = 1           # mi_segment_kind_t
_IN_FULL = 1        # the page's flags: it sits in its heap's full queue


@dataclass(frozen=True)
class MiSpan:
    """A run of free slices in a segment: its bytes, those committed, those whose decommit is pending."""

    segment: int
    index: int
    slices: int
    committed: int
    pending: int


@slotted
@dataclass
class MiSegment:
    """One segment: its memory from the system, its owner, its pages and free spans."""

    address: int
    kind: int                   # 0 normal, 1 huge
    slices: int                 # segment_slices
    info_slices: int
    thread_id: int              # the owning thread's thread pointer; 0 when abandoned (or freed)
    used: int                   # pages in use
    abandoned: int              # pages abandoned
    memid: int
    reserved: int               # bytes taken from the system for it
    committed: int
    pending: int                # committed bytes whose decommit waits for the purge delay
    live: bool = True           # in the segment map (False: freed, its stamp left)
    pending_mask: int = 0       # the slices whose decommit is pending, a bit each
    arena: object = None        # the arena it was taken from (`mimalloc.arenas.MiArena`), or None
    commit_mask: int = 0        # the slices committed, a bit each
    pages: list[MiPage] = field(default_factory=list)
    spans: list[MiSpan] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.slices * 65536

    @property
    def huge(self) -> bool:
        return self.kind == _HUGE

    def in_committed_blocks(self) -> bool:
        """Whether its arena committed all its blocks (their commit counted once, as the arena's)."""
        first = self.arena.block_of(self.address)
        return all(self.arena.committed >> b & 1 for b in range(first, first + self.reserved // self.arena.block_size))

    def pending_ranges(self) -> list[tuple[int, int]]:
        """The runs of slices whose decommit is pending, as address ranges."""
        return [(self.address + a * 65536, self.address + b * 65536) for a, b in bit_runs(self.pending_mask)]

    def committed_ranges(self) -> list[tuple[int, int]]:
        """The runs of committed slices, as address ranges."""
        return [(self.address + a * 65536, self.address + b * 65536) for a, b in bit_runs(self.commit_mask)]


@dataclass
class MiState:
    """mimalloc decoded: its segments, heaps and thread data, and what the walk found.  This class is mimalloc 2's
    family (segments cut into pages); mimalloc 3's (pages of arenas' slices) is `mimalloc.v3.state.MiState3`,
    which answers each question below its own way: the shared modules ask, and never which family it is."""

    #: the layout family (2 or 3), what its memory comes in, how a unit from the system and the row of the
    #: units no live thread holds are named, and what an abandoned unit is
    family = 2
    unit = "segment"
    huge_label = " (huge)"
    exited_row = "exited threads"
    abandoned_owner = "abandoned (its thread exited)"
    #: whether an arena holds its units whole (drawn and claimed as the arena, not unit by unit)
    arenas_whole = False
    #: whether an abandoned unit's pages still count to their heap (mimalloc 3: the heap is no more)
    abandoned_keep_heap = True

    discovery: MiDiscovery
    segments: list[MiSegment]
    heaps: list[MiHeap]
    thread_data: list[tuple[int, str]]          # (address, "thread"/"cached") of each thread data taken
    findings: list[Finding]
    target: str = ""
    residency: Residency | None = None
    main_thread: int = 0                        # the main thread's thread pointer (0: not known)
    os_page: int = 4096                         # the system's page (AT_PAGESZ), which small requests round to
    cache: list = field(default_factory=list)           # to 2.0.9: the segments in its segment cache
    main_queues: list = field(default_factory=list)     # to 2.0.9 and from 2.1.7: the main heap's pages as
    #                                                     collect visits them, each with whether it is retired
    #                                                     (collect.visit_order)

    @property
    def layout(self) -> MiLayout:
        return self.discovery.layout

    def live(self) -> list[MiSegment]:
        return [s for s in self.segments if s.live]

    def unowned(self, seg: MiSegment) -> bool:
        """Whether SEG belongs to no thread by design: a huge segment of a release that gives them none."""
        return not seg.thread_id and seg.huge and self.layout.huge_unowned

    def cached(self) -> list[MiSegment]:
        """To 2.0.9: the segments taken from the system that wait in its segment cache (`cached_segments`)."""
        return self.cache

    def abandoned(self) -> list[MiSegment]:
        """The live segments of threads that exited."""
        return [s for s in self.live() if not s.thread_id and not self.unowned(s)]

    def pages(self):
        return [p for s in self.live() for p in s.pages]

    def thread_data_bytes(self) -> int:
        """Bytes of its own it took from the system: thread data, and arenas' descriptions."""
        return good_size(self.layout.thread_data, self.os_page) * len(self.thread_data) + \
            sum(good_size(a.meta, self.os_page) for a in self.discovery.arenas if a.meta)

    def map_bytes(self) -> int:
        """From 2.1.8 the segment map's parts: what its statistics count of its map."""
        return sum(hi - lo for lo, hi in self.map_part_ranges())

    def own_ranges(self) -> list[tuple[int, int]]:
        """Its own memory apart from its units and thread data (from 2.1.8 the segment map's parts)."""
        return self.map_part_ranges()

    def collected_ranges(self) -> list[tuple[int, int]] | None:
        """What mi_collect(true) gives back when the family computes it itself; None: `collect.collected`'s."""
        return None

    def add_arenas_row(self, by: dict, free: int) -> bool:
        """Adds the arenas' row to BY (FREE: their free bytes) when the family makes it itself; False: not made."""
        return False

    def in_arena(self, address: int) -> dict | None:
        """What ADDRESS is in an arena outside its units, when the family can say (mimalloc 3); else None."""
        return None

    def figures(self, collected: list[tuple[int, int]], own: dict[str, int]) -> dict[str, int] | None:
        """Its own figures as mi_stats_print names them (COLLECTED: what mi_collect gives back; OWN: its own
        reserved and committed, where read), when the family names them its own way; None: `shown.totals`'."""
        return None

    def map_part_ranges(self) -> list[tuple[int, int]]:
        """From 2.1.8: the segment map's parts, as address ranges."""
        parts = self.discovery.map_parts
        size = good_size(parts.part_size(self.layout), self.os_page) if parts is not None else 0
        return [(at, at + size) for at in parts.parts] if parts is not None else []

    def reserved(self) -> int:
        """Bytes mimalloc took from the system: its arenas, its live segments outside them, and thread data (its
        reserved statistic); also the page map's sub-maps (mimalloc 3) or the segment map's parts (from 2.1.8)."""
        return sum(a.reserved for a in self.discovery.arenas) + sum(s.reserved for s in self.cached()) + \
            sum(s.reserved for s in self.live() if s.arena is None) + self.thread_data_bytes() + self.map_bytes()

    def committed(self) -> int:
        """Its committed statistic: its arenas' committed blocks, the committed slices of its segments (in an
        arena, those of blocks the arena has not committed), and its thread data."""
        arenas = sum(a.committed_blocks() * a.block_size for a in self.discovery.arenas)
        own = sum(s.committed for s in [*self.live(), *self.cached()]
                  if s.arena is None or not s.in_committed_blocks())
        return arenas + own + self.thread_data_bytes() + self.map_bytes()

    def free_arena_blocks(self) -> list[tuple[int, int]]:
        """To 2.3.2: the arenas' blocks not in use, as address ranges."""
        return [(a.start + b * a.block_size, a.start + (b + 1) * a.block_size)
                for a in self.discovery.arenas for b in range(a.blocks) if not a.inuse >> b & 1]

    def arena_free(self) -> int:
        """Bytes of the arenas' blocks no segment uses; none of an arena whose segments' damaged sizes claim more
        than it holds."""
        used: dict[int, int] = {}
        for s in self.live():
            if s.arena is not None:
                used[s.arena.id] = used.get(s.arena.id, 0) + s.reserved
        return sum(max(a.reserved - used.get(a.id, 0), 0) for a in self.discovery.arenas)

    def resident(self, ranges) -> int | None:
        if self.residency is None:
            return None
        ranges = list(ranges)
        if not ranges:
            return 0
        a = np.array(ranges, dtype=np.uint64).reshape(-1, 2)
        known = self.residency.covering([(int(lo), int(hi)) for lo, hi in a.tolist()])
        return int(known.resident_sum(a[:, 0], a[:, 1]))


def good_size(size: int, os_page: int = 4096) -> int:
    """What mimalloc asks the system for when it needs SIZE bytes (_mi_os_good_alloc_size): SIZE rounded up to
    a page (OS_PAGE bytes: the system's) below 512 KiB, to 64 KiB below 2 MiB, 256 KiB below 8 MiB, 1 MiB below 32 MiB, 4 MiB above."""
    for limit, align in ((512 << 10, os_page), (2 << 20, 64 << 10), (8 << 20, 256 << 10), (32 << 20, 1 << 20)):
        if size < limit:
            return -(-size // align) * align
    return -(-size // (4 << 20)) * (4 << 20)


def _slice_dtype(lay: MiLayout) -> np.dtype:
    names = ("slice_count", "slice_offset", "capacity", "reserved", "flags", "free", "used", "block_size",
             "local_free", "thread_free", "heap")
    formats = ("<u4", "<u4", "<u2", "<u2", "u1", "<u8", f"<u{lay.page_used_bytes}", f"<u{lay.page_block_size_bytes}",
               "<u8", "<u8", "<u8")
    offsets = (lay.page_slice_count, lay.page_slice_offset, lay.page_capacity, lay.page_reserved, lay.page_flags,
               lay.page_free, lay.page_used, lay.page_block_size, lay.page_local_free, lay.page_thread_free,
               lay.page_heap)
    if lay.page_start_field is not None:
        names, formats, offsets = (*names, "page_start"), (*formats, "<u8"), (*offsets, lay.page_start_field)
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": lay.page})


def decode_mimalloc(mem: Memory, found: MiDiscovery, threads, description: str = "",
                    residency: Residency | None = None) -> MiState:
    """Every segment FOUND names (and those freed), its pages' lists walked; the heaps of THREADS (each with
    its thread pointer) and of the pages."""
    findings: list[Finding] = []
    segments = [s for s in (_segment(mem, found, at, True, findings) for at in found.segments) if s]
    segments += [s for s in (_segment(mem, found, at, False, findings) for at in found.freed) if s]
    held = "an arena's block in use is" if found.layout.segment_map_parts else "the segment map holds"
    for at in found.unstamped:
        findings.append(Finding(Severity.ERROR, at, "mi_segment_t", f"{held} a segment at {at:#x} whose header "
                                "does not hold its stamp (the address xor the cookie): it is unreadable or damaged, "
                                "and its memory is left out of every figure", SEGMENT))
    if found.segment_map is None and not found.layout.segment_map_parts and \
            any(s < found.layout.segment_map_limit for s in found.segments):
        findings.append(Finding(Severity.ERROR, 0, "mimalloc segment map", "mimalloc's segment map was not found "
                                "in its data (unreadable or damaged): every segment stamped with its address is taken "
                                "as live, and one freed but not yet unmapped would be counted", SEGMENT))
    if found.map_parts_lost:
        findings.append(Finding(Severity.WARNING, 0, "mimalloc segment map", f"{found.map_parts_lost} segments "
                                "taken from the system below 48 TiB are held by parts of the segment map, and no "
                                "table of parts was found in mimalloc's data: those segments are taken as live, and "
                                "the parts' 8 KiB each are left out of the reserved and committed figures", SEGMENT))
    heaps = find_heaps(mem, found, segments, threads, findings)
    walk_pages(mem, [page for seg in segments if seg.live for page in seg.pages], findings)
    delayed = count_delayed(mem, found.layout, [h.address for h in heaps],
                            [p for s in segments if s.live for p in s.pages], findings)
    for heap in heaps:
        heap.delayed = delayed[heap.address]
    data = [(h.address, "thread") for h in heaps if h.backing and not h.main] + \
        [(at, "cached") for at in found.thread_data_cache]
    main = next((h for h in heaps if h.main), None)
    state = MiState(found, segments, heaps, data, findings, description, residency, main.thread_id if main else 0)
    state.cache = cached_segments(found, segments, findings)
    if (found.layout.collect_purges_own or found.layout.segment_cache) and main is not None:
        state.main_queues = visit_order(mem, found.layout, main.address)
    return state


def cached_segments(found: MiDiscovery, segments: list[MiSegment], findings: list[Finding]) -> list[MiSegment]:
    """To 2.0.9: the segments taken from the system that its cache's table holds (with its header where the cache
    has not decommitted it yet); where the table is not found, the freed segments whose stamp is left."""
    lay = found.layout
    if not getattr(lay, "segment_cache", False):
        return []
    freed = {s.address: s for s in segments if not s.live and s.arena is None}
    if found.cache_at is None:
        if freed:
            findings.append(Finding(Severity.WARNING, 0, "mimalloc segment cache", f"{len(freed)} freed segments "
                                    "keep their stamp, but mimalloc's segment cache was not found in its data: they "
                                    "are taken as cached, and the segments it keeps decommitted are left out of the "
                                    "reserved figure", Kind.NOT_DECODED))
        return list(freed.values())
    return [freed.get(c.segment) or MiSegment(c.segment, 0, lay.slices_per_segment, 0, 0, 0, 0, c.memid,
                                              lay.segment_size, bin(c.commit_mask).count("1") * lay.slice_size, 0,
                                              live=False, commit_mask=c.commit_mask)
            for c in found.cache_slots if not c.memid & 0x7F]


def _segment(mem: Memory, found: MiDiscovery, at: int, live: bool, findings: list[Finding]) -> MiSegment | None:
    """The segment at AT with its pages and free spans (None, and a finding, when its header cannot be read)."""
    lay = found.layout
    try:
        head = mem.read(at, lay.seg_slices)
    except ReadError as exc:
        findings.append(Finding(Severity.ERROR, at, "mi_segment_t", f"the segment's header cannot be read ({exc})",
                                SEGMENT))
        return None
    word = lambda off: int.from_bytes(head[off:off + 8], "little")     # noqa: E731
    slices, info, entries = word(lay.seg_slices_count), word(lay.seg_info_slices), word(lay.seg_slice_entries)
    if not 0 < info < slices <= 1 << 30 or not 0 < entries <= lay.slices_per_segment:
        findings.append(Finding(Severity.ERROR, at, "mi_segment_t", f"the segment's slice counts are impossible "
                                f"({slices} slices, {info} for its header, {entries} entries)", SEGMENT))
        return None
    commit = _bits(head[lay.seg_commit_mask:lay.seg_commit_mask + lay.mask_bytes])
    pending = _bits(head[lay.seg_decommit_mask:lay.seg_decommit_mask + lay.mask_bytes]) & commit
    huge = int.from_bytes(head[lay.seg_kind:lay.seg_kind + 4], "little") == _HUGE
    arena = _arena_of(found, at, head)
    reserved = good_size(slices * lay.slice_size)
    full = (1 << lay.slices_per_segment) - 1
    committed = reserved if huge and commit == full else bin(commit).count("1") * lay.slice_size
    if arena is not None:
        blocks = -(-slices * lay.slice_size // lay.segment_size)
        first = arena.block_of(at)
        if first + blocks > arena.blocks:
            findings.append(Finding(Severity.ERROR, at, "mi_segment_t", f"the segment's {slices} slices run past the "
                                    f"end of its arena (from its block {first} of {arena.blocks}, at "
                                    f"{arena.start:#x}): it is counted to the arena's end", SEGMENT))
            blocks = arena.blocks - first
            slices = max(blocks * lay.segment_size // lay.slice_size, info + 1)
        reserved = blocks * lay.segment_size
        if all(arena.committed >> b & 1 for b in range(first, first + blocks)):
            committed = reserved            # its arena committed its blocks: the arena's figure counts them
    seg = MiSegment(at, 1 if huge else 0, slices, info, word(lay.seg_thread_id), word(lay.seg_used),
                    word(lay.seg_abandoned), word(lay.seg_memid), reserved, committed,
                    bin(pending).count("1") * lay.slice_size, live, pending_mask=pending, arena=arena,
                    commit_mask=commit)
    if live:
        _cut(mem, lay, seg, entries, commit, pending, findings)
    return seg


def _arena_of(found: MiDiscovery, at: int, head: bytes):
    """The arena the segment at AT (its header HEAD) was taken from, or None (taken from the system)."""
    if segment_arena(head, found.layout) is None:
        return None
    return next((a for a in found.arenas if a.start <= at < a.start + a.reserved), None)


def _bits(data: bytes) -> int:
    return int.from_bytes(data, "little")


def _cut(mem: Memory, lay: MiLayout, seg: MiSegment, entries: int, commit: int, pending: int,
         findings: list[Finding]) -> None:
    """SEG's slices from its header on, as pages and free spans."""
    try:
        table = np.frombuffer(mem.read(seg.address + lay.seg_slices, entries * lay.page), dtype=_slice_dtype(lay))
    except ReadError as exc:
        findings.append(Finding(Severity.ERROR, seg.address, "mi_segment_t", f"its slices cannot be read ({exc})",
                                SEGMENT))
        return
    i = int(table[0]["slice_count"]) or 1
    while i < entries:
        s = table[i]
        count = int(s["slice_count"])
        if count == 0 or int(s["slice_offset"]) != 0:
            findings.append(Finding(Severity.ERROR, seg.address + lay.seg_slices + i * lay.page, "mi_slice_t",
                                    f"slice {i} of the segment at {seg.address:#x} starts no page or span "
                                    f"(count {count}, offset {int(s['slice_offset'])}): the walk of its slices "
                                    "stops there", SEGMENT))
            return
        if int(s["block_size"]) == 0:
            mask = ((1 << count) - 1) << i
            seg.spans.append(MiSpan(seg.address, i, count, bin(commit & mask).count("1") * lay.slice_size,
                                    bin(pending & mask).count("1") * lay.slice_size))
        else:
            seg.pages.append(_page(lay, seg, i, s))
        i += count


def _page(lay: MiLayout, seg: MiSegment, i: int, s) -> MiPage:
    xsize = int(s["block_size"])
    slices = int(s["slice_count"])
    if lay.page_start_field is not None:        # from 2.1.7: the page says where its blocks start, and their size
        first = seg.address + i * lay.slice_size
        start = min(max(int(s["page_start"]), first), first + slices * lay.slice_size)
        size = xsize
    else:
        start = seg.address + i * lay.slice_size + lay.page_start(xsize)
        area = seg.address + (i + slices) * lay.slice_size - start
        size = area if seg.huge or xsize >= 1 << 31 else xsize
    return MiPage(seg.address, i, seg.address + lay.seg_slices + i * lay.page, slices, start, size,
                  int(s["capacity"]), int(s["reserved"]), int(s["used"]), int(s["heap"]),
                  bool(int(s["flags"]) & _IN_FULL),
                  (int(s["free"]), int(s["local_free"]), int(s["thread_free"]) & ~3))
