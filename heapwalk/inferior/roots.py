"""Where a conservative leak scan starts: the memory of the process that is not the allocator's and may hold
pointers to what the program allocated (threads' stacks from their stack pointers, their registers, TLS, the
writable segments of the program and its libraries, anonymous writable mappings), each named so that a
path from a root can say where it starts.  And the read-only parts of the loaded files, whose addresses in
an allocation's first word name its type (a C++ vtable, a type object)."""

from __future__ import annotations

import bisect
import os
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from heapwalk.inferior.elf import PF_W, PT_LOAD, ElfImage
from heapwalk.inferior.memory import Memory, ReadError
from heapwalk.inferior.ranges import merged, ranges_without
from heapwalk.inferior.space import MemoryMap
from heapwalk.inferior.threads import ThreadRegs

__all__ = ["Root", "RegisterRoot", "root_regions", "register_roots", "readonly_images", "image_data", "intersect",
           "RED_ZONE"]

#: bytes below a thread's stack pointer that a leaf function may still use (the red zone of the ABI heapwalk reads)
RED_ZONE = 128
#: bytes from a thread's thread pointer that its thread descriptor may take (glibc's struct pthread: about 2.3 KiB)
_TCB_ROOM = 4096
_PAGE = 4096


@dataclass(frozen=True)
class Root:
    """A stretch of memory whose words are roots: [START, END), what it is (KIND: stack, tls, data,
    anonymous, large, unknown) and whose (OWNER: a thread's number, a file's name, a mapping's address)."""

    start: int
    end: int
    kind: str
    owner: str = ""
    thread: int | None = None

    @property
    def label(self) -> str:
        """How a path from this root starts: "stack of thread 3", "data of libfoo.so"..."""
        if self.kind == "stack":
            return f"stack of thread {self.thread}"
        if self.kind == "tls":
            return f"TLS of thread {self.thread}"
        if self.kind in ("data", "bss"):
            return f"{self.kind} of {self.owner}"
        if self.kind == "large":
            return f"{self.owner} {self.start:#x}"
        if self.kind == "unknown":
            return f"damaged heap memory at {self.start:#x}"
        return f"anonymous mapping {self.start:#x}"


@dataclass(frozen=True)
class RegisterRoot:
    """A register of a thread's newest frame: a root of its own."""

    thread: int
    name: str
    value: int

    @property
    def label(self) -> str:
        return f"register {self.name} of thread {self.thread}"


def intersect(a: Iterable[tuple[int, int]], b: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges both A and B cover, in order."""
    a, b = merged(a), merged(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def root_regions(space: MemoryMap, threads: Sequence[ThreadRegs], owned: Iterable[tuple[int, int]],
                 large: Iterable[tuple[int, int]] = (), unknown: Iterable[tuple[int, int]] = (),
                 large_name: str = "mmapped chunk", images: Sequence[tuple[int, int, str]] = ()) -> list[Root]:
    """Every root region of the target: its writable memory (all it has when the target cannot say what is
    writable) that can be read, less OWNED (the allocator's heaps and bookkeeping) and less the part of each
    thread's stack below its stack pointer (and red zone); LARGE (allocations with their own mapping, named
    LARGE_NAME) and UNKNOWN (heap memory whose chunks damage hides) are roots of their own kinds, where the
    target has memory (a damaged size may put their end past any mapping, or past 2**64).  IMAGES
    (`image_data`: the loaded files' data and bss as their program headers place them) are roots whole,
    whatever lies next to them: a thread's stack in the same mapping takes no part of them."""
    writable = space.writable if space.writable is not None else space.regions
    if space.readable is not None:
        writable = intersect(writable, space.readable)
    inside = space.readable if space.readable is not None else space.regions
    large, unknown = intersect(large, inside), intersect(unknown, inside)   # damaged bounds reach anywhere
    pieces = ranges_without(merged(writable), list(owned) + large + unknown)
    named = _Namer(space, threads, images)
    out = [root for lo, hi in pieces for root in named.roots(lo, hi)]
    out += [Root(lo, hi, "large", large_name) for lo, hi in large]
    out += [Root(lo, hi, "unknown") for lo, hi in unknown]
    return sorted(out, key=lambda r: r.start)


def register_roots(threads: Sequence[ThreadRegs]) -> list[RegisterRoot]:
    """The registers of every thread's newest frame that may hold a pointer."""
    return [RegisterRoot(t.number, name, value) for t in threads for name, value in t.registers]


def readonly_images(space: MemoryMap) -> list[tuple[int, int, str]]:
    """The read-only mappings of the loaded files (program, libraries): (start, end, file name), in order."""
    writable = merged(space.writable or [])
    out = []
    for m in space.mappings:
        if not m.path or m.path.startswith("[") or m.path.startswith("/dev/") or m.path.startswith("/SYSV"):
            continue
        for lo, hi in ranges_without([(m.start, m.end)], writable):
            out.append((lo, hi, os.path.basename(m.path)))
    return sorted(out)


def image_data(mem: Memory, space: MemoryMap) -> list[tuple[int, int, str]]:
    """Where each loaded file's writable segments (.data, .bss, the GOT) lie, to the end of their last page,
    as their program headers say (read from the file's first page in MEM): (start, end, file name), in order;
    a file whose headers cannot be read is left out."""
    out = set()
    for m in space.mappings:
        if m.offset or not m.path or m.path.startswith(("[", "/dev/", "/SYSV")):
            continue
        try:
            image = ElfImage.read(mem, m.start, m.path)
        except (ReadError, ValueError, struct.error):
            continue
        for seg in image.segments:
            if seg.type == PT_LOAD and seg.flags & PF_W and seg.memsz and seg.address >= m.start:
                out.add((seg.address, (seg.end + _PAGE - 1) & ~(_PAGE - 1), os.path.basename(m.path)))
    return sorted(out)


class _Namer:
    """Names the pieces of writable memory: a thread's stack or TLS, a file's data or bss, or anonymous."""

    def __init__(self, space: MemoryMap, threads: Sequence[ThreadRegs], images: Sequence[tuple[int, int, str]] = ()):
        self.threads = threads
        self.files = sorted((m.start, m.end, m.path) for m in space.mappings if m.path)
        self.starts = [f[0] for f in self.files]
        self.images = sorted(images)

    def _file_at(self, address: int) -> tuple[int, int, str] | None:
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and self.files[i][0] <= address < self.files[i][1]:
            return self.files[i]
        return None

    def roots(self, lo: int, hi: int) -> list[Root]:
        """The root(s) of the writable piece [LO, HI): the parts that are a loaded file's data or bss, whole,
        and each part between them as `_part` names it."""
        out, at = [], lo
        for start, end, name in self.images:
            start, end = max(start, lo), min(end, hi)
            if start >= end:
                continue
            if at < start:
                out += self._part(at, start)
            found = self._file_at(start)
            out.append(Root(start, end, "data" if found is not None and found[2].endswith(name) else "bss", name))
            at = end
        return out + (self._part(at, hi) if at < hi else [])

    def _part(self, lo: int, hi: int) -> list[Root]:
        """The root(s) of [LO, HI), writable memory that is no file's data or bss by its headers."""
        stacks = sorted((t for t in self.threads if t.sp is not None and lo <= t.sp < hi + RED_ZONE),
                        key=lambda t: t.sp)
        if stacks:
            return _tls_below(lo, stacks[0], self.threads) + _stacks(lo, hi, stacks)
        for t in self.threads:
            if t.thread_pointer is not None and lo <= t.thread_pointer < hi:
                return [Root(lo, hi, "tls", thread=t.number)]
        found = self._file_at(lo)
        if found is not None and not found[2].startswith("["):
            return [Root(lo, hi, "data", os.path.basename(found[2]))]
        before = self._file_at(lo - 1)
        if before is not None and not before[2].startswith("["):
            return [Root(lo, hi, "bss", os.path.basename(before[2]))]
        return [Root(lo, hi, "anonymous")]


def _tls_below(lo: int, lowest: ThreadRegs, threads: Sequence[ThreadRegs]) -> list[Root]:
    """The TLS and thread descriptor of another thread that lie in [LO, the red zone of LOWEST, the lowest stack
    pointer of the piece): where the allocator's own words cut that thread's stack mapping apart from the next
    one, the top of its stack mapping joins the bottom of the next thread's, below whose stack pointer all is
    dead but this."""
    first = max(lo, (lowest.sp - RED_ZONE) & ~7)
    tps = [t.thread_pointer for t in threads if t.thread_pointer is not None and lo <= t.thread_pointer < first]
    if not tps:
        return []
    end = min(first, (max(tps) + _TCB_ROOM + _PAGE - 1) & ~(_PAGE - 1))
    owner = next(t for t in threads if t.thread_pointer == max(tps))
    return [Root(lo, end, "tls", thread=owner.number)]


def _stacks(lo: int, hi: int, threads: Sequence[ThreadRegs]) -> list[Root]:
    """The live stacks in [LO, HI), which holds the stack pointers of THREADS (sorted by them): each from its
    red zone up to the end of its thread's TLS and thread descriptor, when they lie above (a pthread's stack
    mapping ends with them; from glibc 2.42 one mapping may hold several threads' stacks, separated by guard
    regions), else up to the next thread's stack or HI.  What lies below each stack pointer is dead."""
    out = []
    starts = [max(lo, (t.sp - RED_ZONE) & ~7) for t in threads] + [hi]
    for i, t in enumerate(threads):
        end = starts[i + 1]
        if t.thread_pointer is not None and t.sp <= t.thread_pointer < end:
            end = min(end, (t.thread_pointer + _TCB_ROOM + _PAGE - 1) & ~(_PAGE - 1))
        if starts[i] < end:
            out.append(Root(starts[i], end, "stack", thread=t.number))
    if out and out[-1].end < hi:
        out.append(Root(out[-1].end, hi, "anonymous"))
    return out
