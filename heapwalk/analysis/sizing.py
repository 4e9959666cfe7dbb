"""What a command over a big heap is expected to cost, said before it starts, and whether this machine has the
memory for it: so that a heap too big for the machine is refused in one line, with what can be done instead,
and never ends in the out-of-memory killer half-way.

Two checks.  Before the decode, from the bytes the process's memory may hold chunks in (`space.regions`, or what
of them was resident where that is cheap to know: a live process's anonymous RSS, a core's page map): the
expected time and memory at the rates `make bench` measured (docs/performance.md), which assume its heaps'
chunks (some 200 bytes each on average: smaller chunks cost more).  Before the leak scan, from the blocks the
decode found: the scan's own state, a fixed number of bytes a block, exact to within its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Expected", "expected", "scan_need", "available_memory", "too_big", "SAID_FROM", "human_bytes"]

GIB = 1 << 30
#: the commands' seconds and gdb's memory above its own per GiB of heap, the largest of `make bench`'s large cores
#: at 8bd9d84 and huge cores at 2a32154 (glibc and jemalloc, docs/performance.md), rounded up: report (its leak
#: scan in), a walk of every chunk (check, chunks, map), the free lists (bins)
RATES = {"report": (2.5, 300 << 20), "walk": (3.0, 250 << 20), "lists": (1.0, 150 << 20)}
#: heaps below this are not worth a sentence
SAID_FROM = 1 << 30
#: the leak scan's state a block in use, above the allocator's blocks (the lookup's table, the marks, the
#: signature code, the window's rows at their worst), and its fixed room (windows, slabs)
SCAN_PER_BLOCK = 40
SCAN_FIXED = 96 << 20
#: what is left to the rest of the machine: a command needs at most this share of the memory available
SHARE = 0.8


@dataclass(frozen=True)
class Expected:
    """A command's expected cost over HEAP bytes: SECONDS and BYTES of gdb's memory above its own."""

    heap: int
    seconds: float
    bytes: int


def expected(kind: str, regions: Sequence[tuple[int, int]], resident: int | None = None) -> Expected:
    """What a command of KIND ("report": the walk and the leak scan; "walk": every chunk walked; "lists": the
    free lists) costs over the memory REGIONS may hold chunks in, or over the RESIDENT bytes of it when fewer."""
    heap = sum(hi - lo for lo, hi in regions)
    heap = heap if resident is None else min(heap, resident)
    seconds, per_gib = RATES[kind]
    return Expected(heap, seconds * heap / GIB, int(per_gib * heap / GIB))


def scan_need(blocks: int) -> int:
    """The bytes the leak scan needs over BLOCKS blocks in use (see the module)."""
    return SCAN_FIXED + SCAN_PER_BLOCK * blocks


def available_memory(meminfo: str | None = None) -> int | None:
    """The memory this machine can give without swapping (MemAvailable, from MEMINFO or /proc/meminfo), or None
    when it does not say."""
    if meminfo is None:
        try:
            with open("/proc/meminfo", encoding="ascii") as fh:
                meminfo = fh.read()
        except OSError:
            return None
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def too_big(need: int, available: int | None) -> bool:
    """Whether NEED bytes are more than this machine should give a command (`SHARE` of AVAILABLE)."""
    return available is not None and need > SHARE * available


def human_bytes(n: int) -> str:
    """N bytes in GiB or MiB, as the sentences here say them."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / (1 << 20):.0f} MiB"
