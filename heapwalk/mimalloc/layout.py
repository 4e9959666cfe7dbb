"""mimalloc's structures as its releases build them, as data (measured with gdb's ptype/o on builds of the
release tags with debug information, 64-bit, MI_SECURE 0, MI_DEBUG 0; checked against memory by discovery)."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["MiLayout", "LAYOUTS", "layout_for", "queue_shape", "MEM_ARENA"]


@dataclass(frozen=True)
class MiLayout:
    """Offsets of one family of mimalloc releases' structures (64-bit)."""

    versions: str                         # "2.0.9": the releases measured to have it
    first: tuple[int, int, int]           # the first release with it
    last: tuple[int, int, int]            # the last
    slice_shift: int = 16                 # a slice: 64 KiB
    segment_shift: int = 25               # a segment: 32 MiB, aligned to its size
    page_start_offset: int = 384          # a page of blocks of 8 bytes to 1 KiB starts this far into its slice
    huge_unowned: bool = False            # a huge segment belongs to no thread from its start (any thread frees it)
    start_by_size: bool = False           # from 2.1: a page of blocks up to 64 bytes starts 3 blocks into its slice,
    #                                       up to 512 bytes one block (page_start_offset is not used)
    # arenas: blocks of the segment size, from which segments are taken (to 2.0.9 only reservations the program
    # or its options ask for, from 2.1 all but a huge block's)
    seg_memkind: int | None = None        # the segment's memid.memkind (6: from an arena); None: to 2.0.9 the memid
    #                                       is a word, its arena's number in the low 7 bits (0: from the system)
    #                                       and its block index from bit 8
    arena_id: int | None = 0              # None: not in the description (2.0.5, 2.0.6): its place in the table + 1
    arena_start: int = 32
    arena_blocks: int = 40
    arena_fields: int = 48
    arena_committed: int = 120            # a pointer to the bitmap of committed blocks (NULL: all committed)
    arena_purge: int | None = 128         # a pointer to the bitmap of blocks whose purge waits (NULL, None: none)
    arena_inuse: int = 136                # the bitmap of blocks in use, in place
    collect_frees_cache: bool = False     # mi_collect(true) on the main thread frees the cached thread data and
    #                                       purges the arenas' waiting blocks (from 2.1)
    collect_purges_own: bool = False      # mi_collect(true) on the main thread also purges, at once, what waits
    #                                       in the segments of its own pages (from 2.1.7: each page collected forces it)
    stat_drifts: bool = False             # 2.1 to 2.3.1 on Linux: a purge takes its bytes off the committed statistic
    #                                       while the memory stays committed (mimalloc's own count drifts low)
    purge_counted: bool = True            # a purge takes what it decommits off the committed figure (not from
    #                                       2.3.2 on Linux, where it only advises the system)
    arena_slots: int = 112                # the table of arenas' slots (MI_MAX_ARENAS)
    segment_cache: bool = False           # to 2.0.9 a freed segment of the segment size waits in a cache for reuse,
    #                                       its stamp and commit mask kept until the cache decommits it
    reclaim_decommits: bool = True        # 2.0.9: a span freed past the purge delay decommits what waits at once
    collect_unmaps_cache: bool = True     # 2.0.9: mi_collect(true) unmaps the cached segments (before: decommits)
    segment_map_parts: int = 0            # from 2.1.8 the segment map is this many pointers to parts taken from the
    #                                       system, and holds no segment taken from an arena: the arenas' blocks in
    #                                       use say which are live (0: one bitmap in the library's data)
    map_part_head: int = 24               # a part of the segment map: its memory id, then its bitmap
    segment_map_tib: int = 20             # the flat segment map covers the addresses below this many TiB
    arena_meta_size: int = 56             # the bytes of its own description
    arena_meta_memkind: int | None = 84   # where its description came from (meta_memid.memkind); None: to 2.0.9
    #                                       always from the system, its bitmaps after it (`arenas.meta_bytes`)
    bin_huge: int = 73                    # MI_BIN_HUGE; the heap's queues run to MI_BIN_FULL = bin_huge + 1
    # mi_page_t (also each slice of a segment)
    page: int = 80
    page_slice_count: int = 0             # uint32
    page_slice_offset: int = 4            # uint32
    page_flags_bits: int = 8              # is_reset, is_committed, is_zero_init
    page_capacity: int = 10               # uint16
    page_reserved: int = 12               # uint16
    page_flags: int = 14                  # in_full, has_aligned
    page_free: int = 16
    page_used: int = 24                   # uint32: blocks in use, those on the thread-free list included
    page_block_size: int = 28             # uint32 xblock_size (0: a free span)
    page_used_bytes: int = 4              # from 2.1.7 used is a uint16,
    page_block_size_bytes: int = 4        # and block_size a size_t (the block's size, a huge one's too)
    page_start_field: int | None = None   # from 2.1.7 the page's first block, kept in the page
    page_local_free: int = 32
    page_thread_free: int = 40            # its lowest 2 bits are the delayed-free state
    page_heap: int = 48
    page_next: int = 56
    page_prev: int = 64
    # mi_segment_t
    seg_memid: int = 0
    seg_mem_committed: int = 10           # bool: committed as a whole when taken from the system
    seg_alignment: int = 16
    seg_decommit_expire: int = 40
    seg_decommit_mask: int = 48           # 512 bits: the slices whose decommit is pending (the purge delay)
    seg_commit_mask: int = 112            # 512 bits: the slices committed
    seg_abandoned_next: int = 176
    seg_abandoned: int = 192              # pages abandoned (the owning thread exited)
    seg_used: int = 208                   # pages in use
    seg_cookie: int = 216                 # the segment's address xor the main heap's cookie
    seg_slices_count: int = 224           # segment_slices: 512, more for a huge segment
    seg_info_slices: int = 232            # the slices the header takes
    seg_kind: int = 240                   # 0 normal, 1 huge
    seg_slice_entries: int = 248
    seg_thread_id: int = 256              # the owning thread's thread pointer (0: abandoned)
    seg_slices: int = 264
    # mi_heap_t
    heap_tld: int = 0
    heap_pages: int = 1040                # pages[MI_BIN_FULL + 1]: (first, last, block_size), 24 bytes each
    heap_delayed_free: int = 2840
    heap_thread_id: int = 2848
    heap_cookie: int = 2864
    heap_page_count: int = 3024
    heap_next: int = 3048
    heap: int = 3064                      # sizeof(mi_heap_t)
    # mi_tld_t
    tld_heap_backing: int = 16
    tld_heaps: int = 24
    tld: int = 1536
    thread_data: int = 3064 + 1536        # mi_thread_data_t: a heap and its tld, taken from the system

    @property
    def slice_size(self) -> int:
        return 1 << self.slice_shift

    @property
    def segment_size(self) -> int:
        return 1 << self.segment_shift

    @property
    def slices_per_segment(self) -> int:
        return 1 << (self.segment_shift - self.slice_shift)

    def page_start(self, block_size: int) -> int:
        """How far into its first slice a page of BLOCK_SIZE-byte blocks starts."""
        if self.start_by_size:
            return 3 * block_size if 8 <= block_size <= 64 else block_size if 8 <= block_size <= 512 else 0
        return self.page_start_offset if 8 <= block_size <= 1024 else 0

    @property
    def segment_map_limit(self) -> int:
        """The addresses the flat segment map covers (to 2.1.7): those below it."""
        return self.segment_map_tib << 40

    @property
    def segment_map_words(self) -> int:
        """Words of the segment map: a bit per segment of the addresses it covers, and one word more."""
        return (self.segment_map_limit >> self.segment_shift) // 64 + 1

    @property
    def mask_bytes(self) -> int:
        """Bytes of a segment's commit mask: a bit per slice."""
        return self.slices_per_segment // 8

    @property
    def segment_header(self) -> int:
        """Bytes of a segment's header with its slices (one more than a segment holds, for huge blocks)."""
        return self.seg_slices + (self.slices_per_segment + 1) * self.page


#: 2.0's arenas (no purge, their descriptions always taken from the system; 2.0.7 numbers them in the
#: description), and its segment cache
_OF20 = dict(arena_id=0, arena_start=8, arena_blocks=16, arena_fields=24, arena_committed=56, arena_purge=None,
             arena_inuse=64, arena_slots=64, arena_meta_memkind=None, segment_cache=True, reclaim_decommits=False,
             collect_unmaps_cache=False)
_OF205 = dict(_OF20, arena_id=None, arena_start=0, arena_blocks=8, arena_fields=16, arena_committed=48,
              arena_inuse=56)

_V205 = MiLayout("2.0.5", (2, 0, 5), (2, 0, 5), segment_shift=26, page_start_offset=128, **_OF205,
                 seg_decommit_expire=16, seg_decommit_mask=24, seg_commit_mask=152, seg_abandoned_next=280,
                 seg_abandoned=296, seg_used=312, seg_cookie=320, seg_slices_count=328, seg_info_slices=336,
                 seg_kind=344, seg_thread_id=352, seg_slice_entries=360, seg_slices=368, seg_alignment=-1,
                 heap_cookie=2856, heap_page_count=3016, heap_next=3040, heap=3056, tld=1560, thread_data=4616,
                 huge_unowned=True)

#: 2.3.2: the page says its block size and where its blocks start, the heap its thread first, the segment its
#: sub-process, and the segment map holds only the segments taken from the system
_V232 = MiLayout("2.3.2", (2, 3, 2), (2, 3, 2), seg_memkind=20, arena_committed=160, arena_purge=168,
                 arena_inuse=184, collect_frees_cache=True, arena_slots=132, page=96, page_local_free=24,
                 page_used=32, page_used_bytes=2, page_block_size=40, page_block_size_bytes=8,
                 page_start_field=48, page_thread_free=56, page_heap=64, page_next=72, page_prev=80,
                 seg_decommit_expire=48, seg_decommit_mask=56, seg_commit_mask=120, seg_abandoned_next=-1,
                 seg_abandoned=200, seg_used=216, seg_cookie=224, seg_slices_count=248, seg_info_slices=256,
                 seg_kind=264, seg_slice_entries=272, seg_thread_id=280, seg_slices=288, heap_delayed_free=8,
                 heap_thread_id=16, heap_cookie=32, heap_page_count=192, heap_next=240, heap_pages=1288,
                 heap=3088, tld=5120, thread_data=8232, segment_map_parts=25, purge_counted=False,
                 collect_purges_own=True)
#: 2.1.4 to 2.1.7: 2.3.2's page and heap (its queues 16 bytes nearer), 2.1.2's segment, arenas and segment map
_V214 = replace(_V232, versions="2.1.4 to 2.1.6", first=(2, 1, 4), last=(2, 1, 6), heap_next=216, heap_pages=1264,
                heap=3064, tld=1656, thread_data=4744, seg_decommit_expire=40, seg_decommit_mask=48,
                seg_commit_mask=112, seg_abandoned=192, seg_used=208, seg_cookie=216, seg_slices_count=224,
                seg_info_slices=232, seg_kind=240, seg_slice_entries=248, seg_thread_id=256, seg_slices=264,
                arena_committed=120, arena_purge=128, arena_inuse=144, arena_slots=112, segment_map_parts=0,
                purge_counted=True, collect_purges_own=False, stat_drifts=True, segment_map_tib=40)
#: the releases after 2.1.2, each measured on its tag (2.2.5 was not tagged)
_LATER = (_V214,
          replace(_V214, versions="2.1.7", first=(2, 1, 7), last=(2, 1, 7), collect_purges_own=True),
          replace(_V232, versions="2.1.8 to 2.1.9", first=(2, 1, 8), last=(2, 1, 9), heap_next=216, heap_pages=1264,
                  heap=3064, tld=1656, thread_data=4744, purge_counted=True, stat_drifts=True),
          replace(_V232, versions="2.2.2 to 2.2.4", first=(2, 2, 2), last=(2, 2, 4), heap_next=232, heap_pages=1280,
                  heap=3080, tld=5136, thread_data=8240, purge_counted=True, stat_drifts=True),
          replace(_V232, versions="2.2.6 to 2.2.7", first=(2, 2, 6), last=(2, 2, 7), heap_next=232, heap_pages=1280,
                  heap=3080, tld=5112, thread_data=8216, purge_counted=True, stat_drifts=True),
          replace(_V232, versions="2.3.0 to 2.3.1", first=(2, 3, 0), last=(2, 3, 1), purge_counted=True,
                  stat_drifts=True),
          _V232)

#: the layouts, oldest first (each measured on its releases built from their tags)
LAYOUTS = (_V205,
           replace(_V205, versions="2.0.6", first=(2, 0, 6), last=(2, 0, 6), tld=1536, thread_data=4592),
           replace(_V205, versions="2.0.7", first=(2, 0, 7), last=(2, 0, 7), tld=1536, heap_cookie=2864,
                   heap_page_count=3024, heap_next=3048, heap=3064, thread_data=4600, **_OF20),
           MiLayout("2.0.9", (2, 0, 9), (2, 0, 9), **{**_OF20, "reclaim_decommits": True,
                                                      "collect_unmaps_cache": True}),
           MiLayout("2.1.2", (2, 1, 2), (2, 1, 2), start_by_size=True, seg_memkind=20, tld=1600, thread_data=4688,
                    collect_frees_cache=True, stat_drifts=True, segment_map_tib=40),
           *_LATER)

#: a segment's memid.memkind when it was taken from an arena
MEM_ARENA = 6


def layout_for(version: tuple[int, int, int] | None) -> MiLayout | None:
    """The layout of VERSION (major, minor, patch), or None when heapwalk has measured none for it."""
    if version is None:
        return None
    return next((lay for lay in reversed(LAYOUTS) if lay.first <= tuple(version) <= lay.last), None)


def queue_shape(lay) -> tuple[int, int]:
    """A heap's page queue in LAYOUT LAY (2.x or 3.x): (its words, which of them is the block size)."""
    words = getattr(lay, "queue_words", 3)
    return words, getattr(lay, "queue_size_word", words - 1)
