"""jemalloc's size classes, for a build's quantum (the smallest alignment it guarantees: 16 bytes by default, 8
with ``--with-lg-quantum=3`` as Redis builds it) and page (4 KiB by default; 64 KiB with ``--with-lg-page=16``,
as Debian builds it where kernels may use such pages).

Small classes: the powers of two below the quantum from 8 up (the "tiny" classes), then the quantum times 1
to 4, then four classes to each doubling (each a quarter of the doubling apart) up to 3.5 pages (14336 with
4 KiB pages).  Each small class is served from slabs of the fewest pages that its regions fill exactly:
lcm(size, page) bytes.  Large classes start at 4 pages, four to each doubling, up to the 48-bit address space
(196 with 4 KiB pages, four fewer for each doubling of the page); the page size classes of the extents are
the three small ones that are whole pages, then the large ones.  Neither depends on the quantum.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

__all__ = ["BinClass", "SizeClasses", "size_classes"]

_LG_TINY_MIN = 3
_LG_PAGE = 12


@dataclass(frozen=True)
class BinClass:
    """A small size class: its region size, regions per slab, and the slab's pages."""

    size: int
    nregs: int
    pages: int


@dataclass(frozen=True)
class SizeClasses:
    """The size classes of a build with a 2**LG_QUANTUM quantum and 2**LG_PAGE pages."""

    lg_quantum: int
    bins: tuple[BinClass, ...]
    nlextents: int = 196
    npsizes: int = 199
    lg_page: int = _LG_PAGE

    @property
    def page(self) -> int:
        return 1 << self.lg_page

    @property
    def small_maxclass(self) -> int:
        """The largest small class (3.5 pages)."""
        return self.bins[-1].size

    @property
    def slab_maxregs(self) -> int:
        """The most regions a slab holds (a page of the smallest class): the bits of a slab's bitmap, and what its
        count of free regions must hold."""
        return 1 << (self.lg_page - _LG_TINY_MIN)

    @property
    def nbins(self) -> int:
        """How many small classes (SC_NBINS)."""
        return len(self.bins)

    def large_size(self, index: int) -> int:
        """The size of large class INDEX (0: 4 pages; four classes to each doubling)."""
        group, step = divmod(index, 4)
        return (1 << (self.lg_page + 2 + group)) * (4 + step) // 4

    def size_index(self, size: int) -> int:
        """The index of the smallest class that holds SIZE bytes (small classes first, then large)."""
        for index, cls in enumerate(self.bins):
            if size <= cls.size:
                return index
        index = 0
        while self.large_size(index) < size:
            index += 1
        return self.nbins + index

    def page_sizes(self) -> tuple[int, ...]:
        """The page size classes (what the free extents are binned by): 1, 2 and 3 pages, then the large
        classes."""
        page = self.page
        return (page, 2 * page, 3 * page) + tuple(self.large_size(i) for i in range(self.npsizes - 3))

    def class_size(self, index: int) -> int:
        """The size of class INDEX (sz_index2size)."""
        return self.bins[index].size if index < self.nbins else self.large_size(index - self.nbins)


@functools.lru_cache(maxsize=None)
def size_classes(lg_quantum: int = 4, lg_page: int = _LG_PAGE) -> SizeClasses:
    """The size classes of a build whose quantum is 2**LG_QUANTUM bytes and whose pages are 2**LG_PAGE."""
    quantum, page = 1 << lg_quantum, 1 << lg_page
    maxclass = page * 7 // 2
    sizes = [1 << lg for lg in range(_LG_TINY_MIN, lg_quantum)]
    sizes += [quantum * k for k in range(1, 5)]
    base = 4 * quantum
    while sizes[-1] < maxclass:
        sizes += [s for s in (base + base // 4 * k for k in range(1, 5)) if s <= maxclass]
        base *= 2
    nlextents = 196 - 4 * (lg_page - _LG_PAGE)
    return SizeClasses(lg_quantum, tuple(_bin(size, page) for size in sizes), nlextents, nlextents + 3, lg_page)


def _bin(size: int, page: int) -> BinClass:
    slab = size * page // math.gcd(size, page)
    return BinClass(size, slab // size, slab // page)
