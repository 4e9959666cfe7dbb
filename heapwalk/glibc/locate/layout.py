"""glibc malloc structure layouts, as data, per version (64-bit).

One `Layout` holds every offset and constant the walkers need: malloc_state
(the arena), heap_info, tcache_perthread_struct, malloc_par (``mp_``), and the
behaviours that changed between versions (safe-linking from 2.32, the top chunk
in malloc_info's "rest" from 2.31, count-down tcache slots from 2.42, no
fastbins from 2.43, the tcache entries' key, heaps sized by the huge page size
in 2.35-2.41): each era's behaviour is a field, decided here and read where it
matters, never a version compared elsewhere.  `layout_for(version)` picks the layout of an upstream
release; distributions backport changes, so callers confirm a layout against
memory (tcache chunk size, heap_info size, bin self-links) before trusting it.

Offsets come from glibc's struct definitions at each release tag and were
checked against Debian's 2.31, 2.36, 2.41 and 2.43 debug info
(see the project's glibc reference notes).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from heapwalk.common.errors import HeapwalkError

__all__ = ["Layout", "layout_for", "SIZE_SZ", "MALLOC_ALIGNMENT", "MINSIZE", "NBINS", "HEAP_MAX_SIZE",
           "PREV_INUSE", "IS_MMAPPED", "NON_MAIN_ARENA", "SIZE_BITS", "UnsupportedVersion"]

SIZE_SZ = 8
MALLOC_ALIGNMENT = 16
MINSIZE = 32
NBINS = 128
NSMALLBINS = 64
HEAP_MAX_SIZE = 64 << 20
PREV_INUSE, IS_MMAPPED, NON_MAIN_ARENA = 1, 2, 4
SIZE_BITS = 7


class UnsupportedVersion(HeapwalkError, ValueError):
    """No layout is known for this glibc version."""


@dataclass(frozen=True)
class Layout:
    """Offsets (bytes) and behaviours of one glibc version's malloc on a 64-bit target."""

    version: tuple[int, int]
    # struct malloc_state
    arena_size: int
    off_mutex: int
    off_flags: int
    off_have_fastchunks: int | None
    off_fastbins: int | None
    nfastbins: int
    off_top: int
    off_last_remainder: int
    off_bins: int
    off_binmap: int
    off_next: int
    off_next_free: int
    off_attached_threads: int | None
    off_system_mem: int
    off_max_system_mem: int
    # heap_info
    heap_info_size: int
    # tcache_perthread_struct (tcache_bins == 0: no tcache)
    tcache_bins: int
    tcache_count_size: int           # 1 (char) or 2 (uint16_t)
    tcache_off_entries: int
    tcache_struct_size: int
    tcache_counts_down: bool         # 2.42+: num_slots = remaining capacity
    tcache_fill_count: int           # default mp_.tcache_count
    safe_linking: bool
    # struct malloc_par mp_: field name -> offset
    mp: dict[str, int] = field(default_factory=dict)
    mp_size: int = 0
    # malloc_info: the top chunk counted in "rest" (2.31+), the fastbin lines (before 2.43), the indent of
    # the <aspace> lines (before 2.31)
    malloc_info_top_in_rest: bool = True
    malloc_info_fast: bool = True
    malloc_info_indent: str = ""
    mmap_chunk_rule_243: bool = False
    # what a tcache entry's second word holds: "" nothing (before 2.29), "tcache" its tcache's address
    # (2.29-2.33), "random" one random value per process (2.34+)
    tcache_key: str = ""
    # thread-arena heaps sized 4 x mp_.hp_pagesize when it is set (2.35-2.41)
    heaps_by_hugepages: bool = False

    def mmapped_span(self, prev_size: int, chunk_size: int) -> int:
        """Bytes of the mapping behind an mmapped chunk: prev_size is its front padding; from 2.43 the
        size field leaves out the chunk header (glibc 2.43's mmap chunk layout)."""
        return prev_size + chunk_size + (2 * SIZE_SZ if self.mmap_chunk_rule_243 else 0)

    @property
    def name(self) -> str:
        return f"glibc {self.version[0]}.{self.version[1]}"

    @property
    def has_fastbins(self) -> bool:
        return self.off_fastbins is not None

    @property
    def has_tcache(self) -> bool:
        return self.tcache_bins > 0

    @property
    def tcache_chunk_size(self) -> int:
        """Chunk size of the tcache_perthread_struct allocation (0x290 for 2.30-2.41)."""
        return max(MINSIZE, (self.tcache_struct_size + SIZE_SZ + MALLOC_ALIGNMENT - 1) & ~(MALLOC_ALIGNMENT - 1))

    @property
    def first_chunk_offset(self) -> int:
        """Offset of the first chunk in a thread arena's first heap (after heap_info and the arena)."""
        end = self.heap_info_size + self.arena_size
        return (end + MALLOC_ALIGNMENT - 1) & ~(MALLOC_ALIGNMENT - 1)

    def bin_header(self, arena: int, index: int) -> int:
        """Address of bin INDEX's fake chunk (bin_at): its fd/bk are the bin's two slots."""
        return arena + self.off_bins + 16 * (index - 1) - 16


def _arena_fields(v: tuple[int, int]) -> dict:
    if v >= (2, 43):
        return dict(arena_size=2112, off_mutex=0, off_flags=4, off_have_fastchunks=None, off_fastbins=None,
                    nfastbins=0, off_top=8, off_last_remainder=16, off_bins=24, off_binmap=2056, off_next=2072,
                    off_next_free=2080, off_attached_threads=2088, off_system_mem=2096, off_max_system_mem=2104)
    if v >= (2, 27):
        return dict(arena_size=2200, off_mutex=0, off_flags=4, off_have_fastchunks=8, off_fastbins=16,
                    nfastbins=10, off_top=96, off_last_remainder=104, off_bins=112, off_binmap=2144, off_next=2160,
                    off_next_free=2168, off_attached_threads=2176, off_system_mem=2184, off_max_system_mem=2192)
    if v >= (2, 23):
        return dict(arena_size=2192, off_mutex=0, off_flags=4, off_have_fastchunks=None, off_fastbins=8,
                    nfastbins=10, off_top=88, off_last_remainder=96, off_bins=104, off_binmap=2136, off_next=2152,
                    off_next_free=2160, off_attached_threads=2168, off_system_mem=2176, off_max_system_mem=2184)
    return dict(arena_size=2184, off_mutex=0, off_flags=4, off_have_fastchunks=None, off_fastbins=8,
                nfastbins=10, off_top=88, off_last_remainder=96, off_bins=104, off_binmap=2136, off_next=2152,
                off_next_free=2160, off_attached_threads=None, off_system_mem=2168, off_max_system_mem=2176)


def _tcache_fields(v: tuple[int, int]) -> dict:
    if v < (2, 26):
        return dict(tcache_bins=0, tcache_count_size=0, tcache_off_entries=0, tcache_struct_size=0,
                    tcache_counts_down=False, tcache_fill_count=0)
    if v < (2, 30):
        return dict(tcache_bins=64, tcache_count_size=1, tcache_off_entries=64, tcache_struct_size=576,
                    tcache_counts_down=False, tcache_fill_count=7)
    if v < (2, 42):
        return dict(tcache_bins=64, tcache_count_size=2, tcache_off_entries=128, tcache_struct_size=640,
                    tcache_counts_down=False, tcache_fill_count=7)
    return dict(tcache_bins=76, tcache_count_size=2, tcache_off_entries=152, tcache_struct_size=760,
                tcache_counts_down=True, tcache_fill_count=16 if v >= (2, 43) else 7)


_MP_COMMON = dict(trim_threshold=0, top_pad=8, mmap_threshold=16, arena_test=24, arena_max=32)


def _mp_fields(v: tuple[int, int]) -> tuple[dict[str, int], int]:
    mp = dict(_MP_COMMON)
    if v >= (2, 43):
        mp.update(thp_mode=40, thp_pagesize=48, hp_pagesize=56, hp_flags=64, n_mmaps=68, n_mmaps_max=72,
                  max_n_mmaps=76, no_dyn_threshold=80, mmapped_mem=88, max_mmapped_mem=96, sbrk_base=104,
                  tcache_bins=112, tcache_max_bytes=120, tcache_count=128, tcache_unsorted_limit=136)
        return mp, 144
    if v >= (2, 35):
        mp.update(thp_pagesize=40, hp_pagesize=48, hp_flags=56, n_mmaps=60, n_mmaps_max=64, max_n_mmaps=68,
                  no_dyn_threshold=72, mmapped_mem=80, max_mmapped_mem=88, sbrk_base=96, tcache_bins=104,
                  tcache_max_bytes=112, tcache_count=120, tcache_unsorted_limit=128)
        return mp, 136
    mp.update(n_mmaps=40, n_mmaps_max=44, max_n_mmaps=48, no_dyn_threshold=52, mmapped_mem=56, max_mmapped_mem=64)
    if v >= (2, 26):
        mp.update(sbrk_base=72, tcache_bins=80, tcache_max_bytes=88, tcache_count=96, tcache_unsorted_limit=104)
        return mp, 112
    if v >= (2, 24):
        mp.update(sbrk_base=72)
        return mp, 80
    mp.update(max_total_mem=72, sbrk_base=80)
    return mp, 88


#: mp_ fields that are C ints (4 bytes); all others are 8-byte words.
MP_INT_FIELDS = frozenset({"n_mmaps", "n_mmaps_max", "max_n_mmaps", "no_dyn_threshold", "hp_flags", "thp_mode"})

OLDEST, NEWEST = (2, 17), (2, 43)


def layout_for(version: tuple[int, int]) -> Layout:
    """The 64-bit layout of upstream glibc VERSION (major, minor), 2.17 to 2.43."""
    if not (OLDEST <= version <= NEWEST):
        raise UnsupportedVersion(f"no malloc layout for glibc {version[0]}.{version[1]} "
                                 f"(known: {OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]})")
    mp, mp_size = _mp_fields(version)
    return Layout(
        version=version,
        heap_info_size=48 if version >= (2, 35) else 32,
        safe_linking=version >= (2, 32),
        mp=mp,
        mp_size=mp_size,
        malloc_info_top_in_rest=version >= (2, 31),
        malloc_info_fast=version < (2, 43),
        malloc_info_indent="" if version >= (2, 31) else "\t" * 7 + " " * 6,
        mmap_chunk_rule_243=version >= (2, 43),
        tcache_key="" if version < (2, 29) else "tcache" if version < (2, 34) else "random",
        heaps_by_hugepages=(2, 35) <= version < (2, 42),
        **_arena_fields(version),
        **_tcache_fields(version),
    )
