"""One arena decoded: the scalar fields of its malloc_state, its top, its heaps (the main arena's sbrk region
or a thread arena's heap chain), its free lists; and which arenas wait on glibc's free list."""

from __future__ import annotations

import dataclasses
import struct

from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.locate.discovery import Discovery
from heapwalk.glibc.locate.layout import NBINS, SIZE_BITS, Layout
from heapwalk.glibc.walk.lists import ListWalk, walk_bin, walk_fastbin
from heapwalk.glibc.locate.mainarena import main_memory_start
from heapwalk.glibc.model import Arena, BinKind, BinList, Heap, MallocPar
from heapwalk.glibc.walk.ring import walk_heaps
from heapwalk.inferior.memory import Memory, ReadError, u64

__all__ = ["read_arena", "decode_arena", "arena_head", "ArenaHead", "walk_free_list", "blank_arena"]


def read_arena(mem: Memory, layout: Layout, address: int) -> dict[str, int | None]:
    """The scalar fields of the malloc_state at ADDRESS."""
    raw = mem.read(address, layout.arena_size)

    def word(off: int | None) -> int | None:
        return None if off is None else struct.unpack_from("<Q", raw, off)[0]

    def i32(off: int | None) -> int | None:
        return None if off is None else struct.unpack_from("<i", raw, off)[0]

    return dict(mutex=i32(layout.off_mutex), flags=i32(layout.off_flags),
                have_fastchunks=i32(layout.off_have_fastchunks), top=word(layout.off_top),
                last_remainder=word(layout.off_last_remainder), next=word(layout.off_next),
                next_free=word(layout.off_next_free), attached_threads=word(layout.off_attached_threads),
                system_mem=word(layout.off_system_mem), max_system_mem=word(layout.off_max_system_mem))


def blank_arena(address: int, number: int, is_main: bool, free_list: set[int]) -> Arena:
    """An arena whose memory reads as zeros (its pages are missing from the core, or were never written):
    one finding instead of one per bin, and empty lists marked as cut."""
    finding = Finding(Severity.ERROR, address, f"arena {address:#x}", "the arena reads as all zeros: its pages are "
                      "missing from the core (or it was overwritten); nothing of it can be decoded", Kind.ARENA,
                      "an initialised malloc_state", "zeros")
    return Arena(address=address, number=number, is_main=is_main, mutex=0, flags=0, have_fastchunks=None, top=0,
                 top_size=0, last_remainder=0, next=0, next_free=0, attached_threads=None, system_mem=0,
                 max_system_mem=0, heaps=(), fastbins=(),
                 unsorted=BinList(BinKind.UNSORTED, 1, address, (), (), complete=False),
                 bins=(), on_free_list=address in free_list, findings=(finding,))


@dataclasses.dataclass(frozen=True)
class ArenaHead:
    """An arena decoded but for its free lists (`arena_head`): the arena with empty lists, its malloc_state's
    bytes, and what was found wrong so far (BLANK: an arena that reads as zeros, whole as it is)."""

    arena: Arena
    raw: bytes
    findings: tuple[Finding, ...]
    blank: bool = False


def decode_arena(mem: Memory, disc: Discovery, address: int, number: int, mp: MallocPar | None,
                 free_list: set[int], one_pass=None, head: ArenaHead | None = None) -> Arena:
    """The arena at ADDRESS, number NUMBER in the ring, with its heaps and free lists; what is wrong with
    them is in its findings.  ONE_PASS (`onepass.OnePass`), when given, sweeps the arena's heaps and follows
    its lists there; where it cannot vouch for them, they are walked through memory.  HEAD: its `arena_head`,
    when it was read before."""
    if head is None:
        head = arena_head(mem, disc, address, number, mp, free_list)
    if head.blank:
        return head.arena
    arena, raw, findings = head.arena, head.raw, list(head.findings)
    swept = one_pass.lists(arena, raw) if one_pass is not None else None
    if swept is not None:
        fastbins, unsorted, bins = swept.fastbins, swept.unsorted, swept.bins
    else:
        fastbins, unsorted, bins = _free_lists(mem, disc.layout, address, arena.system_mem, findings)
    return dataclasses.replace(arena, fastbins=fastbins, unsorted=unsorted, bins=bins, findings=tuple(findings))


def arena_head(mem: Memory, disc: Discovery, address: int, number: int, mp: MallocPar | None,
               free_list: set[int]) -> ArenaHead:
    """The arena at ADDRESS (number NUMBER) as `decode_arena` gives it, but for its free lists: its fields, top
    and heaps, all that its lists' sweep needs to start."""
    layout = disc.layout
    is_main = address == disc.main_arena
    raw = mem.read(address, layout.arena_size)
    if not any(raw):
        return ArenaHead(blank_arena(address, number, is_main, free_list), raw, (), blank=True)
    f = read_arena(mem, layout, address)
    findings: list[Finding] = []
    if f["mutex"]:
        findings.append(Finding(Severity.WARNING, address, f"arena {address:#x}",
                                "the arena mutex was held at snapshot time: its lists may be mid-update",
                                Kind.MUTEX_HELD, "0", str(f["mutex"])))
    top, system_mem = f["top"] or 0, f["system_mem"] or 0
    top_size, top_lost = _top_size(mem, layout, address, top, system_mem,
                                   (mp.get("sbrk_base") or 0) if (is_main and mp) else 0, findings)
    if is_main:
        heaps = _sbrk_heap(mem, layout, address, f["flags"] or 0, top, top_size, top_lost, system_mem, mp,
                           findings)
    else:
        heaps, heap_findings = walk_heaps(mem, layout, address, top, disc.heap_max_size)
        findings.extend(heap_findings)
    arena = Arena(address=address, number=number, is_main=is_main, mutex=f["mutex"] or 0, flags=f["flags"] or 0,
                  have_fastchunks=f["have_fastchunks"], top=top, top_size=top_size,
                  last_remainder=f["last_remainder"] or 0, next=f["next"] or 0, next_free=f["next_free"] or 0,
                  attached_threads=f["attached_threads"], system_mem=system_mem,
                  max_system_mem=f["max_system_mem"] or 0, heaps=tuple(heaps), fastbins=(),
                  unsorted=BinList(BinKind.UNSORTED, 1, layout.bin_header(address, 1), (), ()), bins=(),
                  on_free_list=address in free_list)
    return ArenaHead(arena, raw, tuple(findings))


def _top_size(mem: Memory, layout: Layout, address: int, top: int, system_mem: int, sbrk: int,
              findings: list[Finding]) -> tuple[int, bool]:
    """Top's size, and whether top is unreadable; a size over system_mem is damage, and then what the sbrk
    region (from SBRK, the main arena's mp_.sbrk_base, or 0) leaves for it is taken instead."""
    try:
        top_size = u64(mem, top + 8) & ~SIZE_BITS if top else 0
    except ReadError:
        findings.append(Finding(Severity.ERROR, address + layout.off_top, f"arena {address:#x}",
                                f"top {top:#x} is not in the target's memory", Kind.UNMAPPED,
                                "a pointer into the heap", f"{top:#x}"))
        return 0, True
    if top_size > max(system_mem, 0):
        findings.append(Finding(Severity.ERROR, top, f"arena {address:#x}", f"top's size {top_size:#x} is more than "
                                f"the arena's system_mem {system_mem:#x}: the size (or system_mem) is damaged",
                                Kind.TOP_SIZE, f"at most {system_mem:#x}", f"{top_size:#x}"))
        top_size = max(0, sbrk + system_mem - top) if sbrk and sbrk <= top < sbrk + system_mem else 0
    return top_size, False


def _sbrk_heap(mem: Memory, layout: Layout, address: int, flags: int, top: int, top_size: int, top_lost: bool,
               system_mem: int, mp: MallocPar | None, findings: list[Finding]) -> list[Heap]:
    """The main arena's sbrk region as one heap, from where it starts to top's end (none when it never grew)."""
    sbrk_base = mp.get("sbrk_base") if mp else main_memory_start(mem, address, top, flags, system_mem, layout)
    if not (sbrk_base and top):
        return []
    end = top + top_size
    contiguous = not flags & 2  # NONCONTIGUOUS_BIT: top may be in an mmap'd piece
    if (top_lost or contiguous) and top < sbrk_base + system_mem and end < sbrk_base + system_mem <= 1 << 64:
        end = sbrk_base + system_mem  # up to where system_mem says (top ends there): the walk names the gap
    if not contiguous and not sbrk_base <= top < end <= sbrk_base + max(system_mem, 0):
        return []  # top is in another piece: the pieces are found in the target's memory (with_main_regions)
    if contiguous and not sbrk_base <= top <= end <= sbrk_base + 2 * system_mem + (64 << 20):
        findings.append(Finding(Severity.ERROR, address + layout.off_top, f"arena {address:#x}",
                                f"top {top:#x} (size {top_size:#x}) is not within the sbrk region that "
                                f"starts at {sbrk_base:#x} and holds {system_mem:#x} bytes",
                                Kind.TOP_SIZE, f"within {sbrk_base:#x}..{sbrk_base + system_mem:#x}",
                                f"{top:#x}"))
        end = sbrk_base + max(system_mem, 0)
    return [Heap(sbrk_base, end - sbrk_base, end - sbrk_base, address, 0, None)]


def _free_lists(mem: Memory, layout: Layout, address: int, system_mem: int, findings: list[Finding]
                ) -> tuple[tuple[BinList, ...], BinList, tuple[BinList, ...]]:
    """The arena's fastbins, unsorted bin, and small and large bins, walked."""
    fastbins: list[BinList] = []
    for i in range(layout.nfastbins):
        fb, fb_findings = walk_fastbin(mem, layout, address, i, system_mem)
        fastbins.append(fb)
        findings.extend(fb_findings)
    unsorted, u_findings = walk_bin(mem, layout, address, 1, system_mem)
    findings.extend(u_findings)
    bins: list[BinList] = []
    for i in range(2, NBINS):
        b, b_findings = walk_bin(mem, layout, address, i, system_mem)
        bins.append(b)
        findings.extend(b_findings)
    return tuple(fastbins), unsorted, tuple(bins)


def walk_free_list(mem: Memory, disc: Discovery, arenas: list[int]) -> tuple[set[int], list[Finding], str]:
    """Arenas on glibc's free_list (threads exited): from the free_list variable, else attached_threads == 0."""
    layout = disc.layout
    if disc.free_list_address is not None:
        walk = ListWalk("arena free_list", len(arenas) + 1)
        members: set[int] = set()
        try:
            a = u64(mem, disc.free_list_address)
            while a:
                if not walk.admit(a, "arena", disc.free_list_address, alignment=8):
                    break
                if a not in arenas:
                    walk.fail(a, f"free_list holds {a:#x}, which is not in the arena ring", Kind.ARENA_RING)
                    break
                members.add(a)
                a = u64(mem, a + layout.off_next_free)
        except ReadError as exc:
            walk.fail(disc.free_list_address, f"cannot read the free list: {exc}", Kind.ARENA_RING)
        return members, walk.findings, f"symbol free_list at {disc.free_list_address:#x}"
    if layout.off_attached_threads is None:
        return set(), [], "unknown"
    members = set()
    for a in arenas:
        if a == disc.main_arena:
            continue
        try:
            if u64(mem, a + layout.off_attached_threads) == 0:
                members.add(a)
        except ReadError:
            pass
    return members, [], "attached_threads == 0"
