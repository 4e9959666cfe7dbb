"""A small Google tcmalloc written byte by byte where its layout (heapwalk.gtcmalloc.layout) says its static
objects and metadata are: transfer caches and central free lists, a page allocator, per-CPU slabs or thread
caches, spans on the central lists, for the unit tests of heapwalk.gtcmalloc on synthetic memory."""

from __future__ import annotations

import struct

from heapwalk.gtcmalloc.layout import CRATE_0_1_19 as L
from heapwalk.gtcmalloc.pagemap import LEAF_BITS, LEAF_PAGES, LEAF_SIZE, LEAF_SPANS, ROOT_LENGTH
from heapwalk.inferior.elf import PF_R, PF_W, PT_LOAD, ElfImage, Segment
from heapwalk.inferior.image import ImageMemory

#: the program's data (its static objects), and the metadata arena (slabs, resize records, caches, spans)
DATA, ARENA = 0x500000, 0x7F0000000000
TRANSFER = DATA + 0x1000
PAGES = TRANSFER + L.classes * L.tc_stride + 0x1000
TAIL = PAGES + L.hpaa_size * L.hpaa_choices
CPU = TAIL + 0x100
THREAD_HEAPS = CPU + 0x400
ROOT = THREAD_HEAPS + 0x1000
DATA_SIZE = ROOT + 8 * ROOT_LENGTH - DATA
#: the arena's parts: resize records, slabs (shift 14: 16 KiB per CPU), stopped flags, begin offsets
SHIFT, CPUS = 14, 2
RESIZE = ARENA
SLABS = ARENA + 0x10000
STOPPED = SLABS + (CPUS << SHIFT)
BEGINS = STOPPED + 64
THREADS = ARENA + 0x20000
SPANS = ARENA + 0x40000
LEAF = ARENA + 0x80000
#: the heap's first page: the spans' pages follow it
HEAP = 0x600000000000
HEAP_PAGE = HEAP // 8192


class Gtc:
    """The static objects, every size class empty until `size_class` fills one."""

    def __init__(self):
        self.mem = ImageMemory({DATA: bytes(DATA_SIZE), ARENA: bytes(0x80000), LEAF: bytes(LEAF_SIZE),
                                HEAP: bytes(64 * 8192)})
        self.mem.write_u64(ROOT + 8 * (HEAP_PAGE >> LEAF_BITS), LEAF)
        for c in range(L.classes):
            self.mem.write_u64(TRANSFER + c * L.tc_stride + L.tc_owner, TRANSFER)
            self.mem.write_u64(self.central(c) + L.cfl_size_class, c)
            for k in range(L.cfl_list_count):             # each list of spans empty: its head points at itself
                head = self.central(c) + L.cfl_lists + 16 * k
                self.mem.write_u64(head, head)
                self.mem.write_u64(head + 8, head)
        self.mem.write_u64(TAIL, PAGES)
        self.mem.write_u64(TAIL + 8, PAGES + L.hpaa_size)
        self.mem.write_u64(TAIL + 24, PAGES + 2 * L.hpaa_size)
        self.mem.write(TAIL + 32, struct.pack("<I?", 1, True))
        for h in range(3):
            head = self.heap(h) + L.regions_list
            self.mem.write_u64(head, head)
        self.spans = 0

    @staticmethod
    def central(c: int) -> int:
        return TRANSFER + c * L.tc_stride + L.tc_central

    @staticmethod
    def heap(h: int) -> int:
        return PAGES + h * L.hpaa_size

    def image(self) -> ElfImage:
        """The program: its one writable segment, the static objects."""
        return ElfImage(DATA - 0x100000, "/synthetic/program", [Segment(PT_LOAD, PF_R | PF_W, DATA, DATA_SIZE,
                                                                         DATA_SIZE)], self.mem)

    def size_class(self, c: int, size: int, pages: int, free: int, spans: int, transfer: int = 0,
                   capacity: int = 64) -> None:
        """Class C of objects of SIZE in spans of PAGES: FREE objects in its SPANS, TRANSFER in its transfer cache."""
        central = self.central(c)
        for off, value in ((L.cfl_object_size, size), (L.cfl_pages_per_span, pages),
                           (L.cfl_objects_per_span, pages * 8192 // size), (L.cfl_counter, free),
                           (L.cfl_requested, spans), (L.cfl_returned, 0)):
            self.mem.write_u64(central + off, value)
        self.mem.write(TRANSFER + c * L.tc_stride + L.tc_used, struct.pack("<ii", transfer, capacity))

    def listed_span(self, c: int, in_use: int, bucket: int = 0) -> int:
        """A span of class C with IN_USE objects handed out, on its central list BUCKET, one page the page map names:
        its address."""
        span = SPANS + 64 * self.spans
        self.spans += 1
        head = self.central(c) + L.cfl_lists + 16 * bucket
        first = struct.unpack("<Q", self.mem.read(head, 8))[0]
        self.mem.write_u64(span, first)
        self.mem.write_u64(span + 8, head)
        self.mem.write_u64(first + 8, span)
        self.mem.write_u64(head, span)
        self.mem.write(span + L.span_allocated, struct.pack("<H", in_use))
        page = HEAP_PAGE + self.spans
        self.mem.write_u64(span + L.span_first_page, page)
        self.mem.write(span + L.span_first_page + 8, bytes([1]))               # one page
        slot = page & (LEAF_PAGES - 1)
        self.mem.write(LEAF + slot, bytes([c]))
        self.mem.write_u64(LEAF + LEAF_SPANS + 8 * slot, c << 48 | span)
        size = struct.unpack("<Q", self.mem.read(self.central(c) + L.cfl_lists_size, 8))[0]
        self.mem.write_u64(self.central(c) + L.cfl_lists_size, size + 1)
        return span

    def span_free(self, span: int, size: int, free: list[int]) -> None:
        """SPAN's own free objects (their indexes): a bitmap for objects of 64 bytes and more; else the first up
        to 8 in its cache, the rest in a chain (the first of them the host, holding the others' indexes)."""
        if size >= 64:
            bits = sum(1 << i for i in free)
            self.mem.write(span + L.span_cache, struct.pack("<QQ", bits & (2**64 - 1), bits >> 64))
            return
        units = [i * size // 8 for i in free]
        cached, chained = units[:8], units[8:]
        self.mem.write(span + L.span_cache, struct.pack(f"<{len(cached)}H", *cached))
        self.mem.write(span + L.span_cache_size, bytes([len(cached)]))
        start = struct.unpack("<Q", self.mem.read(span + L.span_first_page, 8))[0] * 8192
        if chained:
            host, rest = chained[0], chained[1:]
            self.mem.write(start + host * 8, struct.pack(f"<{1 + len(rest)}H", 0xFFFF, *rest))
        self.mem.write(span + L.span_freelist, struct.pack("<H", chained[0] if chained else 0xFFFF))
        self.mem.write(span + L.span_embed_count, struct.pack("<H", max(0, len(chained) - 1)))

    @staticmethod
    def object(span_index: int, size: int, index: int) -> int:
        """The address of object INDEX of the SPAN_INDEX-th span made (0 first), of SIZE bytes."""
        return (HEAP_PAGE + span_index + 1) * 8192 + index * size

    def transfer_slots(self, c: int, objects: list[int]) -> int:
        """Class C's transfer cache holding OBJECTS: its slots' address."""
        slots = ARENA + 0x30000 + 0x400 * c
        self.mem.write(slots, struct.pack(f"<{len(objects)}Q", *objects))
        self.mem.write_u64(TRANSFER + c * L.tc_stride + L.tc_slots, slots)
        used, capacity = struct.unpack("<ii", self.mem.read(TRANSFER + c * L.tc_stride + L.tc_used, 8))
        self.mem.write(TRANSFER + c * L.tc_stride + L.tc_used, struct.pack("<ii", len(objects), capacity))
        return slots

    def page_heap(self, h: int, from_system: int, in_use: int, filler: int, allocated: int, unmapped: int,
                  cached: int = 0) -> None:
        """Huge-page-aware allocator H's counters: hugepages from the system and in use, the filler's hugepages,
        its pages allocated and unmapped, hugepages cached."""
        at = self.heap(h)
        for off, value in ((L.alloc_from_system, from_system), (L.alloc_in_use, in_use), (L.filler_size, filler),
                           (L.filler_allocated, allocated), (L.filler_unmapped, unmapped), (L.cache_size, cached)):
            self.mem.write_u64(at + off, value)

    def per_cpu(self, populated: tuple[int, ...], objects: dict[tuple[int, int], list[int]]) -> None:
        """Per-CPU caches on: the CPUs POPULATED, OBJECTS[(cpu, class)] the objects in each slab."""
        self.mem.write_u64(CPU + L.cpu_slabs, SLABS | SHIFT)
        self.mem.write_u64(CPU + L.cpu_slabs + 8, STOPPED)
        self.mem.write_u64(CPU + L.cpu_begins, BEGINS)
        self.mem.write_u64(CPU + L.cpu_resize, RESIZE)
        begins = [0] + [L.classes // 2 + 1 + 8 * c for c in range(1, L.classes)]
        self.mem.write(BEGINS, struct.pack(f"<{L.classes}H", *begins))
        for cpu in populated:
            self.mem.write(RESIZE + cpu * L.resize_size + L.resize_populated, b"\1")
            for c in range(1, L.classes):
                held = objects.get((cpu, c), [])
                self.mem.write(SLABS + (cpu << SHIFT) + 4 * c, struct.pack("<HH", begins[c] + len(held), begins[c] + 7))
                self.mem.write(SLABS + (cpu << SHIFT) + 8 * begins[c], struct.pack(f"<{len(held)}Q", *held))

    def thread_caches(self, sizes: list[int], thread_pointers: list[int]) -> list[int]:
        """Thread caches of SIZES bytes on the list, the I-th pointed at from the static TLS below
        THREAD_POINTERS[I]: their addresses."""
        caches = [THREADS + 0x2000 * i for i in range(len(sizes))]
        for i, (at, size) in enumerate(zip(caches, sizes)):
            self.mem.write_u64(at + L.thread_size, size)
            self.mem.write_u64(at + L.thread_tid, 0x7F0000001000 + i)
            self.mem.write_u64(at + L.thread_next, caches[i + 1] if i + 1 < len(caches) else 0)
            self.mem.write_u64(at + L.thread_next + 8, caches[i - 1] if i else 0)
        for tp, at in zip(thread_pointers, caches):
            self.mem.add(tp - 8192, bytes(8192))
            self.mem.write_u64(tp - 96, at)
        self.mem.write_u64(THREAD_HEAPS, caches[0] if caches else 0)
        self.mem.write(THREAD_HEAPS + L.thread_count, struct.pack("<i", len(caches)))
        return caches
