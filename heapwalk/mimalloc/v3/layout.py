"""mimalloc 3's structures as its releases build them, as data (measured with gdb on builds of the release tags
with debug information, 64-bit, MI_SECURE 0, MI_DEBUG 0; checked against memory by discovery).  The names the
shared code reads (the heap's page queues, the page's links) are those of `mimalloc.layout.MiLayout`."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["Mi3Layout", "LAYOUTS3", "layout3_for"]


@dataclass(frozen=True)
class Mi3Layout:
    """Offsets of one family of mimalloc 3 releases' structures (64-bit)."""

    versions: str
    first: tuple[int, int, int]
    last: tuple[int, int, int]
    family: int = 3
    slice_shift: int = 16                 # an arena slice: 64 KiB; a page takes whole slices
    huge_unowned: bool = False
    collect_frees_cache: bool = True      # mi_collect(true) purges the arenas' waiting slices
    thread_data: int = 0                  # heaps and thread-local data live in the arenas' meta pages
    seg_memkind: int | None = None
    mem_os: tuple[int, ...] = (4, 5, 6)   # memkinds of memory taken from the system (OS, huge OS pages, remappable)
    mem_arena: int = 7                    # the memkind of memory taken from an arena
    bin_huge: int = 73
    queue_words: int = 3                  # a page queue: first, last, block size (from 3.1: first, last, count, size;
    #                                       3.6: then a collect score)
    queue_size_word: int = 2              # which of its words is the block size
    default_fn: str = "mi_heap_get_default"   # the exported function that loads the thread's default heap
    purge_counted: bool = True            # a purge takes what it decommits off the committed figure (to 3.3.1; from
    #                                       3.3.2 not on Linux, where it only advises the system the memory is unused)
    min_purge: str = ""                   # a purge takes whole aligned groups of its minimal purge size (from 3.1.6):
    #                                       a large page where the system has huge pages and allow_thp is set
    #                                       ("thp"; from 3.3.2 only when it is 2: "thp2"); "": every waiting run
    stat_drifts: bool = True              # to 3.3.1 on Linux that purge leaves the memory committed (its arena's
    #                                       committed bitmap keeps it): mimalloc's own figure drifts below it
    map_counted: bool = False             # its statistics count the page map's table (and first sub-map), as the
    #                                       system rounds them (from 3.2; 3.0 counts only the other sub-maps)
    main_cookie: bool = True              # the main heap's cookie is set at start (from 3.2 the static main theap
    #                                       serves only until the main thread's own is made)
    # mi_page_t: at the start of its first slice (or of the memory the system gave it)
    page: int = 120
    page_xthread_id: int = 0              # the owner's thread pointer | flags (1 in the full queue, 4 abandoned and mapped)
    page_free: int = 8
    page_used: int = 16                   # uint16: blocks in use, those on the thread-free list included
    page_capacity: int = 18               # uint16
    page_reserved: int = 20               # uint16
    page_local_free: int = 24
    page_thread_free: int = 32            # its lowest bit: owned
    page_block_size: int = 40
    page_start_field: int = 48            # its first block
    page_start: str = "address"           # page_start_field holds: its address; "words" (3.4): a uint32 count of
    #                                       words from the mi_page_t; "bytes" (3.6): a count of bytes from it
    page_meta_aligned: int = 0            # 3.6: the mi_page_t of each 64 KiB slice sit in a table at the start of
    #                                       each such aligned area (256 MiB); each slice's entry points (`self`, its
    #                                       first word) to its page's mi_page_t: that entry, or one at the page's start
    page_heap: int = 64                   # its thread's heap (from 3.2 its theap); NULL when abandoned
    page_next: int = 72
    page_prev: int = 80
    page_memid: int = 96                  # arena: (arena, slice index u32, slice count u32); system: (base, size)
    page_memkind: int = 112
    # mi_heap_t (from 3.2 mi_theap_t: the heap of one thread)
    heap_tld: int = 0
    heap_cookie: int | None = 16          # None: no cookie (3.6)
    heap_page_count: int = 160
    heap_next: int = 192
    heap_pages: int = 1248                # pages[MI_BIN_FULL + 1]: (first, last, block_size), 24 bytes each
    heap: int = 3072
    heap_thread_id: int | None = None     # the heap does not say its thread: its tld does
    heap_delayed_free: int | None = None  # no delayed-free list
    # mi_tld_t
    tld_thread_id: int = 0
    tld_subproc: int = 16
    tld_heap_backing: int = 24            # its backing heap (from 3.2: the first of its theaps)
    tld_heaps: int = 32
    # mi_subproc_t
    sub_arena_count: int = 0
    sub_arenas: int = 8
    max_arenas: int = 160
    # mi_arena_t: at the start of its memory
    arena_memkind: int = 16
    arena_initially_committed: int = 21
    arena_subproc: int = 24
    arena_slice_count: int = 32
    arena_info_slices: int = 40
    arena_bitmaps: int = 64               # slices_free (binned), slices_committed, slices_dirty, slices_purge, pages
    arena_pages: bool = True              # the arena holds a bitmap of its pages' first slices (to 3.1); from
    #                                       3.2 each heap holds one per arena (its arena_pages[arena's index])
    arena_index: int = 32                 # from 3.2: the arena's index in its subprocess
    arena_page_infos: int | None = None   # from 3.3: its pages' mi_page_t, one per slice, apart from the pages
    sub_heaps: int = 1368                 # from 3.2: the subprocess's list of heaps (mi_heap_t), linked by next
    sub_theap_meta: int | None = None     # 3.6: the theap mimalloc allocates its own data with (theaps, tlds), of no
    #                                       thread (its tld's thread id is 8, its pages' owner too)
    arena_start: int | None = None        # 3.6: the arena's memory starts here, not at its description (which
    #                                       follows the page table of the first aligned area)
    os_page_sizes: tuple[int, ...] = ()   # 3.6: a page taken from the system commits (and counts) only its slices,
    #                                       past its table: for a page of many blocks, one of these sizes (small,
    #                                       medium, large pages); for a page of one block, its block and the
    #                                       greatest offset of its start (cache_offset_max) in whole slices
    cache_offset_max: int = 0
    sub_stats: int | None = None          # 3.6: the subprocess's statistics (mi_stats_t): its size and version first,
    stats_shape: tuple[int, int] = (0, 0)  # as this release writes them; then the current reserved and committed
    stats_reserved: int = 0               # figures (what mi_stats_print and mi_process_info say)
    stats_committed: int = 0
    os_free_drifts: bool = False          # 3.6: freeing a page taken from the system takes its whole rounded
    #                                       reservation past its table off the committed figure, more than it counted
    page_map_header: int = 0              # 3.6: the page map is a structure (committed count, reserved size, memid,
    #                                       lock) before its table of sub-maps
    heap_list_next: int = 16
    heap_arena_pages: int = 752           # each heap's pointers to its pages in each arena (mi_arena_pages_t)
    bitmap_chunks: int = 128              # mi_bitmap_t: chunk_count, then the chunkmap, then 512-bit chunks
    bbitmap_chunks: int = 640             # mi_bbitmap_t: chunk_count, max accessed, chunkmap(s), chunk bins, chunks

    @property
    def slice_size(self) -> int:
        return 1 << self.slice_shift

    @property
    def segment_size(self) -> int:
        return self.slice_size


_V332 = Mi3Layout("3.3.2", (3, 3, 2), (3, 3, 2), queue_words=4, queue_size_word=3, stat_drifts=False, min_purge="thp2",
                  default_fn="mi_theap_get_default", page_heap=56, main_cookie=False, map_counted=True,
                  purge_counted=False, heap_cookie=32, heap_page_count=176, heap_next=224, heap_pages=1304, heap=8096,
                  tld_subproc=24, tld_heap_backing=32, tld_heaps=32, sub_arena_count=24, sub_arenas=32,
                  arena_slice_count=40, arena_info_slices=48, arena_bitmaps=104, arena_pages=False,
                  arena_page_infos=136, bbitmap_chunks=448)

_V301 = Mi3Layout("3.0.1", (3, 0, 1), (3, 0, 1))
_V314 = replace(_V301, versions="3.1.4 to 3.1.5", first=(3, 1, 4), last=(3, 1, 5), queue_words=4, queue_size_word=3,
                map_counted=True,
                heap_cookie=24, heap_page_count=168, heap_next=208, heap_pages=1264, heap=3688, tld_subproc=24,
                tld_heap_backing=32, tld_heaps=40, arena_bitmaps=80, bbitmap_chunks=384)

#: the layouts, oldest first
LAYOUTS3 = (_V301,
            _V314,
            replace(_V314, versions="3.1.6", first=(3, 1, 6), last=(3, 1, 6), bbitmap_chunks=448, min_purge="thp"),
            replace(_V332, versions="3.2.6 to 3.2.8", first=(3, 2, 6), last=(3, 2, 8), heap_cookie=24,
                    heap_page_count=168, heap_next=208, heap_pages=1288, heap=8048, arena_bitmaps=88,
                    arena_page_infos=None, purge_counted=True, stat_drifts=True, min_purge="thp"),
            replace(_V332, versions="3.3.0 to 3.3.1", first=(3, 3, 0), last=(3, 3, 1), purge_counted=True,
                    stat_drifts=True, min_purge="thp"),
            _V332,
            replace(_V332, versions="3.4.0 to 3.4.3", first=(3, 4, 0), last=(3, 4, 3), page=112, page_start="words",
                    page_memid=88, page_memkind=104, heap_cookie=40, heap_page_count=184, heap_next=232,
                    heap_pages=1312, heap=8104),
            replace(_V332, versions="3.6.0", first=(3, 6, 0), last=(3, 6, 0), page=128, page_meta_aligned=1 << 28,
                    page_xthread_id=8, page_free=16, page_local_free=24, page_block_size=32, page_used=40,
                    page_start_field=48, page_start="bytes", page_capacity=56, page_reserved=58,
                    page_thread_free=64, page_heap=72, page_next=88, page_prev=96, page_memid=104, page_memkind=120,
                    queue_words=5, heap_cookie=None, heap_tld=1032, heap_page_count=1312, heap_next=1368,
                    heap_pages=1400, heap=8904, sub_arena_count=32, sub_arenas=40, sub_heaps=1376,
                    sub_theap_meta=1424, heap_arena_pages=776, arena_index=32, arena_start=40, arena_slice_count=48,
                    arena_info_slices=56, arena_bitmaps=112, arena_page_infos=None, page_map_header=80,
                    mem_os=(3, 4, 5), mem_arena=6, os_page_sizes=(1 << 16, 1 << 19, 1 << 22), cache_offset_max=3968,
                    sub_stats=1544, stats_shape=(4480, 6), stats_reserved=56, stats_committed=80, os_free_drifts=True))


def layout3_for(version: tuple[int, int, int] | None) -> Mi3Layout | None:
    """The mimalloc 3 layout of VERSION, or None when heapwalk has measured none for it."""
    if version is None:
        return None
    return next((lay for lay in reversed(LAYOUTS3) if lay.first <= tuple(version) <= lay.last), None)
