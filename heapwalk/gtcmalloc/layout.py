"""Where Google's tcmalloc keeps what heapwalk reads, for each build whose layout was measured.

Google's tcmalloc has no releases: programs link it from a snapshot of its sources, built with options (page
size, NUMA awareness, per-thread caches) that change the size and the offsets of its structures.  A layout here
is one such build, measured with gdb's `ptype /o` on a build of the same sources with debug information, and
recognised in a target by the sizes its shapes show (the stride of its transfer caches, the size of its page
allocators), never by a version string (it has none).

Measured on the tcmalloc-better crate 0.1.19 (libtcmalloc-sys 0.1.14: Google's tcmalloc and Abseil lts_20240722
as that crate bundles them), its default features (8 KiB pages, no NUMA), on a 64-bit target:
- `Static::transfer_cache_`: 172 transfer caches of 576 bytes, one per size class; each holds its slot count
  (int32 used, int32 capacity) at 24, its slots at 32, the size class's central free list at 40, its owner (the
  array's start) at 464.
- a central free list: size class at 8, object size at 16, objects per span at 24, pages per span at 48, free
  objects in its spans at 56, spans requested at 64 and returned at 72, 8 lists of spans with free objects at 208
  (16 bytes each: next, prev), how many spans they hold at 336.
- `Static::cpu_cache_`: its slabs and shift (one word: the slabs' address, the shift in its low byte) at 0, the
  per-size-class begin offsets' array at 16, each CPU's resize record at 24 (9,792 bytes each; populated at 16),
  the limit of a CPU's cache in bytes at 392.
  A CPU's slab is 1 << shift bytes at slabs + cpu << shift: a 4-byte header per size class (current, end: u16
  offsets in words from the slab's start), the cached objects' addresses from begin to current.
- `Static::sharded_transfer_cache_`: its shards at 0, the transfer-cache array it serves (owner) at 192.
- `Static::page_allocator_`: three huge-page-aware allocators of 709,816 bytes (normal, sampled, cold), then
  pointers to the normal one, the sampled one, selsan's and the cold one, the algorithm (int32) and whether the
  cold one is used (bool at +36), its soft and hard limits at +40, their hits at +56, the shrinks after them at
  +72, the peaks of backed and of sampled application bytes at +88.
- the metadata arena (Static::arena_, whose address every metadata allocator holds): its bytes no longer
  resident at 40.
- a huge-page-aware allocator: its pages released (total, by ReleaseMemoryToSystem, by background actions, past
  the soft limit, past the hard limit) at 32; its filler's hugepages (size_) at 207,864, its pages allocated (sparse, dense) at
  207,872, its unmapped pages at 207,888; its regions' count at 371,456 and list at 371,472; its huge allocator
  at 535,184 (hugepages from the system at +64, in use at +72); its huge cache at 535,272 (cached hugepages at +72,
  in use at +136).
- a huge region (21,064 bytes): next, prev, pages used (uint32) at 16,404, its range (first hugepage, count) at
  16,416, its backed hugepages at 21,040.
- a span (64 bytes): its links (next, prev), the count of the index list embedded in its first free object at 16,
  that object's index (in 8-byte units from the span's start) at 18, its objects handed out (uint16) at 20, the
  count of its cache of indexes (low 4 bits of the byte at 22), its first page (35 bits of the word at 24: bit 61
  says large, 62 sampled), its pages at 32 (6 bits, or the whole word when large or sampled), its cache of 8
  indexes or, for objects of 64 bytes and more, its bitmap of free objects at 40; a sampled span, its
  SampledAllocation there instead, whose stack trace holds (at 32 and 40 from the SampledAllocation's start) the
  object of the size class that stands in for the sample (its proxy: tcmalloc keeps it allocated while the
  sampled allocation lives, and counts it in use) and the size the program asked for.
- a thread cache (4,224 bytes): a list per size class (24 bytes: head, count), free bytes (size_) at 4,128, its thread (pthread_t) at 4,144, next and prev at
  4,160 and 4,168; a thread's pointer to it sits in its static TLS.  The list's head (ThreadCache::thread_heaps_)
  is a static word with the list's length (an int32, thread_heap_count_) 8 bytes below it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GtcLayout", "LAYOUTS", "PAGE", "HUGEPAGE"]

#: tcmalloc's page and huge page, in bytes (the builds measured use 8 KiB pages)
PAGE, HUGEPAGE = 8192, 2 << 20


@dataclass(frozen=True)
class GtcLayout:
    """One measured build of Google's tcmalloc: what it is, and its offsets (see the module's text)."""

    name: str
    classes: int
    # transfer caches
    tc_stride: int
    tc_owner: int
    tc_used: int
    tc_slots: int
    tc_central: int
    # central free list (from its start)
    cfl_size_class: int
    cfl_object_size: int
    cfl_objects_per_span: int
    cfl_pages_per_span: int
    cfl_counter: int
    cfl_requested: int
    cfl_returned: int
    cfl_lists: int
    cfl_list_count: int
    cfl_lists_size: int
    # span
    span_allocated: int
    span_first_page: int
    span_embed_count: int
    span_freelist: int
    span_cache_size: int        # a byte: the cache's count in its low 4 bits
    span_cache: int             # the cache's 8 object indexes, or the bitmap of free objects (128 bits)
    span_sampled: int           # a sampled span's SampledAllocation
    sampled_proxy: int          # in a SampledAllocation: the object of the size class that stands in for it
    sampled_requested: int      # and the size the program asked for
    # per-CPU cache
    cpu_slabs: int
    cpu_begins: int
    cpu_resize: int
    resize_size: int
    resize_populated: int
    cpu_max_size: int           # the per-CPU cache limit (bytes a CPU's slab may hold)
    # sharded transfer caches
    sharded_shards: int
    sharded_owner: int
    # page allocator
    hpaa_size: int
    hpaa_choices: int
    pa_limits: int              # from the page allocator's pointers: its soft and hard limits (int64 each)
    pa_limit_hits: int
    pa_shrinks: int             # successful shrinks after a limit's hit (soft, hard)
    pa_peaks: int               # the peak of backed bytes, then of sampled application bytes
    hpaa_released: int          # a huge-page-aware allocator's pages released, by reason (5 counts)
    arena_nonresident: int      # the metadata arena's bytes no longer resident
    filler_size: int
    filler_allocated: int
    filler_unmapped: int
    regions_count: int
    regions_list: int
    alloc_from_system: int
    alloc_in_use: int
    cache_size: int
    cache_usage: int
    region_used: int
    region_range: int
    region_backed: int
    # thread cache
    thread_size: int
    thread_tid: int
    thread_next: int
    thread_count: int           # where the list's length is, from its head's word


CRATE_0_1_19 = GtcLayout(
    name="tcmalloc-better 0.1.19 (libtcmalloc-sys 0.1.14), 8 KiB pages",
    classes=172,
    tc_stride=576, tc_owner=464, tc_used=24, tc_slots=32, tc_central=40,
    cfl_size_class=8, cfl_object_size=16, cfl_objects_per_span=24, cfl_pages_per_span=48, cfl_counter=56,
    cfl_requested=64, cfl_returned=72, cfl_lists=208, cfl_list_count=8, cfl_lists_size=336,
    span_allocated=20, span_first_page=24, span_embed_count=16, span_freelist=18, span_cache_size=22, span_cache=40,
    span_sampled=40, sampled_proxy=32, sampled_requested=40,
    cpu_slabs=0, cpu_begins=16, cpu_resize=24, resize_size=9792, resize_populated=16, cpu_max_size=392,
    sharded_shards=0, sharded_owner=192,
    hpaa_size=709816, hpaa_choices=3, pa_limits=40, pa_limit_hits=56, pa_shrinks=72, pa_peaks=88, hpaa_released=32,
    arena_nonresident=40,
    filler_size=207864, filler_allocated=207872, filler_unmapped=207888,
    regions_count=371456, regions_list=371472,
    alloc_from_system=535184 + 64, alloc_in_use=535184 + 72,
    cache_size=535272 + 72, cache_usage=535272 + 136,
    region_used=16404, region_range=16416, region_backed=21040,
    thread_size=4128, thread_tid=4144, thread_next=4160, thread_count=-8,
)

#: every measured build, tried in turn
LAYOUTS = (CRATE_0_1_19,)
