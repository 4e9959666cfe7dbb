"""mimalloc's structures as its releases build them, as data (measured with gdb's ptype/o on builds of the
release tags with debug information, 64-bit, MI_SECURE 0, MI_DEBUG 0; checked against memory by discovery)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MiLayout", "LAYOUTS", "layout_for"]


@dataclass(frozen=True)
class MiLayout:
    """Offsets of one family of mimalloc releases' structures (64-bit)."""

    versions: str                         # "2.0": the releases measured to have it
    first: tuple[int, int]                # the first release with it
    slice_shift: int = 16                 # a slice: 64 KiB
    segment_shift: int = 25               # a segment: 32 MiB, aligned to its size
    segment_map_words: int = 10241       # the segment map: a bit per segment of 20 TiB of addresses, and one word
    max_align_guarantee: int = 128        # a page of blocks up to 1 KiB starts 3 times this after its slice
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
    seg_thread_id: int = 256              # the owning thread's $fs_base (0: abandoned)
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

    @property
    def segment_header(self) -> int:
        """Bytes of a segment's header with its slices (one more than a segment holds, for huge blocks)."""
        return self.seg_slices + (self.slices_per_segment + 1) * self.page


#: the layouts, oldest first
LAYOUTS = (MiLayout("2.0", (2, 0)),)


def layout_for(version: tuple[int, int] | None) -> MiLayout | None:
    """The layout of VERSION (major, minor), or None when heapwalk has measured none for it."""
    if version is None:
        return None
    fits = [lay for lay in LAYOUTS if lay.first[0] == version[0] and lay.first <= version]
    return fits[-1] if fits and version[:2] == fits[-1].first else None
