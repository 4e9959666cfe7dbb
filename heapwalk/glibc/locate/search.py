"""What discovery asks and what it records: the user's overrides, debug symbols, libc's image in the target
(its banner, exported code, file name), and the facts and findings each step leaves."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from heapwalk.common.errors import CannotDecode
from heapwalk.common.findings import Fact, Finding, Severity
from heapwalk.glibc.kinds import Kind
from heapwalk.glibc.locate import heuristics
from heapwalk.inferior.elf import LIBC_FILE_NAME, PF_W, PT_LOAD, ElfImage, Mapping, find_libc, readable_runs, sole_file
from heapwalk.inferior.memory import Memory, ReadError


class DiscoveryError(CannotDecode):
    """glibc's malloc state could not be located; the message says what is missing."""


class SymbolSource(Protocol):
    """Answers from debug information, or None when it has no answer."""

    def data_address(self, name: str) -> int | None:
        """Address of libc's data object NAME (main_arena, mp_, free_list, __libc_version)."""

    def tls_offset(self, name: str) -> int | None:
        """Offset of libc's TLS variable NAME from a thread's thread pointer (tcache, thread_arena)."""

    def libc_file(self) -> tuple[str, str | None] | None:
        """(path, build-id) of the libc file the debugger loaded, whose symbols these are; None if none."""


class NoSymbols:
    """A SymbolSource that knows nothing."""

    def data_address(self, name: str) -> int | None:
        return None

    def tls_offset(self, name: str) -> int | None:
        return None

    def libc_file(self) -> tuple[str, str | None] | None:
        return None


class _Refusing:
    """Memory with some ranges taken away: reads that touch them fail (pages a core lacks, which gdb would
    fill from a library file that is not the one the process ran)."""

    def __init__(self, mem: Memory, ranges: list[tuple[int, int]], reason: str):
        self._mem, self._ranges, self._reason = mem, ranges, reason

    def read(self, address: int, size: int) -> bytes:
        for start, end in self._ranges:
            if address < end and start < address + size:
                raise ReadError(address, size, self._reason)
        return self._mem.read(address, size)


@dataclass
class Overrides:
    """Values the user set with ``set heapwalk ...``; None means discover."""

    glibc_version: tuple[int, int] | None = None
    main_arena: int | None = None


_VERSION = re.compile(rb"(\d+)\.(\d+)")


def parse_version(text: str | bytes) -> tuple[int, int]:
    """'2.36' (or 'GNU C Library ... release version 2.36.') -> (2, 36)."""
    if isinstance(text, str):
        text = text.encode()
    m = re.search(rb"release version (\d+)\.(\d+)", text) or _VERSION.search(text)
    if not m:
        raise ValueError(f"no glibc version in {text[:60]!r}")
    return int(m.group(1)), int(m.group(2))


def read_c_string(mem: Memory, address: int, limit: int = 256) -> bytes:
    """The NUL-terminated string at ADDRESS (at most LIMIT bytes)."""
    out = bytearray()
    while len(out) < limit:
        chunk = mem.read(address + len(out), 16)
        nul = chunk.find(b"\0")
        if nul >= 0:
            return bytes(out + chunk[:nul])
        out += chunk
    return bytes(out)


def version_text(v: tuple[int, int]) -> str:
    return f"{v[0]}.{v[1]}"


class Search:
    """State shared by the discovery steps: what is known so far, and the facts and findings recorded."""

    def __init__(self, mem: Memory, symbols: SymbolSource, overrides: Overrides, mappings: list[Mapping],
                 thread_pointers: list[int], core: bool = False, regions: list[tuple[int, int]] | None = None):
        self.mem = mem
        self.regions = regions if regions is not None else [(m.start, m.end) for m in mappings]
        self.core = core
        self.foreign_libc_file = False   # gdb loaded another build of libc than the process ran
        self.static_program = False      # libc is linked into the program: the program's file is libc's
        self.symbols = symbols
        self.overrides = overrides
        self.mappings = mappings
        self.thread_pointers = thread_pointers
        self.facts: list[Fact] = []
        self.findings: list[Finding] = []
        self.image: ElfImage | None = None
        self.libc_problem = "no libc.so.6 among the mappings (a static binary?)"  # why image is None
        self._tls_candidates: list[int] | None = None

    def libc_range(self) -> tuple[int, int] | None:
        loads = [s for s in self.image.segments if s.type == 1] if self.image else []
        return (min(s.address for s in loads), max(s.end for s in loads)) if loads else None

    def tls_candidates(self) -> list[int]:
        """Candidate TLS offsets from libc's writable segments, scanned once for tcache and thread_arena."""
        if self._tls_candidates is None:
            self._tls_candidates = heuristics.tls_candidates(self.mem, self.image)
        return self._tls_candidates

    def fact(self, name: str, value, how: str) -> None:
        self.facts.append(Fact(name, value, how))

    def note(self, severity: Severity, address: int, message: str) -> None:
        self.findings.append(Finding(severity, address, "discovery", message, Kind.DISCOVERY))

    def unknown(self, name: str, why: str) -> None:
        self.facts.append(Fact(name, None, f"not determined: {why}"))

    def code(self, function: str, size: int = 256) -> tuple[bytes, int] | None:
        """(first SIZE bytes, address) of libc's exported FUNCTION, if its code is readable."""
        if self.image is None:
            return None
        address = self.image.dynamic_symbol(function)
        if address is None:
            return None
        try:
            return self.mem.read(address, size), address
        except ReadError:
            return None

    # -- libc ---------------------------------------------------------------------------------------------

    def locate_libc(self) -> None:
        found = find_libc(self.mappings)
        how = "mappings"
        if found is None:
            found = sole_file(self.mappings)
            how = "mappings: the only file mapped, a statically linked program"
            self.static_program = found is not None
        if found is None and self.core and not self.mappings:
            self.libc_problem = "the core records no mapped files (its notes are missing: a truncated core?)"
            self.unknown("libc", self.libc_problem)
            return
        if found is None:
            self.libc_problem = "no libc.so.6 or libc-2.NN.so among the mappings (static binary?)"
            self.unknown("libc", self.libc_problem)
            return
        base, path = found
        try:
            self.image = ElfImage.read(self.mem, base, path)
        except ReadError as exc:
            self.libc_problem = (f"libc ({path}) is mapped at {base:#x}, but its ELF header there is unreadable "
                                 f"({exc.reason})")
            self.unknown("libc", self.libc_problem)
            return
        self.fact("libc", {"base": base, "path": path}, how)
        build_id = self.image.build_id()
        if build_id:
            self.fact("libc_build_id", build_id, "note in libc's first page")
            self.check_libc_file(base, build_id)

    def check_libc_file(self, base: int, build_id: str) -> None:
        """Stops trusting a libc file the debugger loaded that is another build than the process ran (a core
        opened on a machine with another glibc, or a live process whose libc was upgraded on disk): its
        symbols would point at the wrong places and, in a core, the pages it fills in would be another
        libc's."""
        loaded = self.symbols.libc_file()
        if loaded is None or not loaded[1] or loaded[1] == build_id:
            return
        path, file_id = loaded
        self.symbols = NoSymbols()
        self.foreign_libc_file = True
        what = "its symbols"
        if self.core:
            first_page = base + 0x1000
            kept = [(max(s.address, first_page), s.end) for s in self.image.segments
                    if s.type == PT_LOAD and not s.flags & PF_W and s.end > first_page]
            self.mem = _Refusing(self.mem, kept, f"{path} is not the libc the process ran")
            self.image = ElfImage.read(self.mem, base, self.image.path)
            what = "its symbols and the read-only pages it would fill in"
        self.note(Severity.WARNING, base, f"the libc file gdb loaded ({path}, build-id {file_id}) is not the one "
                  f"the process ran (build-id {build_id}): {what} are not used; open the target with the "
                  "process's own libc (heapwalk report --sysroot DIR, or 'set sysroot' / 'set solib-search-path' "
                  "in gdb before loading the core)")

    # -- version ------------------------------------------------------------------------------------------

    def _readonly_held(self) -> bool:
        """Whether libc's image's read-only data is there to read (from the core, or from the file gdb was
        given), judged past its first page (a core keeps an ELF mapping's first page): a page that is neither
        reads as zeros where a capture left a hole, or fails."""
        for seg in self.image.readonly_data():
            first = (seg.address | 0xFFF) + 1
            for at in {(seg.address + seg.filesz // 2) & ~0xFFF, (seg.end - 0x1000) & ~0xFFF}:
                if at >= first and any(any(data) for _s, data in readable_runs(self.mem, at, 0x1000)):
                    return True
        return False

    def version(self) -> tuple[tuple[int, int] | None, str]:
        """The glibc version and how it was found, or (None, why not)."""
        if self.overrides.glibc_version:
            return self.overrides.glibc_version, "set heapwalk glibc-version"
        address = self.symbols.data_address("__libc_version")
        if address is not None:
            try:
                return parse_version(read_c_string(self.mem, address)), "symbol __libc_version"
            except (ReadError, ValueError):
                pass
        if self.image is None:
            return None, self.libc_problem
        banner = self.image.find_bytes(b"GNU C Library ")
        if banner is not None and b"release version " in banner[1]:
            try:
                return parse_version(banner[1]), f"banner in libc's read-only data at {banner[0]:#x}"
            except ValueError:
                pass
        code = self.code("gnu_get_libc_version", 16)
        if code is not None:
            target = self.image.code.first_address(*code)
            if target is not None:
                try:
                    return parse_version(read_c_string(self.mem, target, 16)), \
                        f"string returned by gnu_get_libc_version at {target:#x}"
                except (ReadError, ValueError):
                    pass
        m = LIBC_FILE_NAME.search(self.image.path)
        if m and m.group(1):
            return (int(m.group(1)), int(m.group(2))), f"file name {self.image.path}"
        if self.foreign_libc_file:
            return None, "libc's read-only pages are not in the core and the libc file gdb has is another build"
        if self.static_program and self._readonly_held():
            return None, ("glibc is linked into the program, which holds no version string (a static program links "
                          "glibc's banner and gnu_get_libc_version only when it calls them): its layout tells the "
                          "versions it can be; 'set heapwalk glibc-version X.Y' names it")
        if self.static_program:
            return None, (f"glibc is linked into the program, whose read-only pages are not in the core and whose "
                          f"file ({self.image.path}) is not available: give the program as EXE")
        return None, "libc's read-only pages are not in the core and its file is not available"
