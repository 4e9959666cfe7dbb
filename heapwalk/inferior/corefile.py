"""What the heapwalk command line needs to know about a core file before gdb opens it, read from the file.

An ELF64 core holds its memory in PT_LOAD segments and its process facts in notes: NT_FILE (the files
mapped, with their addresses), NT_AUXV (the auxiliary vector: AT_ENTRY is the program's entry point) and
NT_PRPSINFO (the command name).  From these: which executable the core was made from, and the build-id
of the copy that was mapped (gcore writes the first pages of each ELF file it finds mapped), to check
that an executable given for the core is the same build.  Pure Python, no gdb.
"""

from __future__ import annotations

import bisect
import json
import struct
from dataclasses import dataclass
from pathlib import Path

from heapwalk.arch import Architecture, by_elf_machine, known
from heapwalk.common.errors import HeapwalkError
from heapwalk.inferior.elf import iter_notes

__all__ = ["CoreError", "CoreFile", "Truncation", "file_build_id", "format_ranges", "parse_ranges"]

#: the environment variable through which the command line tells heapwalk in gdb which address ranges a
#: truncated core lacks ("start-end,..." in hex)


def format_ranges(ranges) -> str:
    return ",".join(f"{a:x}-{b:x}" for a, b in ranges)


def parse_ranges(text: str) -> list[tuple[int, int]]:
    """'a-b,c-d' (hex) -> [(a, b), (c, d)]; malformed parts are left out."""
    out = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                out.append((int(lo, 16), int(hi, 16)))
        except ValueError:
            continue
    return out


_ET_CORE = 4
_PT_LOAD, _PT_NOTE = 1, 4
_PF_W = 2
_NT_PRPSINFO, _NT_AUXV, _NT_FILE, _NT_GNU_BUILD_ID = 3, 6, 0x46494C45, 3
_AT_ENTRY = 9


class CoreError(HeapwalkError):
    """The file is not an ELF64 little-endian core, or is cut short where its headers are."""


@dataclass(frozen=True)
class FileMapping:
    start: int
    end: int
    offset: int          # in the file, bytes
    path: str


def _build_id_of_image(read, base: int) -> str | None:
    """The GNU build-id of the ELF image whose first bytes READ(offset, size) returns (from its PT_NOTEs)."""
    try:
        head = read(base, 64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return None
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        for i in range(min(phnum, 64)):
            p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", read(base + phoff + i * phentsize, 56))
            if p_type != _PT_NOTE or p_filesz > 1 << 16:
                continue
            for kind, name, desc in iter_notes(read(base + p_offset, p_filesz)):
                if kind == _NT_GNU_BUILD_ID and name == b"GNU":
                    return desc.hex()
    except (struct.error, OSError, LookupError):
        return None
    return None


def file_build_id(path: str | Path) -> str | None:
    """The GNU build-id of the ELF file at PATH, None when it has none or is not readable ELF."""
    try:
        with open(path, "rb") as f:
            def read(offset: int, size: int) -> bytes:
                f.seek(offset)
                data = f.read(size)
                if len(data) != size:
                    raise LookupError(offset)
                return data
            return _build_id_of_image(read, 0)
    except OSError:
        return None


def _overlaps(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The non-empty intersections of the ranges of A with those of B."""
    b = sorted(b)
    starts = [lo for lo, _ in b]
    out = []
    for lo, hi in a:
        i = max(bisect.bisect_right(starts, lo) - 1, 0)
        while i < len(b) and b[i][0] < hi:
            x, y = max(lo, b[i][0]), min(hi, b[i][1])
            if x < y:
                out.append((x, y))
            i += 1
    return out


@dataclass(frozen=True)
class Truncation:
    """A core cut short: its size, the size its program headers call for, and the address ranges of the
    process's memory whose bytes lie past its end."""

    size: int
    expected: int
    missing: tuple[tuple[int, int], ...]

    @property
    def missing_bytes(self) -> int:
        return sum(end - start for start, end in self.missing)


class CoreFile:
    """An ELF64 core file's segments and notes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._f = open(self.path, "rb")
        except OSError as exc:
            raise CoreError(f"{path}: cannot open: {exc.strerror}") from None
        head = self._f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF":
            raise CoreError(f"{path} is not an ELF file, so not a core file")
        if head[4] != 2 or head[5] != 1:
            names = ", ".join(a.name for a in known())
            raise CoreError(f"{path} is not a 64-bit little-endian ELF file (heapwalk reads {names} cores)")
        e_type, self.machine = struct.unpack_from("<HH", head, 16)
        if e_type != _ET_CORE:
            raise CoreError(f"{path} is an ELF file but not a core file (it is a program or library)")
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        self._f.seek(phoff)
        table = self._f.read(phentsize * phnum)
        if len(table) < phentsize * phnum:
            raise CoreError(f"{path} is cut short: its program headers are missing")
        self.loads: list[tuple[int, int, int, int]] = []    # (vaddr, memsz, file offset, filesz)
        self.writable: list[tuple[int, int]] = []            # the load segments the process could write
        self.load_flags: list[int] = []                      # each load segment's p_flags
        self._note_data = b""
        for i in range(phnum):
            p_type, p_flags, p_offset, p_vaddr, _, p_filesz, p_memsz = struct.unpack_from("<IIQQQQQ", table,
                                                                                          i * phentsize)
            if p_type == _PT_LOAD:
                self.loads.append((p_vaddr, p_memsz, p_offset, p_filesz))
                self.load_flags.append(p_flags)
                if p_flags & _PF_W:
                    self.writable.append((p_vaddr, p_vaddr + p_memsz))
            elif p_type == _PT_NOTE:
                self._f.seek(p_offset)
                self._note_data += self._f.read(p_filesz)
        self.notes = list(iter_notes(self._note_data))

    @property
    def arch(self) -> Architecture:
        """The architecture of the process the core is of; UnknownArchitecture when heapwalk reads none such."""
        return by_elf_machine(self.machine)

    def fileno(self) -> int:
        """The core file's descriptor (to ask its file system where its data is)."""
        return self._f.fileno()

    def close(self) -> None:
        self._f.close()

    def truncation(self) -> Truncation | None:
        """How the file falls short of what its program headers describe (as chap's truncation check does),
        or None when every segment's bytes are there."""
        size = self.path.stat().st_size
        expected = max([offset + filesz for _, _, offset, filesz in self.loads] + [size])
        if expected <= size:
            return None
        missing = tuple((vaddr + max(0, size - offset), vaddr + filesz) for vaddr, _, offset, filesz in self.loads
                        if filesz and offset + filesz > size)
        return Truncation(size, expected, missing)

    def read(self, address: int, size: int) -> bytes:
        """SIZE bytes of the process's memory at ADDRESS as the core holds them (LookupError where it does not)."""
        for vaddr, _, offset, filesz in self.loads:
            if vaddr <= address and address + size <= vaddr + filesz:
                self._f.seek(offset + address - vaddr)
                data = self._f.read(size)
                if len(data) == size:
                    return data
        raise LookupError(f"{address:#x} is not in the core")

    def regions(self) -> list[tuple[int, int]]:
        """The load segments as [start, end) ranges, one a mapping of the process: the segments `heapwalk
        capture` wrote for one mapping (pages stored, pages zero-filled) joined again, by the mappings its
        note lists, so that a region starts where a mapping does, as in the kernel's and gcore's cores."""
        bounds = self.capture_facts().get("mappings")
        loads = sorted((vaddr, vaddr + memsz) for vaddr, memsz, _, _ in self.loads)
        if not isinstance(bounds, list):
            return loads
        starts = sorted(a for a, *_ in bounds if isinstance(a, int))
        out: list[tuple[int, int]] = []
        for lo, hi in loads:
            i = bisect.bisect_right(starts, lo) - 1
            same = out and out[-1][1] == lo and (i < 0 or starts[i] < lo)
            if same:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((lo, hi))
        return out

    def holes(self, reads_file) -> list[tuple[int, int]]:
        """The ranges of the process's memory whose bytes the core does not hold, though a reader may get
        zeros there: the runs `heapwalk capture` did not read (its note's "not_read"), and the zero-filled
        parts of load segments that lie in a mapped file where READS_FILE(mapping, start) says the reader
        does not get the file's bytes (gdb fills them from the file, or with zeros when it has none)."""
        out = [(a, b) for a, b, *_ in self.capture_facts().get("not_read", ())
               if isinstance(a, int) and isinstance(b, int)]
        filled = [(vaddr + filesz, vaddr + memsz) for vaddr, memsz, _, filesz in self.loads if filesz < memsz]
        verdicts: dict[str, bool] = {}
        for m in self.file_mappings():
            parts = _overlaps(filled, [(m.start, m.end)])
            if not parts:
                continue
            if m.path not in verdicts:
                verdicts[m.path] = reads_file(m, parts[0][0])
            if not verdicts[m.path]:
                out += parts
        return sorted(out)

    def file_mappings(self) -> list[FileMapping]:
        """The NT_FILE note: every file mapping of the process."""
        for kind, name, desc in self.notes:
            if kind == _NT_FILE and name == b"CORE" and len(desc) >= 16:
                count, page = struct.unpack_from("<QQ", desc, 0)
                table_end = 16 + count * 24
                names = desc[table_end:].split(b"\0")
                out = []
                for i in range(min(count, len(names))):
                    start, end, pgoff = struct.unpack_from("<QQQ", desc, 16 + i * 24)
                    out.append(FileMapping(start, end, pgoff * page, names[i].decode(errors="replace")))
                return out
        return []

    def auxv(self) -> dict[int, int]:
        for kind, name, desc in self.notes:
            if kind == _NT_AUXV and name == b"CORE":
                return {k: v for k, v in struct.iter_unpack("<QQ", desc[:len(desc) // 16 * 16])}
        return {}

    def capture_facts(self) -> dict:
        """What `heapwalk capture` recorded beside the memory (its HEAPWALK note: the CPU counts), or {}."""
        for kind, name, desc in self.notes:
            if kind == 1 and name == b"HEAPWALK":
                try:
                    facts = json.loads(desc)
                except ValueError:
                    return {}
                return facts if isinstance(facts, dict) else {}
        return {}

    def command(self) -> str:
        """The command line the core's process ran (NT_PRPSINFO's pr_psargs), or ''."""
        for kind, name, desc in self.notes:
            if kind == _NT_PRPSINFO and name == b"CORE" and len(desc) >= 136:
                return desc[56:136].split(b"\0")[0].decode(errors="replace").strip()
        return ""

    def executable(self) -> FileMapping | None:
        """The mapping at offset 0 of the file holding the program's entry point (AT_ENTRY): the executable
        the process ran (the dynamic loader, when the program was started as 'ld.so PROGRAM')."""
        entry = self.auxv().get(_AT_ENTRY)
        maps = self.file_mappings()
        holder = next((m for m in maps if entry is not None and m.start <= entry < m.end), None)
        if holder is None:
            return None
        return min((m for m in maps if m.path == holder.path and m.offset == 0), key=lambda m: m.start,
                   default=None)

    def mapped_build_ids(self) -> list[tuple[str, str]]:
        """(path, build-id) of each file the process mapped from its start, as the core holds its first pages
        (the files whose first pages the core lacks, or that carry no build-id, left out)."""
        out = {}
        for m in self.file_mappings():
            if m.offset == 0 and m.path not in out:
                found = _build_id_of_image(lambda off, n, at=m.start: self.read(at + off, n), 0)
                if found:
                    out[m.path] = found
        return list(out.items())

    def executable_build_id(self) -> str | None:
        """The build-id of the executable as mapped in the process, when the core holds its first pages."""
        exe = self.executable()
        return None if exe is None else _build_id_of_image(lambda off, n: self.read(exe.start + off, n), 0)
