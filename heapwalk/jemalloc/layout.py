"""jemalloc's structures per version, as data: the offsets heapwalk reads in arena_t, its extent containers,
decay state, statistics and bins, and in each thread's tsd (the TLS block).

Measured on Debian's libjemalloc2 builds (5.2.1-3 in bullseye, 5.3.0-1 in bookworm and trixie) against
rebuilds of the same tags with debug information, and on 5.1.0's release tag built with debug information; every offset is checked against memory when a target is
decoded (`heapwalk.jemalloc.discovery`).  Byte offsets, 64-bit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from heapwalk.common.errors import HeapwalkError
from heapwalk.jemalloc.sizeclasses import SizeClasses, size_classes

__all__ = ["JeLayout", "LAYOUTS", "PROF_LAYOUTS", "QUANTA", "quantum_of", "layout_for", "quantum_phrase", "UnsupportedJemalloc", "BIN_STATS"]


class UnsupportedJemalloc(HeapwalkError, ValueError):
    """No layout is known for this jemalloc version."""


@dataclass(frozen=True)
class JeLayout:
    """Where jemalloc keeps what heapwalk reads, in one version."""

    version: tuple[int, int, int]
    arena_size: int                       # arena_t up to its bins
    nthreads: int                         # u32[2]: threads using the arena (external, internal)
    nactive: int                          # pages in active extents
    dirty_npages: tuple[int, ...]         # the dirty extent containers' page counts (5.3.0: eset + guarded eset)
    muzzy_npages: tuple[int, ...]
    retained_npages: tuple[int, ...]
    dirty_state: int                      # the dirty container's state field (1), a check of the layout
    muzzy_state: int                      # (2)
    retained_state: int                   # (3)
    dirty_decay_ms: int                   # decay_t.time_ms of the dirty and muzzy decay
    muzzy_decay_ms: int
    stats: int                            # arena_stats_t
    stats_dirty: int                      # {npurge, nmadvise, purged} of dirty decay, in arena_stats_t
    stats_muzzy: int
    lstats: int                           # arena_stats_large_t[196] (48 bytes each) in arena_t
    stats_mapped: int                     # the arena's mapped bytes (5.3.0: its page allocator's, pac_mapped)
    stats_internal: int                   # bytes of internal allocations (arena_internal_get)
    base_counters: int                    # base_t {allocated, resident, mapped, n_thp}, 8 bytes each
    resident_muzzy: bool                  # does malloc_stats_print count muzzy pages as resident? (5.2.1)
    extent_stats: tuple[tuple[tuple[int, int, int], ...], ...]  # dirty, muzzy, retained: per container
    #                                       (nextents[], nbytes[], stride) of its extents by page size class
    bins: int                             # 5.2.1: bins_t[36] (pointers to shard arrays); 5.3.0: bin_t inline
    bins_inline: bool
    bin_size: int                         # bin_t
    bin_stats: int                        # bin_stats_t in bin_t: nmalloc, ndalloc, nrequests, curregs,
    #                                       nfills, nflushes, nslabs, reslabs, curslabs, nonfull_slabs
    index_field: int | None               # arena_t.ind (5.3.0); None: the index is base_t.ind
    base: int                             # arena_t.base
    base_ind: int | None                  # base_t.ind (5.2.1)
    tsd_state: int                        # tsd_t.state (u8; 0 nominal, 6 never initialised)
    tsd_arena: int                        # tsd_t.arena (arena_t *)
    tsd_allocated: int                    # thread_allocated, then thread_deallocated 8 bytes... apart
    tsd_deallocated: int
    tsd_tdata: int | None                 # 5.2.1: arenas_tdata (per-arena decay tickers) and narenas_tdata
    tsd_ntdata: int | None
    tsd_ticker: int | None                # 5.3.0: the one decay ticker {tick, nticks}
    tsd_size: int                         # the whole TLS block (PT_TLS memsz): checks the version
    tcache_descriptors: int               # arena_t.cache_bin_array_descriptor_ql: the arena's thread caches
    descriptor_bins: tuple[int, ...]      # in a descriptor {next, prev, bins...}: its pointers to cache_bin_t
    #                                       arrays (5.2.1: small, large; 5.3.0: one array)
    tsd_tcache_bins: tuple[int, ...]      # the same arrays in the tsd's own tcache
    tsd_tcache_arena: int                 # the arena its tcache is associated with (arena_t *)
    cache_bins: int                       # cache_bin_t slots in the tsd's tcache (5.2.1: 36 small, 196 large)
    stack_cache_bins: bool                # 5.3.0: ncached from stack_head's low 16 bits and low_bits_empty;
    #                                       5.2.1: the i32 ncached field
    rtree_root: int                       # the radix tree of extents (5.2.1 extents_rtree, 5.3.0 the emap's):
    #                                       its root[] of leaf pointers
    rtree_extent_mask: int                # low bits of a leaf entry that are not the extent's address
    extent_state_shift: int = 16          # an extent's e_bits: its state (0 active, 1 dirty, 2 muzzy, 3 retained)
    extent_state_mask: int = 3
    extent_szind_shift: int = 18          # its size class (8 bits) and its slab's free regions (10 bits); its
    extent_nfree_shift: int = 26          # arena is bits 0-11 and the slab bit 12 in both versions
    classes: SizeClasses = size_classes(4)  # the size classes (a 16-byte quantum)
    #                                       a decay_t (from its time_ms, at dirty_decay_ms / muzzy_decay_ms):
    debug: bool = False                   # built with --enable-debug
    prof: bool = False                    # built with --enable-prof, where that changes the layout
    decay_epoch: int = 16                 # its epoch (nstime_t: ns of CLOCK_MONOTONIC) when it last stepped
    decay_deadline: int = 32              # when its next step is due
    base_blocks: int = 144                # base_t.blocks: its list of blocks {size, next, ...}, each mapped whole
    bin_slabcur: int = 112                # bin_t.slabcur: the slab the bin allocates from now (not among the
    #                                       slabs it calls not full)
    lstats_stride: int = 48               # arena_stats_large_t: {nmalloc, ndalloc, nrequests, nfills, nflushes, ...}
    rtree_meta_packed: bool = False       # a wide radix tree entry's metadata word packs the size class above
    #                                       the slab bit (5.3.0 and later); before, they are two fields
    large_paged: bool = False             # large allocations are page multiples unless opt.disable_large_size_classes
    #                                       says otherwise (5.3.1's default)
    lstats_flushes: bool = True           # does it count fills and flushes (5.1.0 does not: nflushes is None)
    bin_nonfull: bool = True              # does bin_stats_t count nonfull_slabs (5.1.0 does not: counted from the
    #                                       extents instead)
    extent_lru_link: int = 64             # an extent header's link on its container's ring of free extents (5.3.0:
    #                                       edata_t.ql_link_inactive; 5.1.0, 5.2.1: extent_t.ql_link, 24); the ring's
    #                                       head is the word before each container's page count
    mutex_size: int = 112                 # malloc_mutex_t, and its "locked" flag (5.2 and later)
    mutex_locked: int = 104
    tsd_states: tuple[int, ...] | None = None   # the tsd's states in 5.2's numbering, by this version's value
    #                                       (5.1.0 has no nominal_recompute: its 2..5 are 5.2's 3..6); None: the same
    base_fields: tuple[int, int, int, int] = (0, 8, 16, 24)  # base_t's allocated, resident, mapped and n_thp,
    #                                       from base_counters (5.3.1 keeps its edata and rtree bytes between)
    base_metadata: tuple[int, int] | None = None  # base_t's edata_allocated and rtree_allocated, from
    #                                       base_counters (5.3.1), None where the base does not count them apart
    lstats_fields: tuple[int, int, int, int] = (0, 8, 16, 32)  # nmalloc, ndalloc, nrequests, nflushes in an
    #                                       arena_stats_large_t (5.3.1 keeps active_bytes before nrequests)
    lstats_active: int | None = None      # its active_bytes (5.3.1), None where the class size times the count
    #                                       is the bytes
    abandoned_vm: int | None = None       # arena_t's statistics' bytes of address space given up on (5.2 and later)
    extent_avail: int | None = None       # how many spare extent headers the arena keeps (5.2.1: extent_avail_cnt;
    #                                       5.3: its edata cache's count)
    create_time: int | None = None        # when the arena was made (nstime_t: ns of jemalloc's clock)
    tsd_tcache_stacks: tuple[int, int] = (256 + 160, 0)     # the internal allocation that holds the thread
    #                                       cache's stacks: (where in the tsd a pointer into it is, how far into it
    #                                       that pointer is): 5.3.0's tcache_slow_t.dyn_alloc; 5.2.1's first small
    #                                       cache bin's avail, past its 200 slots

    @property
    def page(self) -> int:
        """The build's page (LG_PAGE: 4 KiB unless configured --with-lg-page)."""
        return self.classes.page

    @property
    def nfree_mask(self) -> int:
        """The bits of an extent's count of its slab's free regions (up to a slab's most regions, inclusive)."""
        return (self.classes.slab_maxregs << 1) - 1

    @property
    def slab_bitmap_bytes(self) -> int:
        """The bytes of a slab's bitmap that hold a bit per region (its first level, where it is a tree)."""
        return self.classes.slab_maxregs // 8

    @property
    def name(self) -> str:
        quantum = "" if self.classes.lg_quantum == 4 else f" with {quantum_phrase(self.classes.lg_quantum)}"
        if self.classes.lg_page != 12:
            quantum += f" for {self.page >> 10} KiB pages"
        debug = " built with --enable-debug" if self.debug else ""
        prof = " built with --enable-prof" if self.prof else ""
        return "jemalloc %d.%d.%d" % self.version + quantum + debug + prof


def quantum_phrase(lg_quantum: int) -> str:
    """'an 8-byte quantum', 'a 16-byte quantum': a quantum of 2**LG_QUANTUM bytes in words."""
    size = 1 << lg_quantum
    return f"{'an' if str(size)[0] == '8' else 'a'} {size}-byte quantum"


def _extents_521(container: int, mutex_growth: int = 0) -> tuple[int, int, int]:
    """An extents_t's nextents[] and nbytes[] (after its mutex, MUTEX_GROWTH bytes longer in a debug build)."""
    return container + 1712 + mutex_growth, container + 3312 + mutex_growth, 8


def _extents_530(ecache: int, esets: tuple[int, int] = (112, 9768), stats: int = 6432
                 ) -> tuple[tuple[int, int, int], ...]:
    """An ecache's eset and guarded eset (at ESETS in it): their bin_stats[] {nextents, nbytes}, STATS bytes into
    each."""
    return tuple((ecache + eset + stats, ecache + eset + stats + 8, 16) for eset in esets)


#: bin_stats_t's fields, in order, 8 bytes each (both versions)
BIN_STATS = ("nmalloc", "ndalloc", "nrequests", "curregs", "nfills", "nflushes", "nslabs", "reslabs", "curslabs",
             "nonfull_slabs")

LAYOUTS = {
    (5, 2, 1): JeLayout(
        version=(5, 2, 1), arena_size=29496, nthreads=0, nactive=10344,
        dirty_npages=(10472 + 4952,), muzzy_npages=(15440 + 4952,), retained_npages=(20408 + 4952,),
        dirty_state=10472 + 4960, muzzy_state=15440 + 4960, retained_state=20408 + 4960,
        dirty_decay_ms=25376 + 120, muzzy_decay_ms=27160 + 120,
        stats=24, stats_dirty=24 + 24, stats_muzzy=24 + 48, lstats=24 + 744,
        stats_mapped=24, stats_internal=24 + 80, base_counters=2008, resident_muzzy=True,
        extent_stats=((_extents_521(10472),), (_extents_521(15440),), (_extents_521(20408),)),
        bins=29192, bins_inline=False, bin_size=280, bin_stats=136,
        index_field=None, base=29480, base_ind=0,
        tsd_state=0, tsd_arena=440, tsd_allocated=16, tsd_deallocated=24, tsd_tdata=448, tsd_ntdata=4,
        tsd_ticker=None, tsd_size=0x1848, tcache_descriptors=10192, descriptor_bins=(16, 24),
        tsd_tcache_bins=(496 + 16, 496 + 1000), tsd_tcache_arena=496 + 952, cache_bins=36 + 196,
        stack_cache_bins=False, rtree_root=112, rtree_extent_mask=1, tsd_tcache_stacks=(496 + 16 + 16, 200 * 8),
        extent_lru_link=24, abandoned_vm=24 + 152, extent_avail=29072, create_time=29488),
    (5, 3, 0): JeLayout(
        version=(5, 3, 0), arena_size=78952, nthreads=0, nactive=10656,
        dirty_npages=(20480, 30136), muzzy_npages=(39920, 49576), retained_npages=(59360,),
        dirty_state=10728 + 19424, muzzy_state=30168 + 19424, retained_state=49608 + 19424,
        dirty_decay_ms=10672 + 58648 + 120, muzzy_decay_ms=10672 + 60432 + 120,
        stats=24, stats_dirty=24 + 96, stats_muzzy=24 + 120, lstats=24 + 952,
        stats_mapped=24 + 152, stats_internal=24 + 32, base_counters=3880, resident_muzzy=False,
        extent_stats=(_extents_530(10728), _extents_530(30168), _extents_530(49608)),
        bins=78952, bins_inline=True, bin_size=224, bin_stats=112,
        index_field=78928, base=78936, base_ind=None,
        tsd_state=816, tsd_arena=144, tsd_allocated=824, tsd_deallocated=840, tsd_tdata=None, tsd_ntdata=None,
        tsd_ticker=152, tsd_size=0xa48, tcache_descriptors=10400, descriptor_bins=(16,),
        tsd_tcache_bins=(856 + 8,), tsd_tcache_arena=256 + 40, cache_bins=73, stack_cache_bins=True,
        rtree_root=120, rtree_extent_mask=127, extent_state_shift=17, extent_state_mask=7, extent_szind_shift=20,
        rtree_meta_packed=True,
        base_blocks=160, bin_slabcur=192,
        extent_nfree_shift=28, abandoned_vm=24 + 160, extent_avail=78760, create_time=78944),
}


#: jemalloc 5.2.1 with an 8-byte quantum (Redis 6 and 7.0's vendored copy): 39 small classes, so arena_t's
#: bins[], base_t's heaps by size class and the tcache's small bins are three longer (measured on Redis
#: 7.0.15's deps/jemalloc built with debug information)
LAYOUTS[(5, 2, 1, 3)] = dataclasses.replace(
    LAYOUTS[(5, 2, 1)], arena_size=29520, base=29504, create_time=29512, base_counters=2032, tsd_size=0x1898,
    tsd_tcache_bins=(496 + 16, 496 + 1080), tsd_tcache_arena=496 + 1024, cache_bins=39 + 196,
    classes=size_classes(3))
#: jemalloc 5.3.0 built for 64 KiB pages (--with-lg-page=16, as Debian builds it for arm64, whatever the
#: kernel's page) where a pthread_mutex_t is 48 bytes (arm64): 52 small classes and 180 large ones, so arena_t's
#: large statistics shrink, its extent containers hold 184 page size classes, the tsd's per-class thread cache
#: state grows, and a slab's bitmap holds 8192 regions; every mutex (malloc_mutex_t, 120 bytes) moves what follows
#: it (measured on Debian's source package of 5.3.0 cross-built for aarch64 --with-lg-page=16 with debug
#: information, the same reading of its types giving the layout above from the x86-64 build)
LAYOUTS[(5, 3, 0, "page16", "mutex48")] = dataclasses.replace(
    LAYOUTS[(5, 3, 0)], arena_size=73624, nactive=9904, dirty_npages=(18960, 27840), muzzy_npages=(36856, 45736),
    retained_npages=(54752,), dirty_state=27856, muzzy_state=45752, retained_state=63648, dirty_decay_ms=64080,
    muzzy_decay_ms=65872, base_counters=3888,
    extent_stats=tuple(_extents_530(ecache, (120, 9000), 5912) for ecache in (9976, 27872, 45768)),
    bins=73624, bin_size=232, bin_stats=120, index_field=73600, base=73608, tsd_state=880, tsd_allocated=888,
    tsd_deallocated=904, tsd_size=2696, tcache_descriptors=9632, tsd_tcache_bins=(928,), tsd_tcache_arena=312,
    rtree_root=128, base_blocks=168, bin_slabcur=200, mutex_size=120, mutex_locked=112, extent_avail=73424,
    create_time=73616, tsd_tcache_stacks=(480, 0), classes=size_classes(4, 16))
#: jemalloc 5.3.0 with an 8-byte quantum (Redis 7.2 and later vendor it so): the tcache's per-class flush
#: state before its bins and its bins (76) grow, moving the tsd's state and counters by 16 bytes; base_t's heaps
#: by size class are three longer (measured on jemalloc 5.3.0 built --with-lg-quantum=3 with debug information)
LAYOUTS[(5, 3, 0, 3)] = dataclasses.replace(
    LAYOUTS[(5, 3, 0)], tsd_state=832, tsd_allocated=840, tsd_deallocated=856, tsd_size=0xAA0,
    tsd_tcache_bins=(872 + 8,), cache_bins=76, base_counters=3928, tsd_tcache_stacks=(256 + 176, 0),
    classes=size_classes(3))
#: jemalloc 5.1.0 (Debian buster's libjemalloc2): mutexes of 104 bytes, the bins inline in arena_t, no
#: counts of free extents by size (counted from the extents), no nonfull_slabs in a bin's statistics, large
#: classes counting {nmalloc, ndalloc, nrequests, curlextents} (measured on the release tag built with debug
#: information)
LAYOUTS[(5, 1, 0)] = dataclasses.replace(
    LAYOUTS[(5, 2, 1)], version=(5, 1, 0), arena_size=25864, nactive=7168,
    dirty_npages=(7288 + 1744,), muzzy_npages=(9048 + 1744,), retained_npages=(10808 + 1744,),
    dirty_state=7288 + 1752, muzzy_state=9048 + 1752, retained_state=10808 + 1752,
    dirty_decay_ms=12568 + 112, muzzy_decay_ms=14344 + 112,
    stats=16, stats_dirty=16 + 16, stats_muzzy=16 + 40, lstats=16 + 712, lstats_stride=32, lstats_flushes=False,
    stats_mapped=16, stats_internal=16 + 72, base_counters=2000, extent_stats=(),
    bins=16344, bins_inline=True, bin_size=264, bin_stats=128, bin_nonfull=False, base=25848,
    tsd_arena=432, tsd_tdata=440, tsd_size=0x1800, tcache_descriptors=7016,
    tsd_tcache_bins=(448 + 16, 448 + 976), tsd_tcache_arena=448 + 928, rtree_root=104, base_blocks=136,
    bin_slabcur=104, tsd_tcache_stacks=(448 + 16 + 16, 200 * 8), tsd_states=(0, 1, 3, 4, 5, 6), mutex_size=104,
    mutex_locked=-1, abandoned_vm=None, extent_avail=None, create_time=25856)
#: jemalloc 5.3.0 built with --enable-debug: each mutex carries a witness (184 bytes, its "locked" flag at 120),
#: each nstime_t a magic word (16 bytes), so arena_t's page allocator, decay state, statistics and bins move,
#: and base_t's counters; the tsd and the extents' headers are the same (measured on the release built
#: --enable-debug with debug information)
LAYOUTS[(5, 3, 0, "debug")] = dataclasses.replace(
    LAYOUTS[(5, 3, 0)], arena_size=80080, nactive=11000, dirty_npages=(20896, 30552), muzzy_npages=(40408, 50064),
    retained_npages=(59920,), dirty_state=11072 + 19496, muzzy_state=30584 + 19496, retained_state=50096 + 19496,
    dirty_decay_ms=70216, muzzy_decay_ms=72096, decay_epoch=24, decay_deadline=48, lstats=24 + 1144,
    base_counters=3952, base_blocks=232,
    extent_stats=tuple(tuple((ecache + eset + 6432, ecache + eset + 6440, 16) for eset in (184, 9840))
                       for ecache in (11072, 30584, 50096)),
    bins=80080, bin_size=296, bin_stats=184, bin_slabcur=264, index_field=80048, base=80056,
    tcache_descriptors=10600, rtree_root=192, mutex_size=184, mutex_locked=120, debug=True, extent_avail=79808,
    create_time=80064)
#: jemalloc 5.3.1 (April 2026): arena_t's statistics, its page allocator and its tsd move (fewer event
#: counters in the tsd, 41 cache bins for a 32 KiB tcache_max limit, each with its own ncached_max), base_t
#: counts its extent headers' and radix tree's bytes between allocated and resident, and a large class counts
#: active_bytes before nrequests (measured on the release tag built with debug information)
LAYOUTS[(5, 3, 1)] = dataclasses.replace(
    LAYOUTS[(5, 3, 0)], version=(5, 3, 1), arena_size=80704, nactive=12296, large_paged=True,
    dirty_npages=(22104, 31760), muzzy_npages=(41544, 51200), retained_npages=(60984,),
    dirty_state=22112, muzzy_state=41552, retained_state=60992, dirty_decay_ms=71064, muzzy_decay_ms=72848,
    stats_dirty=24 + 112, stats_muzzy=24 + 136, lstats=24 + 968, lstats_stride=56, lstats_fields=(0, 8, 24, 40),
    lstats_active=16,
    stats_mapped=24 + 168, stats_internal=24 + 48, base_counters=3896, base_fields=(0, 24, 32, 40), base_metadata=(8, 16),
    extent_stats=(_extents_530(12352), _extents_530(31792), _extents_530(51232)),
    bins=80704, index_field=80640, base=80648, tcache_descriptors=11984,
    tsd_state=920, tsd_arena=200, tsd_allocated=928, tsd_deallocated=944, tsd_ticker=208, tsd_size=1968,
    tsd_tcache_bins=(968,), tsd_tcache_arena=336, cache_bins=41, tsd_tcache_stacks=(520, 0), abandoned_vm=24 + 176,
    extent_avail=80464, create_time=80656)
#: jemalloc 5.3.1 built with --enable-prof (Debian sid's): its tsd keeps one more word for profiling ahead of
#: iarena, moving every field after it by 8 bytes; arena_t is the same (measured on the release tag built
#: --enable-prof with debug information)
LAYOUTS[(5, 3, 1, "prof")] = dataclasses.replace(
    LAYOUTS[(5, 3, 1)], tsd_state=928, tsd_arena=208, tsd_allocated=936, tsd_deallocated=952, tsd_ticker=216,
    tsd_size=1976, tsd_tcache_bins=(976,), tsd_tcache_arena=344, tsd_tcache_stacks=(528, 0), prof=True)
#: the versions whose layout --enable-prof changes (their layouts with it are keyed with "prof")
PROF_LAYOUTS = {(5, 3, 1)}
#: jemalloc 5.3.0 built with --enable-debug and an 8-byte quantum: the debug build's arena_t and the 8-byte
#: quantum's tsd and base_t (measured on that build with debug information)
LAYOUTS[(5, 3, 0, 3, "debug")] = dataclasses.replace(
    LAYOUTS[(5, 3, 0, "debug")], tsd_state=832, tsd_allocated=840, tsd_deallocated=856, tsd_size=0xAA0,
    tsd_tcache_bins=(872 + 8,), cache_bins=76, base_counters=4000, tsd_tcache_stacks=(256 + 176, 0),
    classes=size_classes(3))
#: jemalloc 5.2.1 built with --enable-debug: each mutex carries a witness (168 bytes, 56 more), which moves
#: arena_t's extent containers, decay state and bins, base_t's counters and blocks, the radix tree's root and
#: bin_t's fields; its statistics, tsd and extent headers are 5.2.1's (measured on the release tag built
#: --enable-debug with debug information)
LAYOUTS[(5, 2, 1, "debug")] = dataclasses.replace(
    LAYOUTS[(5, 2, 1)], arena_size=30000, nactive=10400,
    dirty_npages=(10584 + 5008,), muzzy_npages=(15608 + 5008,), retained_npages=(20632 + 5008,),
    dirty_state=10584 + 5016, muzzy_state=15608 + 5016, retained_state=20632 + 5016,
    dirty_decay_ms=25656 + 176, muzzy_decay_ms=27496 + 176,
    extent_stats=tuple((_extents_521(container, 56),) for container in (10584, 15608, 20632)),
    base_counters=2064, base_blocks=200, bins=29696, bin_size=336, bin_stats=192, bin_slabcur=168, base=29984,
    rtree_root=168, mutex_size=168, debug=True, extent_avail=29520, create_time=29992)
#: jemalloc 5.1.0 built with --enable-debug: mutexes of 160 bytes (a witness), which moves arena_t's extent
#: containers, decay state and bins, bin_t's fields, base_t's counters and blocks and the radix tree's root;
#: its statistics and tsd are 5.1.0's (measured on the release tag built --enable-debug with debug information)
LAYOUTS[(5, 1, 0, "debug")] = dataclasses.replace(
    LAYOUTS[(5, 1, 0)], arena_size=28384, nactive=7224, dirty_npages=(9200,), muzzy_npages=(11016,),
    retained_npages=(12832,), dirty_state=9208, muzzy_state=11024, retained_state=12840, dirty_decay_ms=13016,
    muzzy_decay_ms=14848, base_counters=2056, base_blocks=192, bins=16848, bin_size=320, bin_stats=184,
    bin_slabcur=160, base=28368, rtree_root=160, mutex_size=160, debug=True, create_time=28376)
#: the quanta (lg) heapwalk has layouts for
QUANTA = (4, 3)


def quantum_of(nbins: int, lg_page: int = 12) -> int | None:
    """The quantum (lg) of a build with 2**LG_PAGE pages and NBINS small classes (None: no quantum heapwalk
    knows gives that many)."""
    return next((q for q in QUANTA if size_classes(q, lg_page).nbins == nbins), None)


def layout_for(version: tuple[int, int, int], lg_quantum: int = 4, debug: bool = False, prof: bool = False,
               lg_page: int = 12, mutex_size: int = 40) -> JeLayout:
    """The layout of VERSION built with a 2**LG_QUANTUM quantum and 2**LG_PAGE pages, with --enable-debug when
    DEBUG, with --enable-prof when PROF (which matters only to the versions of PROF_LAYOUTS), where a
    pthread_mutex_t is MUTEX_SIZE bytes (UnsupportedJemalloc when heapwalk has none for it)."""
    key = (*version, *(() if lg_quantum == 4 else (lg_quantum,)), *(() if lg_page == 12 else (f"page{lg_page}",)),
           *(() if mutex_size == 40 else (f"mutex{mutex_size}",)),
           *(("debug",) if debug else ()), *(("prof",) if prof and tuple(version) in PROF_LAYOUTS else ()))
    try:
        return LAYOUTS[key]
    except KeyError:
        known = ", ".join(layout.name.split(" ", 1)[1] for layout in LAYOUTS.values())
        traits = ([] if lg_quantum == 4 else [quantum_phrase(lg_quantum)]) + \
            ([] if lg_page == 12 else [f"{1 << (lg_page - 10)} KiB pages"]) + \
            ([] if mutex_size == 40 else [f"{mutex_size}-byte mutexes"])
        raise UnsupportedJemalloc(f"jemalloc {'.'.join(map(str, version))}"
                                  f"{' with ' + ' and '.join(traits) if traits else ''} is not "
                                  f"supported yet (heapwalk knows {known})") from None
