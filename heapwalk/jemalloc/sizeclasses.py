"""jemalloc's size classes with 4 KiB pages, for a build's quantum (the smallest alignment it guarantees: 16
bytes by default, 8 with ``--with-lg-quantum=3`` as Redis builds it).

Small classes: the powers of two below the quantum from 8 up (the "tiny" classes), then the quantum times 1
to 4, then four classes to each doubling (each a quarter of the doubling apart) up to 14336.  Each small class
is served from slabs of the fewest pages that its regions fill exactly: lcm(size, page) bytes.  Large classes
start at 16 KiB, four to each doubling; they and the page size classes of the extents do not depend on the
quantum (196 and 199 of them in 5.x with 48-bit addresses).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

__all__ = ["BinClass", "SizeClasses", "size_classes", "PAGE", "SMALL_MAXCLASS"]

PAGE = 4096
SMALL_MAXCLASS = 14336
_LG_TINY_MIN = 3


@dataclass(frozen=True)
class BinClass:
    """A small size class: its region size, regions per slab, and the slab's pages."""

    size: int
    nregs: int
    pages: int


@dataclass(frozen=True)
class SizeClasses:
    """The size classes of a build with a 2**LG_QUANTUM quantum."""

    lg_quantum: int
    bins: tuple[BinClass, ...]
    nlextents: int = 196
    npsizes: int = 199

    @property
    def nbins(self) -> int:
        """How many small classes (SC_NBINS)."""
        return len(self.bins)

    @staticmethod
    def large_size(index: int) -> int:
        """The size of large class INDEX (0: 16 KiB; four classes to each doubling)."""
        group, step = divmod(index, 4)
        return (1 << (14 + group)) * (4 + step) // 4

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
        """The page size classes (what the free extents are binned by): 4, 8 and 12 KiB, then the large
        classes."""
        return (PAGE, 2 * PAGE, 3 * PAGE) + tuple(self.large_size(i) for i in range(self.npsizes - 3))

    def class_size(self, index: int) -> int:
        """The size of class INDEX (sz_index2size)."""
        return self.bins[index].size if index < self.nbins else self.large_size(index - self.nbins)


@functools.lru_cache(maxsize=None)
def size_classes(lg_quantum: int = 4) -> SizeClasses:
    """The size classes of a build whose quantum is 2**LG_QUANTUM bytes."""
    quantum = 1 << lg_quantum
    sizes = [1 << lg for lg in range(_LG_TINY_MIN, lg_quantum)]
    sizes += [quantum * k for k in range(1, 5)]
    base = 4 * quantum
    while sizes[-1] < SMALL_MAXCLASS:
        sizes += [s for s in (base + base // 4 * k for k in range(1, 5)) if s <= SMALL_MAXCLASS]
        base *= 2
    return SizeClasses(lg_quantum, tuple(_bin(size) for size in sizes))


def _bin(size: int) -> BinClass:
    slab = size * PAGE // math.gcd(size, PAGE)
    return BinClass(size, slab // size, slab // PAGE)
