"""The kinds of findings only glibc's malloc has, beside those every allocator may meet (`heapwalk.common.findings`):
their titles use glibc's own words, its abort message in parentheses where glibc checks the same thing.
`Kind` here holds both, so glibc's modules name every kind through it."""

from __future__ import annotations

from heapwalk.common import findings

__all__ = ["Kind"]


class Kind(findings.Kind):
    """A kind of finding of glibc's heap (the shared kinds are inherited)."""


Kind.LIST_TOO_LONG = Kind("list_too_long", "list longer than its arena could hold")
Kind.MUTEX_HELD = Kind("mutex_held", "arena mutex held at snapshot time (lists may be mid-update)")
Kind.TLS_LOST = Kind("thread_tls_lost", "thread's TLS not in the core (its arena and tcache found by scanning)")
Kind.INTERRUPTED = Kind("interrupted", "the chunk walk was stopped (Ctrl-C)")
Kind.MISALIGNED = Kind("misaligned", "misaligned chunk pointer (\"unaligned tcache/fastbin chunk detected\")")
Kind.FD_BK = Kind("fd_bk_mismatch", "fd->bk != p (\"corrupted double-linked list\")")
Kind.PREV_SIZE = Kind("prev_size_mismatch", "chunk size does not match next chunk's prev_size "
                 "(\"corrupted size vs. prev_size\")")
Kind.FASTBIN_SIZE = Kind("fastbin_size", "fastbin entry of wrong size (\"memory corruption (fast)\")")
Kind.BIN_SIZE = Kind("bin_size", "chunk in the wrong bin for its size")
Kind.TCACHE_KEY = Kind("tcache_key", "tcache entry's key overwritten (a write after free)")
Kind.FREE_IN_USE = Kind("free_chunk_in_use", "chunk in a bin, but the next chunk says it is in use "
                   "(\"double free or corruption (!prev)\")")
Kind.OVERLAPS_TOP = Kind("overlaps_top", "free chunk overlaps top")
Kind.OUTSIDE_HEAP = Kind("outside_heap", "free chunk outside its arena's heaps")
Kind.CHUNK_SIZE = Kind("chunk_size", "impossible chunk size in the heap walk (\"invalid size\")")
Kind.FREE_UNLISTED = Kind("free_unlisted", "free chunk in no list (PREV_INUSE of the next chunk cleared)")
Kind.TOP_SIZE = Kind("top_size", "top chunk runs past its heap, or ends short of it (\"corrupted top size\")")
Kind.LINK_OUTSIDE = Kind("link_outside_heap", "a free list's link leads outside every heap (a poisoned next or fd)")
Kind.INSIDE_CHUNK = Kind("free_inside_chunk", "a free-list entry lies inside another chunk (overlapping chunks)")
Kind.MMAPPED_OVERLAP = Kind("mmapped_overlap", "an mmapped chunk runs over another, or past its mapping")
Kind.MP_FIELD = Kind("mp_field", "a malloc parameter (mp_) holds a value glibc cannot set")
Kind.NEXTSIZE = Kind("nextsize_mismatch", "large bin nextsize links broken "
                "(\"corrupted double-linked list (not small)\")")
Kind.LARGE_ORDER = Kind("large_bin_order", "large bin not sorted by size")
Kind.ARENA_BIT = Kind("arena_bit", "NON_MAIN_ARENA flag does not match the chunk's arena")
Kind.BINMAP = Kind("binmap", "non-empty bin not marked in the binmap")
Kind.FASTCHUNKS = Kind("have_fastchunks", "fastbins hold chunks but have_fastchunks is false")
Kind.ARENA_RING = Kind("arena_ring", "arena ring or free list broken")
Kind.HEAP_INFO = Kind("heap_info", "heap_info chain broken")
Kind.MMAPPED = Kind("mmapped", "mmapped chunks disagree with mp_")
Kind.ABORT = Kind("abort", "glibc aborted the process")
Kind.CRASH_POINTER = Kind("crash_pointer", "the crashing thread's stack points at a free chunk")
