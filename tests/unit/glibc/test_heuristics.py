"""Discovery without symbols on a synthetic process image: libc's ELF headers, main_arena, mp_, GOT, TLS."""

from __future__ import annotations

import struct

import pytest

from heapwalk.arch.x86_64 import code as x86
from heapwalk.glibc.locate.discovery import DiscoveryError, NoSymbols, Overrides, discover
from heapwalk.inferior.elf import Mapping, find_libc, readable_runs
from heapwalk.glibc.locate.heuristics import tcache_safe_linking, tcache_struct_chunk
from heapwalk.inferior.threads import ThreadRegs
from heapwalk.glibc.decode import collect
from heapwalk.glibc.locate.layout import MP_INT_FIELDS, layout_for
from heapwalk.glibc.locate.arenashape import plausible_arena
from heapwalk.inferior.image import ImageMemory
from heapwalk.common.findings import Kind, Severity

BASE = 0x7F1230000000          # libc's first mapping
DATA = BASE + 0x10000          # its writable segment
MP = DATA + 0x800
MAIN_ARENA = DATA + 0x1000
GOT_TCACHE = DATA + 0x100
HEAP = 0x555555559000
TLS = 0x7F1240000000
FS_BASE = TLS + 0x800
TCACHE_TPOFF, ARENA_TPOFF = -0x48, -0x38


def _elf_header(segments: list[tuple[int, int, int, int]]) -> bytes:
    """An ELF64 header and program headers: (p_type, p_flags, vaddr, memsz) each."""
    ehdr = bytearray(64)
    ehdr[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<H", ehdr, 18, 62)       # the machine whose TLS lies below the thread pointer
    struct.pack_into("<Q", ehdr, 32, 64)
    struct.pack_into("<HH", ehdr, 54, 56, len(segments))
    phdrs = b"".join(struct.pack("<IIQQQQQQ", t, f, 0, v, v, m, m, 0x1000) for t, f, v, m in segments)
    return bytes(ehdr) + phdrs


class Process:
    """A 2.36-like process: libc with main_arena and mp_ in its data, one thread with a tcache."""

    def __init__(self, entries_in_tcache: int = 2, decoys: tuple[int, ...] = (-0x10, -0x100, -0x48 - 0x1000)):
        self.layout = layout_for((2, 36))
        lay = self.layout
        header = _elf_header([(1, 4, 0, 0x1000), (1, 6, 0x10000, 0x8000)])
        self.mem = ImageMemory({BASE: header + bytes(0x1000 - len(header)), DATA: bytes(0x8000),
                                HEAP: bytes(0x21000), TLS: bytes(0x1000)})
        w = self.mem.write_u64
        for i in range(1, 128):
            head = lay.bin_header(MAIN_ARENA, i)
            w(head + 16, head)
            w(head + 24, head)
        top = HEAP + 0x400
        w(MAIN_ARENA + lay.off_next, MAIN_ARENA)
        w(MAIN_ARENA + lay.off_top, top)
        w(MAIN_ARENA + lay.off_system_mem, 0x21000)
        w(top + 8, (0x21000 - 0x400) | 1)
        for name, value in dict(trim_threshold=0x20000, top_pad=0x20000, mmap_threshold=0x20000, arena_test=8,
                                sbrk_base=HEAP, tcache_bins=64, tcache_max_bytes=1032, tcache_count=7).items():
            w(MP + lay.mp[name], value)
        w(MP + lay.mp["n_mmaps_max"], 65536)  # an int, the next int (max_n_mmaps) stays 0
        w(GOT_TCACHE, TCACHE_TPOFF & (2**64 - 1))
        w(GOT_TCACHE + 8, ARENA_TPOFF & (2**64 - 1))
        for i, d in enumerate(decoys):
            w(DATA + 0x200 + 8 * i, d & (2**64 - 1))
        # the thread's tcache: struct at HEAP+0x10, bin 0 holds ENTRIES_IN_TCACHE chunks, safe-linked
        tcache = HEAP + 0x10
        w(HEAP + 8, 0x291)
        entries = [HEAP + 0x2a0 + 0x20 * k for k in range(entries_in_tcache)]
        w(tcache, len(entries))
        if entries:
            w(tcache + lay.tcache_off_entries, entries[0])
        for e, nxt in zip(entries, entries[1:] + [0]):
            w(e - 8, 0x21)
            w(e, (e >> 12) ^ nxt)
        held = HEAP + 0x290 + 0x20 * len(entries)  # one chunk the program holds, up to top
        w(held + 8, (top - held) | 1)
        w(FS_BASE + TCACHE_TPOFF, tcache)
        w(FS_BASE + ARENA_TPOFF, MAIN_ARENA)
        self.tcache = tcache

    def mappings(self, path: str = "/usr/lib/x86_64-linux-gnu/libc.so.6") -> list[Mapping]:
        return [Mapping(BASE, BASE + 0x1000, 0, path), Mapping(DATA, DATA + 0x8000, 0x10000, path)]

    def discover(self, path: str = "/usr/lib/x86_64-linux-gnu/libc.so.6", overrides: Overrides | None = None):
        return discover(self.mem, NoSymbols(), overrides, self.mappings(path), [FS_BASE])


def test_everything_is_found_from_memory_alone():
    disc = Process().discover()
    assert disc.main_arena == MAIN_ARENA
    assert disc.mp_address == MP
    assert disc.tcache_tpoff == TCACHE_TPOFF and disc.thread_arena_tpoff == ARENA_TPOFF
    assert disc.version_label == "2.35-2.41" and disc.layout.safe_linking
    how = {f.name: f.found_by for f in disc.facts}
    assert how["main_arena"].startswith("bin-127 self-link scan")
    assert how["glibc_version"].startswith("not determined")
    assert [f.severity for f in disc.findings] == [Severity.INFO]


def test_the_file_name_gives_the_version_up_to_2_33():
    disc = Process().discover(path="/lib/x86_64-linux-gnu/libc-2.31.so", overrides=Overrides((2, 36)))
    assert disc.version_label == "2.36"  # the override wins over the file name
    p = Process()
    assert find_libc(p.mappings("/lib/x86_64-linux-gnu/libc-2.31.so")) == (BASE, "/lib/x86_64-linux-gnu/libc-2.31.so")


def _more_bins(p: Process, n: int, mangled: bool = True) -> None:
    """N more tcache bins of P's thread, each holding one entry whose end-of-list link is mangled (or plain)."""
    off = p.layout.tcache_off_entries
    for k in range(1, n + 1):
        e = HEAP + 0x300 + 0x40 * k
        p.mem.write_u64(p.tcache + off + 8 * k, e)
        p.mem.write_u64(e, e >> 12 if mangled else 0)


def test_a_version_memory_contradicts_is_corrected_and_reported():
    p = Process()
    _more_bins(p, 3)        # four bins whose links read mangled: decisive evidence against 2.31's plain links
    disc = p.discover(overrides=Overrides((2, 31)))
    assert disc.layout.safe_linking and disc.layout.mp == layout_for((2, 36)).mp
    (warning,) = [f for f in disc.findings if f.severity is Severity.WARNING]
    assert "memory contradicts the glibc 2.31 layout" in warning.message
    assert "safe-linking" in warning.message and "mp_ layout" in warning.message


def test_one_poisoned_tcache_head_does_not_make_the_version_doubted():
    """A known 2.36 whose one tcache bin's head links as if there were no safe-linking (a poisoned next): one vote
    against the version's layout, not enough to doubt it; its layout stays, no contradiction is said."""
    p = Process(entries_in_tcache=1)
    entry = HEAP + 0x2a0
    p.mem.write_u64(entry, HEAP + 0x800)     # a plain pointer where 2.36 stores a mangled one
    disc = p.discover(overrides=Overrides((2, 36)))
    assert disc.layout.safe_linking
    assert not [f for f in disc.findings if "contradicts" in f.message]
    _more_bins(p, 3, mangled=False)           # four plain links: the layout is corrected, and said to be
    disc = p.discover(overrides=Overrides((2, 36)))
    assert not disc.layout.safe_linking and any("contradicts" in f.message for f in disc.findings)


def test_no_arena_in_memory_is_a_clear_error():
    p = Process()
    p.mem.write_u64(MAIN_ARENA + p.layout.off_next, 0)  # breaks the ring: no candidate validates
    with pytest.raises(DiscoveryError, match="cannot find main_arena"):
        p.discover(overrides=Overrides((2, 36)))
    with pytest.raises(DiscoveryError, match="cannot tell which glibc"):
        p.discover()


def test_a_main_arena_override_is_used_as_given():
    disc = Process().discover(overrides=Overrides((2, 36), MAIN_ARENA))
    assert disc.main_arena == MAIN_ARENA and disc.found_by("main_arena") == "set heapwalk main-arena"


def test_safe_linking_is_read_from_tcache_links():
    p = Process(entries_in_tcache=3)
    off, nbins = p.layout.tcache_off_entries, p.layout.tcache_bins
    assert tcache_safe_linking(p.mem, [p.tcache], off, nbins) is True
    first = p.mem.read(p.tcache + off, 8)
    entry = struct.unpack("<Q", first)[0]
    for k in range(3):  # rewrite the list with plain links
        e = entry + 0x20 * k
        p.mem.write_u64(e, e + 0x20 if k < 2 else 0)
    assert tcache_safe_linking(p.mem, [p.tcache], off, nbins) is False
    assert tcache_safe_linking(Process(entries_in_tcache=0).mem, [p.tcache], off, nbins) is None


def test_tcache_struct_chunks_may_carry_a_small_remainder():
    assert [tcache_struct_chunk(s) for s in (0x290, 0x2a0, 0x2b0, 0x300, 0x310, 0x250, 0x280, None)] == \
        [0x290, 0x290, None, 0x300, 0x300, 0x250, None, None]


class _FileSymbols:
    """Debug symbols of a libc file with BUILD_ID that put main_arena at ADDRESS."""

    def __init__(self, build_id: str, address: int):
        self.build_id, self.address = build_id, address

    def data_address(self, name: str) -> int | None:
        return self.address if name == "main_arena" else None

    def tls_offset(self, name: str) -> int | None:
        return None

    def libc_file(self) -> tuple[str, str | None]:
        return "/here/libc.so.6", self.build_id


def _process_with_build_id() -> Process:
    """Process() whose libc has a build-id note in its first page and a banner in a read-only page the
    core lacks: what gdb fills in there comes from whatever libc file it loaded."""
    p = Process()
    note = struct.pack("<III", 4, 4, 3) + b"GNU\0" + bytes.fromhex("c0ffee00")
    header = _elf_header([(1, 4, 0, 0x2000), (4, 4, 0x400, len(note)), (1, 6, 0x10000, 0x8000)])
    p.mem.segments[BASE][:len(header)] = header
    p.mem.segments[BASE][0x400:0x400 + len(note)] = note
    p.mem.add(BASE + 0x1000, b"GNU C Library (Debian GLIBC 2.36-9) release version 2.36.\n".ljust(0x1000, b"\0"))
    return p


def test_symbols_of_another_libc_build_are_not_used():
    p = _process_with_build_id()
    mappings = p.mappings() + [Mapping(BASE + 0x1000, BASE + 0x2000, 0x1000, "/usr/lib/x86_64-linux-gnu/libc.so.6")]
    same = discover(p.mem, _FileSymbols("c0ffee00", MAIN_ARENA), None, mappings, [FS_BASE], core=True)
    assert same.found_by("main_arena") == "symbol main_arena" and not [
        f for f in same.findings if f.severity is Severity.WARNING]

    # a core opened with another build of libc: neither its symbols nor the pages it fills in are used
    other = discover(p.mem, _FileSymbols("0badf11e", MAIN_ARENA + 0x40), None, mappings, [FS_BASE], core=True)
    assert other.main_arena == MAIN_ARENA and other.found_by("main_arena").startswith("bin-127 self-link scan")
    assert other.found_by("glibc_version").startswith("not determined: libc's read-only pages are not in the "
                                                      "core and the libc file gdb has is another build")
    (warning,) = [f for f in other.findings if f.severity is Severity.WARNING]
    assert "(/here/libc.so.6, build-id 0badf11e) is not the one the process ran (build-id c0ffee00)" \
        in warning.message and "--sysroot" in warning.message

    # a live process whose libc file was replaced on disk: its memory is still its own, only symbols go
    live = discover(p.mem, _FileSymbols("0badf11e", MAIN_ARENA + 0x40), None, mappings, [FS_BASE])
    assert live.main_arena == MAIN_ARENA and live.version_label == "2.36"
    assert live.found_by("glibc_version").startswith("banner in libc's read-only data")


def test_a_range_with_unreadable_gaps_is_read_page_by_page():
    """A library's read-only segment served from its sections only: the pages between sections fail."""
    mem = ImageMemory({0x10000: b"a" * 0x2000, 0x13000: b"GNU C Library " + b"b" * 0x1ff2})
    assert readable_runs(mem, 0x10000, 0x2000) == [(0x10000, b"a" * 0x2000)]    # one read when it can
    runs = readable_runs(mem, 0x10000, 0x5000)
    assert [(a, len(d)) for a, d in runs] == [(0x10000, 0x2000), (0x13000, 0x2000)]
    assert runs[1][1].startswith(b"GNU C Library ")
    assert readable_runs(mem, 0x12000, 0x1000) == []


def test_instruction_shapes():
    # lea rax,[rip+0x10]; ret
    code = bytes.fromhex("488d0510000000c3")
    assert x86.first_lea(code, 0x1000) == 0x1000 + 7 + 0x10
    # mov rax,[rip-0x20]; mov rdx,fs:[rax]  -> the GOT slot of an initial-exec TLS variable
    code = bytes.fromhex("90" "488b05e0ffffff" "64488b10")
    assert x86.tls_got_slot(code, 0x2000) == 0x2001 + 7 - 0x20
    assert [r.target for r in x86.rip_loads(code, 0x2000) if not r.computes] == [0x2001 + 7 - 0x20]
    # a mov not followed by an fs access is no TLS load
    assert x86.tls_got_slot(bytes.fromhex("488b0500000000" "4889c7c3"), 0) is None


def test_byte_loads_direct_and_through_the_register_a_lea_just_set():
    """The bytes a function reads: movzx eax, byte [rip+d] and cmp byte [rip+d], 0 directly; and, as Debian's
    libjemalloc.so.2 reads background_thread's flag, lea rcx, [rip+d] then movzx eax, byte [rcx]; a lea whose
    register is used otherwise (lea rbx, [rip+d]; lea rdi, [rbx+0x40]: a mutex handed to a call) is no read."""
    code = bytes.fromhex("0fb60510000000"          # 0x1000 movzx eax, byte [rip+0x10]
                         "803d2000000000"          # 0x1007 cmp byte [rip+0x20], 0
                         "488d1d30000000"          # 0x100e lea rbx, [rip+0x30]
                         "488d7b40"                # 0x1015 lea rdi, [rbx+0x40]
                         "488d0d40000000"          # 0x1019 lea rcx, [rip+0x40]
                         "0fb601"                  # 0x1020 movzx eax, byte [rcx]
                         "4c8d0550000000"          # 0x1023 lea r8, [rip+0x50]
                         "410fb600"                # 0x102a movzx eax, byte [r8]
                         "488d1560000000"          # 0x102e lea rdx, [rip+0x60]
                         "0fb601"                  # 0x1035 movzx eax, byte [rcx]: not rdx
                         "c3")
    assert x86.rip_byte_loads(code, 0x1000) == [0x1007 + 0x10, 0x100e + 0x20, 0x1020 + 0x40, 0x102a + 0x50]


def _write_mp(p: Process, at: int, **values) -> None:
    """A malloc_par at AT of P's layout with VALUES (every other field 0)."""
    for name, value in values.items():
        off = p.layout.mp[name]
        if name in MP_INT_FIELDS:
            p.mem.write_u32(at + off, value & 0xFFFFFFFF)
        else:
            p.mem.write_u64(at + off, value & (2**64 - 1))


def test_mp_is_found_when_no_field_holds_its_default():
    """A long-running service's mp_: the dynamic threshold moved, every tunable set, and glibc 2.43's
    mmapped_mem drift (16 bytes per mremap) left it off the page grain with no chunk mapped."""
    p = Process()
    p.mem.write(MP, bytes(p.layout.mp_size))
    _write_mp(p, MP, trim_threshold=2**64 - 1, top_pad=3 << 20, mmap_threshold=7 << 20, arena_test=1, arena_max=2,
              n_mmaps=0, n_mmaps_max=0, max_n_mmaps=9, no_dyn_threshold=1, mmapped_mem=48, max_mmapped_mem=9 << 20,
              sbrk_base=HEAP, tcache_bins=37, tcache_max_bytes=600, tcache_count=3, tcache_unsorted_limit=5)
    disc = p.discover()
    assert disc.mp_address == MP
    assert disc.found_by("mp_") == "malloc_par near main_arena: its sbrk_base is where the main arena's memory starts"


def test_a_malloc_par_shape_that_memory_contradicts_is_not_taken_for_mp():
    """A decoy nearer main_arena than mp_, in range everywhere, whose sbrk_base is not where the main arena's
    memory starts, loses to the real mp_ farther away."""
    p = Process()
    decoy = MAIN_ARENA - p.layout.mp_size - 0x40
    _write_mp(p, decoy, arena_test=8, top_pad=0x20000, n_mmaps_max=65536, sbrk_base=HEAP + 0x1000, tcache_bins=64,
              tcache_count=7)
    assert p.discover().mp_address == MP


def test_without_mp_the_main_arena_is_walked_from_its_top_and_system_mem():
    p = Process()
    p.mem.write(MP, bytes(p.layout.mp_size))  # mp_ gone (damaged, or a page missing from the core)
    disc = p.discover()
    assert disc.mp_address is None and disc.found_by("mp_").startswith("not determined")
    state = collect(p.mem, disc, [ThreadRegs(1, 100, FS_BASE)], walk_chunks=True, regions=[])
    (main,) = state.arenas
    assert [(h.address, h.size) for h in main.heaps] == [(HEAP, 0x21000)]
    account = state.accounts[MAIN_ARENA]
    assert account.balanced and account.unwalked == 0
    (note,) = [f for f in state.all_findings() if f.kind is Kind.DISCOVERY and f.structure == "mp_"]
    assert note.severity is Severity.INFO and "top's end minus its system_mem" in note.message


def test_a_ring_that_leaves_the_heaps_for_a_damaged_link_names_no_main_arena():
    """Thread arenas found by their heaps, whose ring leads out of them: to an address outside the user address
    space (damage, as corrupt.c's arena_ring writes), which is never main_arena; to an address not in memory
    (libc's data cut from the core), which is main_arena, said to be missing."""
    from heapwalk.glibc.locate.headless import _ring_exits
    layout = layout_for((2, 39))
    a, b = 0x7F0000000030, 0x7F0004000030

    def memory(exit_link: int) -> ImageMemory:
        arena = bytearray(layout.arena_size)
        struct.pack_into("<Q", arena, layout.off_next, b)
        first = bytes(arena)
        struct.pack_into("<Q", arena, layout.off_next, exit_link)
        return ImageMemory({a: first, b: bytes(arena)})

    assert _ring_exits(memory(0x4141414141414140), layout, [a, b]) == (None, ())
    assert _ring_exits(memory(0x7F1234567CA0), layout, [a, b]) == (0x7F1234567CA0, ())


def _fresh_arena(layout, address: int, top: int) -> bytes:
    """A main_arena as malloc_init_state leaves it: every bin self-linked, TOP as given, nothing grown."""
    raw = bytearray(layout.arena_size)
    struct.pack_into("<Q", raw, layout.off_top, top)
    for index in range(1, 128):
        header = layout.bin_header(address, index)
        struct.pack_into("<QQ", raw, layout.off_bins + 16 * (index - 1), header, header)
    struct.pack_into("<Q", raw, layout.off_next, address)
    return bytes(raw)


def test_an_arena_that_never_grew_keeps_its_initial_top_even_where_it_is_not_16_byte_aligned():
    """glibc 2.43 (no fastbins) puts the bins 24 bytes in, so the initial top, the unsorted bin's header, is 8
    bytes off 16 while the arena has never grown (malloc initialised, nothing allocated: a process that
    allocates with jemalloc): that is a main_arena; a misaligned top in an arena that grew is not."""
    layout, address = layout_for((2, 43)), 0x7F0000001AC0
    initial = layout.bin_header(address, 1)
    assert initial % 16 == 8
    assert plausible_arena(ImageMemory({address: _fresh_arena(layout, address, initial)}), layout, address)
    grown = bytearray(_fresh_arena(layout, address, initial + 0x100))
    struct.pack_into("<Q", grown, layout.off_system_mem, 0x21000)
    assert not plausible_arena(ImageMemory({address: bytes(grown)}), layout, address)
