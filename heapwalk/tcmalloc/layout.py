"""tcmalloc's structures as gperftools builds them, per version, as data (measured with gdb's ptype/o on builds
with debug information; checked against memory by discovery)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TcLayout", "LAYOUTS", "SPAN"]

#: bytes of a Span (start, length, next, prev, objects, bit fields); a list head is one
SPAN = 48


@dataclass(frozen=True)
class TcLayout:
    """Offsets of one range of gperftools versions' structures."""

    versions: str                           # "2.8-2.10": the releases measured to have it
    first: tuple[int, int]                  # the first release with it
    # CentralFreeList (padded to a multiple of 64 bytes in the array)
    central_size_class: int = 8
    central_empty: int = 16
    central_nonempty: int = 64
    central_num_spans: int = 112
    central_counter: int = 120
    central_slots: int = 128                # the transfer cache: (head, tail) of each batch
    central_used_slots: int = 1152
    central_stride: int = 1216
    transfer_entries: int = 64
    # SizeMap, from its class_to_size_ array
    sizemap_move_before: int = 512          # num_objects_to_move_ lies this far before class_to_size_
    sizemap_pages_after: int = 516          # class_to_pages_ lies this far after (8-aligned)
    classes_max: int = 128
    sizemap_count_after_pages: int = 1024   # num_size_classes, after class_to_pages_[128] (and, from 2.11, the
                                            # smallest span's pages)
    # PageHeap, from its free_ array
    free_list_pair: int = 2 * SPAN
    pagemap_before_free: int = 8 + (1 << 20) + 2 * SPAN   # root_[], its allocator, then the two large-span sets
    pagemap_root: int = 1 << 17              # entries of the page map's root (48-bit addresses, 8 KiB pages)
    pagemap_leaf: int = 1 << 18              # entries of each leaf
    stats_after_free: bool = True           # stats_ follows free_[kMaxPages]
    aggressive_after_stats: int = 100       # aggressive_decommit_ (a bool), after scavenge_counter_, release_index_
    # ThreadCache
    thread_list_entry: int = 32              # sizeof(FreeList)
    thread_list_length: int = 8              # FreeList::length_ (uint32)
    thread_size: int = 4096                  # size_ (int32), after list_[128]
    thread_max_size: int = 4100              # max_size_ (int32)
    thread_list_class_size: int = 24         # FreeList::size_ (int32): its class's object size
    thread_tid: int | None = 4128            # tid_ (pthread_t); None from 2.16
    thread_next: int = 4144
    thread_prev: int = 4152


#: the layouts, oldest first; a version's is the last whose first release is not newer (checked against memory)
LAYOUTS = (TcLayout("2.8-2.10", (2, 8)),
           TcLayout("2.11-2.15", (2, 11), sizemap_count_after_pages=1032),
           TcLayout("2.16-2.18", (2, 16), sizemap_count_after_pages=1032, thread_tid=None, thread_next=4128,
                    thread_prev=4136))
