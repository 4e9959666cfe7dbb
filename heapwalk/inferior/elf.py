"""A loaded ELF image (libc, an allocator's library, the program), read through target memory.

A core holds the first page of every file mapping (ELF headers and the
build-id note) and libc's written data (.data, .bss, the GOT), but not its
.text or .rodata; gdb serves those from the libc file when it has it.  So
everything here reads memory and treats a `ReadError` as "not available":
the program headers and writable segment always work, symbols, the banner
and code only when the file is present (or the process is live).
"""

from __future__ import annotations

import re
import struct
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from heapwalk.arch import DEFAULT, Architecture, CodeReader, CodeRef, UnknownArchitecture, by_elf_machine
from heapwalk.common.errors import CannotDecode
from heapwalk.inferior.memory import Memory, ReadError

__all__ = ["Mapping", "Segment", "ElfImage", "find_libc", "readable_runs", "writable_words", "LIBC_FILE_NAME"]

PT_LOAD, PT_DYNAMIC, PT_INTERP, PT_NOTE, PT_TLS = 1, 2, 3, 4, 7
PF_X, PF_W, PF_R = 1, 2, 4
DT_NULL, DT_STRTAB, DT_SYMTAB, DT_RELA, DT_RELASZ = 0, 5, 6, 7, 8
NT_GNU_BUILD_ID = 3

#: libc.so.6 (2.34+, and the soname everywhere) or libc-2.NN.so (up to 2.33)
LIBC_FILE_NAME = re.compile(r"(?:^|/)(?:libc\.so\.6|libc-(\d+)\.(\d+)(?:\.\d+)?\.so)$")


@dataclass(frozen=True)
class Mapping:
    """One mapping of the target's address space (from the core's file note or /proc/PID/maps)."""

    start: int
    end: int
    offset: int
    path: str


@dataclass(frozen=True)
class Segment:
    """A program header of the loaded image, with its runtime address."""

    type: int
    flags: int
    address: int
    memsz: int
    filesz: int

    @property
    def end(self) -> int:
        return self.address + self.memsz


@dataclass
class ElfImage:
    """A loaded ELF image in the target: base address, segments, its architecture, and lookups that need its
    file's pages."""

    base: int
    path: str
    segments: list[Segment]
    mem: Memory
    bias: int = 0
    machine: int = DEFAULT.elf_machine
    _dynsym: dict[str, int] | None = field(default=None, repr=False)

    @classmethod
    def read(cls, mem: Memory, base: int, path: str) -> "ElfImage":
        """Parses the ELF and program headers at BASE (the first page of libc's mapping)."""
        ehdr = mem.read(base, 64)
        if ehdr[:4] != b"\x7fELF" or ehdr[4] != 2 or ehdr[5] != 1:
            raise ReadError(base, 64, "no little-endian ELF64 header at libc's first mapping")
        phoff, = struct.unpack_from("<Q", ehdr, 32)
        phentsize, phnum = struct.unpack_from("<HH", ehdr, 54)
        table = mem.read(base + phoff, phentsize * phnum)
        headers = [struct.unpack_from("<IIQQQQQ", table, i * phentsize) for i in range(phnum)]
        # the load bias: the base for a shared object (linked at 0), zero for a non-PIE executable
        first = min((h[3] for h in headers if h[0] == PT_LOAD), default=0) & ~0xFFF
        bias = base - first
        segments = [Segment(p_type, p_flags, bias + p_vaddr, p_memsz, p_filesz)
                    for p_type, p_flags, _off, p_vaddr, _pa, p_filesz, p_memsz in headers]
        machine, = struct.unpack_from("<H", ehdr, 18)
        return cls(base, path, segments, mem, bias, machine)

    @property
    def arch(self) -> Architecture:
        """The architecture the image's code is for.  CannotDecode when its header names one heapwalk reads none
        of: in a target heapwalk reads, its header's bytes are damaged (or the object is foreign), and what needs
        its code cannot be decoded; the target's other allocators still can."""
        try:
            return by_elf_machine(self.machine)
        except UnknownArchitecture as exc:
            raise CannotDecode(f"{self.path or 'the object'} at {self.base:#x}: its ELF header says machine "
                               f"{self.machine}, not one heapwalk reads ({exc.names}): damaged, or foreign") from None

    @property
    def code(self) -> CodeReader:
        """The reader of the image's machine code."""
        return self.arch.code

    def through_slots(self, refs: list[CodeRef]) -> list[CodeRef]:
        """REFS with each slot the code reads an address from and goes through (`CodeRef.indirect`: a GOT slot)
        taken as that address computed; dropped where the slot is unreadable or its address is not in the image
        (a global of another object, such as the stack guard)."""
        out = []
        for ref in refs:
            if not ref.indirect:
                out.append(ref)
                continue
            try:
                address = struct.unpack("<Q", self.mem.read(ref.target, 8))[0]
            except ReadError:
                continue
            if self.contains(address):
                out.append(dataclasses.replace(ref, target=address, computes=True, indirect=False))
        return out

    @property
    def is_executable(self) -> bool:
        """A program rather than a shared libc: statically linked, libc inside it."""
        return not LIBC_FILE_NAME.search(self.path)

    @property
    def is_program(self) -> bool:
        """The program itself rather than a shared object: it names an interpreter, or links nothing
        dynamically."""
        return any(s.type == PT_INTERP for s in self.segments) or not any(s.type == PT_DYNAMIC
                                                                          for s in self.segments)

    def writable(self) -> list[Segment]:
        """The PT_LOAD segments libc writes (.data, .bss, .got): in every core."""
        return [s for s in self.segments if s.type == PT_LOAD and s.flags & PF_W]

    def readonly_data(self) -> list[Segment]:
        """The PT_LOAD segments that are neither writable nor code (.rodata, .dynsym); for an image linked
        without such a segment (its read-only data in its code segment, as Debian links some architectures'
        libraries), its code segments."""
        data = [s for s in self.segments if s.type == PT_LOAD and not s.flags & (PF_W | PF_X)]
        return data or [s for s in self.segments if s.type == PT_LOAD and not s.flags & PF_W]

    def readonly(self) -> list[Segment]:
        """Every PT_LOAD segment not written (read-only data and code): where an image linked without a
        separate read-only segment keeps its strings."""
        return [s for s in self.segments if s.type == PT_LOAD and not s.flags & PF_W]

    def contains(self, address: int) -> bool:
        return any(s.address <= address < s.end for s in self.segments if s.type == PT_LOAD)

    def tls_size(self) -> int | None:
        tls = [s for s in self.segments if s.type == PT_TLS]
        return tls[0].memsz if tls else None

    def build_id(self) -> str | None:
        """The GNU build-id (hex), from the note in libc's first page."""
        for seg in self.segments:
            if seg.type != PT_NOTE:
                continue
            try:
                data = self.mem.read(seg.address, seg.filesz)
            except ReadError:
                continue
            for ntype, name, desc in iter_notes(data):
                if ntype == NT_GNU_BUILD_ID and name == b"GNU":
                    return desc.hex()
        return None

    def dynamic_symbol(self, name: str) -> int | None:
        """Runtime address of exported symbol NAME (None if the symbol table is not readable)."""
        if self._dynsym is None:
            try:
                self._dynsym = self._read_dynsym()
            except ReadError:
                self._dynsym = {}
        return self._dynsym.get(name)

    def dynamic_names(self) -> set[str]:
        """The names of every symbol the image exports (empty when its symbol table is not readable)."""
        self.dynamic_symbol("")
        return set(self._dynsym or {})

    def _dynamic_tags(self) -> dict[int, int]:
        """The dynamic section's tags and their values (the first of each), empty when there is none
        (ReadError when it cannot be read)."""
        dyn = [s for s in self.segments if s.type == PT_DYNAMIC]
        raw = self.mem.read(dyn[0].address, dyn[0].memsz) if dyn else b""
        tags: dict[int, int] = {}
        for pos in range(0, len(raw) - 15, 16):
            tag, value = struct.unpack_from("<qQ", raw, pos)
            if tag == DT_NULL:
                break
            tags.setdefault(tag, value)
        return tags

    def _read_dynsym(self) -> dict[str, int]:
        tags = self._dynamic_tags()
        if DT_SYMTAB not in tags or DT_STRTAB not in tags:
            return {}
        # ld.so relocates these entries in place; the file has them unrelocated.
        symtab, strtab = (v if v >= self.base else v + self.bias for v in (tags[DT_SYMTAB], tags[DT_STRTAB]))
        if not symtab < strtab or strtab - symtab > 1 << 22:
            return {}
        syms = self.mem.read(symtab, strtab - symtab)
        strings_end = strtab + 0x10000
        for seg in self.segments:
            if seg.type == PT_LOAD and seg.address <= strtab < seg.end:
                strings_end = min(seg.end, strtab + (1 << 20))
        strings = self.mem.read(strtab, strings_end - strtab)
        out = {}
        for pos in range(24, len(syms) - 23, 24):
            st_name, st_info, _other, shndx, value = struct.unpack_from("<IBBHQ", syms, pos)
            if shndx == 0 or value == 0 or st_name >= len(strings):
                continue
            end = strings.find(b"\0", st_name)
            sym = strings[st_name:end].decode(errors="replace")
            out.setdefault(sym.split("@")[0], self.bias + value)
        return out

    def relocations(self, rtype: int) -> list[tuple[int, int, int]]:
        """(runtime address of the slot, symbol index, addend) of each dynamic relocation of type RTYPE
        (DT_RELA's table); empty when the dynamic section or the table is not readable."""
        try:
            tags = self._dynamic_tags()
            if DT_RELA not in tags or DT_RELASZ not in tags or tags[DT_RELASZ] > 1 << 24:
                return []
            start = tags[DT_RELA] if tags[DT_RELA] >= self.base else tags[DT_RELA] + self.bias
            table = self.mem.read(start, tags[DT_RELASZ])
        except ReadError:
            return []
        out = []
        for pos in range(0, len(table) - 23, 24):
            offset, info, addend = struct.unpack_from("<QQq", table, pos)
            if info & 0xFFFFFFFF == rtype:
                out.append((self.bias + offset, info >> 32, addend))
        return out

    def find_bytes(self, needle: bytes) -> tuple[int, bytes] | None:
        """First occurrence of NEEDLE in libc's read-only data: (address, the 160 bytes from there)."""
        for seg in self.readonly_data():
            for base, data in readable_runs(self.mem, seg.address, seg.filesz):
                pos = data.find(needle)
                if pos >= 0:
                    return base + pos, bytes(data[pos:pos + 160])
        return None


def readable_runs(mem: Memory, start: int, size: int) -> list[tuple[int, bytes | bytearray]]:
    """What can be read of [START, START+SIZE), as (address, bytes) runs: the whole range in one read when it
    can be, else page by page.  (gdb serves a library's pages that the core lacks from the file's sections
    when it could not map the file the core names, so the gaps between sections are unreadable then.)"""
    try:
        return [(start, mem.read(start, size))]
    except ReadError:
        pass
    runs: list[tuple[int, bytearray]] = []
    address, end = start, start + size
    while address < end:
        step = min(end, (address | 0xfff) + 1) - address
        try:
            piece = mem.read(address, step)
        except ReadError:
            address += step
            continue
        if runs and runs[-1][0] + len(runs[-1][1]) == address:
            runs[-1][1].extend(piece)
        else:
            runs.append((address, bytearray(piece)))
        address += step
    return runs


def iter_notes(data: bytes):
    """(type, name, desc) of each ELF note in DATA (a PT_NOTE segment of a program, library or core)."""
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
        name_end = pos + 12 + ((namesz + 3) & ~3)
        end = name_end + ((descsz + 3) & ~3)
        if name_end + descsz > len(data):
            return
        yield ntype, data[pos + 12:pos + 12 + namesz].rstrip(b"\0"), data[name_end:name_end + descsz]
        pos = end


def candidate_images(mem: Memory, mappings: list[Mapping], name: "re.Pattern[str]") -> list[tuple[ElfImage, bool]]:
    """Where an allocator may be: each object mapped from its start whose path NAME matches, as (its image, True);
    when none does, the first object mapped (the program: the allocator may be linked into it), as (its image,
    False).  An object whose ELF image cannot be read is left out."""
    firsts = [(m.start, m.path) for m in mappings if m.offset == 0 and m.path.startswith("/")]
    named = [(b, p) for b, p in firsts if name.search(p)]
    out = []
    for base, path in named or firsts[:1]:
        try:
            out.append((ElfImage.read(mem, base, path), bool(named)))
        except ReadError:
            continue
    return out


def find_libc(mappings: list[Mapping]) -> tuple[int, str] | None:
    """(base address, path) of libc among the target's mappings: its lowest mapping at file offset 0."""
    starts = [(m.start, m.path) for m in mappings if m.offset == 0 and LIBC_FILE_NAME.search(m.path)]
    return min(starts) if starts else None


def sole_file(mappings: list[Mapping]) -> tuple[int, str] | None:
    """(base, path) of the only file mapped at offset 0, as in a statically linked program; else None."""
    starts = {m.path: m.start for m in mappings if m.offset == 0 and m.path.startswith("/")
              and not m.path.startswith(("/dev/", "/memfd:", "/SYSV"))}
    return next(((base, path) for path, base in starts.items()), None) if len(starts) == 1 else None


def writable_words(mem: Memory, image: ElfImage) -> tuple[int, np.ndarray]:
    """IMAGE's writable segments (its data and bss) as one array of 8-byte words from their start, what cannot
    be read as zeros; (0, no words) when it has none.  An allocator's state found by its shapes is searched
    in it."""
    segments = image.writable()
    if not segments:
        return 0, np.zeros(0, dtype=np.uint64)
    lo = min(s.address for s in segments) & ~7
    hi = max(s.end for s in segments)
    data = bytearray(hi - lo)
    for s in segments:
        for at, chunk in readable_runs(mem, s.address, s.memsz):
            data[at - lo:at - lo + len(chunk)] = chunk
    return lo, np.frombuffer(bytes(data[:len(data) // 8 * 8]), dtype=np.uint64)
