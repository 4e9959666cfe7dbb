"""Walks over glibc's malloc structures that trust nothing they read.

Each walker follows one kind of list (a fastbin, a regular bin, a tcache; the
arena ring and a thread arena's heaps are in `heapwalk.glibc.walk.ring`) through a
`Memory`.  Every pointer is checked
for alignment and readability before it is followed, every list has a bound
and a visited set, and every anomaly becomes a `Finding` with its address and a
plain sentence.  A walker never raises on bad data: it stops the list at the
first bad link, marks the result incomplete, and returns what it had.
"""

from __future__ import annotations

import struct
from array import array

from heapwalk.glibc.locate.layout import IS_MMAPPED, MALLOC_ALIGNMENT, MINSIZE, NSMALLBINS, SIZE_BITS, Layout
from heapwalk.inferior.memory import Memory, ReadError, hop_u64, u64
from heapwalk.glibc.model import BinKind, BinList, Tcache, TcacheBin
from heapwalk.common.findings import Finding, Severity
from heapwalk.glibc.kinds import Kind

__all__ = ["ListWalk", "walk_fastbin", "walk_bin", "walk_tcache", "smallbin_index", "largebin_index", "bin_index",
           "bin_kind", "reveal", "MAX_LIST"]

#: Hard upper bound on any one list, whatever the arena's size says.
MAX_LIST = 1 << 26
_QQ = struct.Struct("<QQ")
_QQQ = struct.Struct("<QQQ")


def reveal(field_address: int, stored: int) -> int:
    """Undoes glibc 2.32+ safe-linking: the link stored at FIELD_ADDRESS, decoded."""
    return stored ^ (field_address >> 12)


def smallbin_index(size: int) -> int:
    return size >> 4


def largebin_index(size: int) -> int:
    """glibc's largebin_index_64: the bin (64..126) of a large chunk SIZE."""
    if (size >> 6) <= 48:
        return 48 + (size >> 6)
    if (size >> 9) <= 20:
        return 91 + (size >> 9)
    if (size >> 12) <= 10:
        return 110 + (size >> 12)
    if (size >> 15) <= 4:
        return 119 + (size >> 15)
    if (size >> 18) <= 2:
        return 124 + (size >> 18)
    return 126


def bin_index(size: int) -> int:
    """The regular bin (2..126) glibc files a free chunk of SIZE into."""
    return smallbin_index(size) if size < NSMALLBINS * MALLOC_ALIGNMENT else largebin_index(size)


def bin_kind(index: int) -> BinKind:
    if index == 1:
        return BinKind.UNSORTED
    return BinKind.SMALL if index < NSMALLBINS else BinKind.LARGE


class ListWalk:
    """Shared state of one list walk: visited set, bound and findings."""

    def __init__(self, structure: str, bound: int, circular: bool = False):
        self.structure = structure
        self.bound = min(bound, MAX_LIST)
        self.circular = circular
        self.visited: set[int] = set()
        self.findings: list[Finding] = []
        self.complete = True

    def fail(self, address: int, message: str, kind: Kind = Kind.OTHER, severity: Severity = Severity.ERROR,
             expected: str = "", found: str = "", cut: bool = True) -> None:
        """Records a finding at ADDRESS; CUT (the default for errors) marks the list as walked only in part."""
        self.findings.append(Finding(severity, address, self.structure, message, kind, expected, found))
        if cut and severity is Severity.ERROR:
            self.complete = False

    def damage(self, address: int, message: str, kind: Kind, expected: str = "", found: str = "") -> None:
        """Damage that does not stop the walk (the list's numbers stay whole)."""
        self.fail(address, message, kind, Severity.ERROR, expected, found, cut=False)

    def note(self, address: int, message: str, kind: Kind = Kind.OTHER) -> None:
        self.findings.append(Finding(Severity.WARNING, address, self.structure, message, kind))

    def admit(self, address: int, what: str, holder: int, alignment: int = MALLOC_ALIGNMENT) -> bool:
        """Checks that ADDRESS, read from HOLDER (the previous entry, or the head), may be followed next:
        aligned, new, within the bound.  A refusal is a finding at HOLDER, whose link is the bad data."""
        if address % alignment:
            self.fail(holder, f"link to {what} {address:#x} is misaligned (not a multiple of {alignment})",
                      Kind.MISALIGNED, expected=f"a multiple of {alignment}", found=f"{address:#x}")
            return False
        if address in self.visited:
            if self.circular:
                message = (f"the list is a cycle not through its head: {holder:#x} links back to {address:#x}, "
                           "met before")
            else:
                message = (f"the list loops: {holder:#x} links back to {address:#x}, met before "
                           "(a double free, or a rewritten link)")
            self.fail(holder, message, Kind.LIST_CYCLE, expected="a link to an entry not yet met", found=f"{address:#x}")
            return False
        if len(self.visited) >= self.bound:
            self.fail(holder, f"the list is longer than {self.bound} entries, more than its arena can hold; "
                              "stopped here", Kind.LIST_TOO_LONG)
            return False
        self.visited.add(address)
        return True

    def unreadable(self, holder: int, address: int, what: str) -> None:
        """HOLDER links to ADDRESS, which the target does not have."""
        self.fail(holder, f"link to {what} {address:#x}, which is not in the target's memory", Kind.UNMAPPED,
                  expected="a pointer into the heap", found=f"{address:#x}")


def _list_bound(system_mem: int) -> int:
    """Most chunks a list of an arena of SYSTEM_MEM bytes can hold (every chunk is >= MINSIZE)."""
    return max(system_mem, 1 << 20) // MINSIZE + 1


def walk_fastbin(mem: Memory, layout: Layout, arena: int, index: int, system_mem: int) -> tuple[BinList, list[Finding]]:
    """Fastbin INDEX of ARENA: a NULL-terminated singly linked list through fd (safe-linked from 2.32)."""
    slot = arena + layout.off_fastbins + 8 * index
    expected = (index + 2) * MALLOC_ALIGNMENT
    sound = _sound_fastbin(mem, slot, expected, layout.safe_linking, min(_list_bound(system_mem), MAX_LIST))
    if sound is not None:
        return BinList(BinKind.FAST, index, slot, *sound, True), []
    walk = ListWalk(f"fastbin[{index}] of arena {arena:#x}", _list_bound(system_mem))
    chunks, sizes = array("Q"), array("Q")
    try:
        p = u64(mem, slot)
    except ReadError as exc:
        walk.fail(slot, f"cannot read the fastbin head: {exc}", Kind.ARENA)
        p = 0
    holder = slot
    while p:
        if not walk.admit(p, "chunk", holder):
            break
        try:
            raw_size, fd = _QQ.unpack(mem.read(p + 8, 16))
        except ReadError:
            walk.unreadable(holder, p, "chunk")
            break
        size = raw_size & ~SIZE_BITS
        if size != expected:
            walk.damage(p, f"fastbin entry of wrong size: expected {expected:#x}, found {size:#x}",
                        Kind.FASTBIN_SIZE, f"{expected:#x}", f"{size:#x}")
        chunks.append(p)
        sizes.append(raw_size)
        holder = p
        p = reveal(p + 16, fd) if layout.safe_linking else fd
    return BinList(BinKind.FAST, index, slot, chunks, sizes, walk.complete), walk.findings


def _sound_fastbin(mem: Memory, slot: int, expected: int, safe_linking: bool,
                   bound: int) -> tuple[array, array] | None:
    """The chunks and size fields of the fastbin whose head is at SLOT, when every link is aligned and
    readable, every chunk has the bin's size EXPECTED, there is no cycle and at most BOUND entries; else
    None (the careful walk then finds what is wrong).  Read like `_sound_bin`."""
    span_at = getattr(mem, "span_at", None)
    if span_at is None:
        return None
    try:
        p = u64(mem, slot)
    except ReadError:
        return None
    chunks, sizes = array("Q"), array("Q")
    add_chunk, add_size, unpack_from = chunks.append, sizes.append, _QQ.unpack_from
    base, data, limit = 0, b"", -1
    tortoise, power, steps = -1, 1, 0
    while p:
        if p == tortoise or p & (MALLOC_ALIGNMENT - 1):
            return None
        off = p + 8 - base
        if 0 <= off <= limit:
            raw_size, fd = unpack_from(data, off)
        else:
            try:
                base, data = span_at(p + 8)
                limit = len(data) - 16
                off = p + 8 - base
                raw_size, fd = unpack_from(data, off) if off <= limit else _QQ.unpack(mem.read(p + 8, 16))
            except ReadError:
                return None
        if raw_size & ~SIZE_BITS != expected:
            return None
        add_chunk(p)
        add_size(raw_size)
        steps += 1
        if steps >= bound:
            return None
        if steps == power:
            tortoise, power = p, power * 2
        p = fd ^ ((p + 16) >> 12) if safe_linking else fd
    return chunks, sizes


def walk_bin(mem: Memory, layout: Layout, arena: int, index: int, system_mem: int) -> tuple[BinList, list[Finding]]:
    """Regular bin INDEX (1 = unsorted, 2..63 small, 64..127 large): a circular list through fd.

    Each chunk's bk must lead back to the chunk it was reached from, and the
    head's bk to the last chunk (glibc's "fd->bk != p" / "bk->fd != p").
    A sound list (the common case) is read by `_sound_bin` in one quick pass;
    any doubt sends the whole list through the careful walk, which says what
    is wrong and where.
    """
    head = layout.bin_header(arena, index)
    sound = _sound_bin(mem, head, index, min(_list_bound(system_mem), MAX_LIST))
    if sound is not None:
        return BinList(bin_kind(index), index, head, *sound, True), []
    kind = bin_kind(index)
    walk = ListWalk(f"{kind.value} bin[{index}] of arena {arena:#x}", _list_bound(system_mem), circular=True)
    chunks, sizes = array("Q"), array("Q")
    try:
        p, head_bk = _QQ.unpack(mem.read(head + 16, 16))
    except ReadError as exc:
        walk.fail(head, f"cannot read the bin head: {exc}", Kind.ARENA)
        p = head_bk = head
    prev = head
    if p == 0:
        walk.fail(head, "bin head fd is NULL (an arena that was never initialised, or a damaged one)", Kind.FD_BK,
                  expected="a chunk or the head itself", found="NULL")
        p = head
    visited, bound, read, unpack = walk.visited, walk.bound, mem.read, _QQQ.unpack
    small = index < NSMALLBINS
    while p != head:
        if p & (MALLOC_ALIGNMENT - 1) or p in visited or len(visited) >= bound:
            walk.admit(p, "chunk", prev)  # reports why the link cannot be followed
            break
        visited.add(p)
        try:
            raw_size, fd, bk = unpack(read(p + 8, 24))
        except ReadError:
            walk.unreadable(prev, p, "chunk")
            break
        if bk != prev:
            walk.damage(p, f"fd->bk != p: chunk {p:#x} has bk {bk:#x}, but is linked from {prev:#x}",
                        Kind.FD_BK, f"{prev:#x}", f"{bk:#x}")
        size = raw_size & ~SIZE_BITS
        if size < MINSIZE or size % MALLOC_ALIGNMENT:
            walk.fail(p, f"chunk size {size:#x} is impossible for a free chunk", Kind.CHUNK_SIZE,
                      expected=f"a multiple of {MALLOC_ALIGNMENT} of at least {MINSIZE:#x}", found=f"{raw_size:#x}")
            break
        if index >= 2 and (size >> 4 != index if small else bin_index(size) != index):
            walk.damage(p, f"chunk of size {size:#x} belongs in bin {bin_index(size)}, not bin {index}",
                        Kind.BIN_SIZE, f"bin {bin_index(size)}", f"bin {index}")
        chunks.append(p)
        sizes.append(raw_size)
        prev, p = p, fd
    if walk.complete and head_bk != prev:
        walk.damage(head, f"bk->fd != p: the bin head's bk is {head_bk:#x}, the last chunk is {prev:#x}",
                    Kind.FD_BK, f"{prev:#x}", f"{head_bk:#x}")
    return BinList(kind, index, head, chunks, sizes, walk.complete), walk.findings


def _sound_bin(mem: Memory, head: int, index: int, bound: int) -> tuple[array, array] | None:
    """The chunks and size fields of regular bin INDEX at HEAD, when every link is aligned, readable and
    mirrored by its bk, every size belongs in the bin, the list ends at its head, and it is not longer than
    BOUND; else None (the careful walk then finds what is wrong).  Reads the chunk headers out of the
    memory's spans (`span_at`) without a call per chunk, and detects cycles with Brent's method instead of a
    visited set."""
    span_at = getattr(mem, "span_at", None)
    if span_at is None:
        return None
    try:
        p, head_bk = _QQ.unpack(mem.read(head + 16, 16))
    except ReadError:
        return None
    chunks, sizes = array("Q"), array("Q")
    add_chunk, add_size, unpack_from = chunks.append, sizes.append, _QQQ.unpack_from
    base, data, limit = 0, b"", -1        # the span read last; a header at offset <= limit lies within it
    prev, tortoise, power, steps, size_ok = head, -1, 1, 0, -1
    while p != head:
        if p == tortoise:
            return None                  # a cycle that does not pass through the head
        off = p + 8 - base
        if 0 <= off <= limit:
            raw_size, fd, bk = unpack_from(data, off)
        else:
            try:
                base, data = span_at(p + 8)
                limit = len(data) - 24
                off = p + 8 - base
                raw_size, fd, bk = unpack_from(data, off) if off <= limit else _QQQ.unpack(mem.read(p + 8, 24))
            except ReadError:
                return None
        if bk != prev or p & (MALLOC_ALIGNMENT - 1):
            return None
        size = raw_size & ~SIZE_BITS
        if size != size_ok:
            if size < MINSIZE or size % MALLOC_ALIGNMENT or index >= 2 and bin_index(size) != index:
                return None
            size_ok = size
        add_chunk(p)
        add_size(raw_size)
        steps += 1
        if steps >= bound:
            return None
        if steps == power:
            tortoise, power = p, power * 2
        prev, p = p, fd
    if head_bk != prev:
        return None
    return chunks, sizes


def walk_tcache(mem: Memory, layout: Layout, address: int, fill_count: int | None = None) -> Tcache:
    """The tcache_perthread_struct at ADDRESS (user memory): every non-empty bin's list, head first.

    Lists are NULL-terminated through each entry's ``next`` (safe-linked from
    2.32); heads are raw.  For 2.42+ the stored ``num_slots`` count down from
    FILL_COUNT (mp_.tcache_count), so the count is FILL_COUNT - num_slots.
    """
    findings: list[Finding] = []
    nbins = layout.tcache_bins
    fill = fill_count if fill_count is not None else layout.tcache_fill_count
    try:
        raw = mem.read(address, layout.tcache_struct_size)
    except ReadError as exc:
        return Tcache(address, (), (Finding(Severity.ERROR, address, "tcache", f"cannot read: {exc}", Kind.TCACHE),))
    count_size = 2 if layout.tcache_count_size == 2 else 1
    fmt = "<%d%s" % (nbins, "H" if count_size == 2 else "B")
    counts = struct.unpack_from(fmt, raw, 0)
    heads = struct.unpack_from("<%dQ" % nbins, raw, layout.tcache_off_entries)
    bins: list[TcacheBin] = []
    for i in range(nbins):
        stored = counts[i]
        count = fill - stored if layout.tcache_counts_down else stored
        head = heads[i]
        slot = address + layout.tcache_off_entries + 8 * i
        structure = f"tcache bin {i} at {address:#x}"
        if layout.tcache_counts_down and stored > fill:
            findings.append(Finding(Severity.ERROR, address + count_size * i, structure,
                                    f"num_slots {stored} exceeds the fill count {fill}", Kind.TCACHE_COUNT,
                                    f"at most {fill}", str(stored)))
            count = 0
        if not head and not count:
            continue
        walk = ListWalk(structure, max(count, 1) + 65536)
        entries: list[int] = []
        e, holder = head, slot
        while e:
            if not walk.admit(e, "tcache entry", holder):
                break
            try:
                stored_next = hop_u64(mem, e)   # entries anywhere in the heaps: a word each, not a page
            except ReadError:
                walk.unreadable(holder, e, "tcache entry")
                break
            entries.append(e)
            holder = e
            e = reveal(e, stored_next) if layout.safe_linking else stored_next
        if walk.complete and len(entries) != count:
            at = entries[-1] if entries and len(entries) < count else address + count_size * i
            walk.fail(at, f"tcache count does not match list length: count {count}, {len(entries)} entries "
                          "linked" + (f"; the list ends at {at:#x}" if at in entries else ""),
                      Kind.TCACHE_COUNT, expected=str(count), found=str(len(entries)), cut=False)
        findings.extend(walk.findings)
        if i < 64:
            bins.append(TcacheBin(i, MINSIZE + MALLOC_ALIGNMENT * i, count, tuple(entries), walk.complete))
            continue
        sizes, spans = _large_entry_sizes(mem, layout, entries, structure, findings)
        bins.append(TcacheBin(i, min(sizes, default=0), count, tuple(entries), walk.complete, sizes, spans))
    return Tcache(address, tuple(bins), tuple(findings))


def _large_entry_sizes(mem: Memory, layout: Layout, entries: list[int], structure: str,
                       findings: list[Finding]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Chunk size and memory held of each entry of a large tcache bin (2.42+: mixed sizes, maybe mmapped)."""
    sizes, spans = [], []
    for e in entries:
        try:
            prev_size, size_field = struct.unpack("<QQ", mem.read(e - 16, 16))
        except ReadError:
            findings.append(Finding(Severity.ERROR, e, structure, "the entry's chunk header is unreadable", Kind.UNMAPPED))
            sizes.append(0)
            spans.append(0)
            continue
        size = size_field & ~SIZE_BITS
        sizes.append(size)
        spans.append(layout.mmapped_span(prev_size, size) if size_field & IS_MMAPPED else size)
    return tuple(sizes), tuple(spans)

