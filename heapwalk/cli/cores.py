"""Opening a core in gdb: the core and the executable that go with it (found from the core, checked by
build-id), and a truncated core padded so gdb opens it, with what it lacks named."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

from heapwalk.arch import UnknownArchitecture, host
from heapwalk.cli.gdbmi import CliError, Gdb
from heapwalk.inferior.corefile import CoreError, CoreFile, file_build_id, format_ranges


_E_SHOFF, _E_SHNUM = 40, 60   # ELF64 header: section header table offset, and its count and string index
_NT_PRSTATUS, _PRSTATUS_SIZE, _PT_NOTE = 1, 336, 4


def resolve_core(core: Path, exe: Path | None,
                 sysroot: Path | None = None) -> tuple[CoreFile, Path | None, list[str]]:
    """The core, the executable to open it with, and notes for the user; CliError when they cannot go
    together (no such file, not a core, an executable of another build than the core's).  Without EXE the
    program the core names is looked for under SYSROOT first (a copy of the machine the core came from),
    then where the core says it was."""
    if not core.exists():
        raise CliError(f"heapwalk: no such core file: {core}")
    if sysroot is not None and not sysroot.is_dir():
        raise CliError(f"heapwalk: no such sysroot folder: {sysroot}")
    try:
        cf = CoreFile(core)
    except CoreError as exc:
        raise CliError(f"heapwalk: {exc}") from None
    try:
        cf.arch.name
    except UnknownArchitecture as exc:
        cf.close()
        raise CliError(f"heapwalk: {core}: {exc}") from None
    notes = [note for note in (_not_the_mapped_files(cf, sysroot),) if note]
    mapped = cf.executable()
    in_core = cf.executable_build_id()
    if exe is None:
        candidates = _executable_candidates(mapped.path, sysroot) if mapped else []
        if not candidates:
            where = f" ({mapped.path}, not on this machine{' nor under ' + str(sysroot) if sysroot else ''})" \
                if mapped else ""
            notes.append(f"the core's executable is not known{where}: give it as EXE for symbols and libraries")
            return cf, None, notes
        matching = [c for c in candidates if not in_core or file_build_id(c) in (None, in_core)]
        exe = (matching or candidates)[0]
        notes.append(f"executable from the core: {exe}")
    if not exe.is_file():
        raise CliError(f"heapwalk: no such executable: {exe}")
    in_file = file_build_id(exe)
    if in_core and in_file and in_core != in_file:
        raise CliError(f"heapwalk: {exe} does not match the core: its build-id is {in_file}, the program in the "
                       f"core was built as {in_core}{f' ({mapped.path})' if mapped else ''}; give the executable "
                       "the process ran")
    return cf, exe, notes


def _not_the_mapped_files(cf: CoreFile, sysroot: Path | None) -> str:
    """The note that says a file the core's process mapped is another file here (under SYSROOT when given): its
    build-id in the core and the one of the file this machine has at that path ("" when all agree, or cannot
    be told).  The decoders then read nothing the core lacks from it (glibc's libc, musl's C library)."""
    for path, in_core in cf.mapped_build_ids():
        here = sysroot / path.lstrip("/") if sysroot is not None else Path(path)
        in_file = file_build_id(here)
        if in_file and in_file != in_core:
            where = f"under {sysroot}" if sysroot is not None else "on this machine"
            return (f"{here} {where} is not the file the process mapped at {path}: its build-id is {in_file}, "
                    f"the process's was {in_core} (a core from a container or another machine, or a file upgraded "
                    "since): what the core lacks of it is not read from this one where heapwalk can tell; give the "
                    "root the process saw as --sysroot (a container's: /proc/PID/root while it runs)")
    return ""


def _executable_candidates(recorded: str, sysroot: Path | None) -> list[Path]:
    """The files that may be the program recorded at path RECORDED: its copy under SYSROOT, then itself."""
    paths = [sysroot / recorded.lstrip("/")] if sysroot is not None else []
    paths.append(Path(recorded))
    return [p for p in paths if p.is_file()]


def open_core(args, core: Path, exe: Path | None) -> tuple[Gdb, list[str]]:
    cf, exe, notes = resolve_core(core, exe, args.sysroot)
    gdb_program = _gdb_for(args.gdb, cf)
    truncated = cf.truncation()
    cf.close()
    padded = None
    if truncated is not None:
        notes.append(_truncation_note(core, truncated))
        padded = tempfile.TemporaryDirectory(prefix="heapwalk-")
        core = _padded_copy(core, truncated.expected, Path(padded.name))
    gdb = Gdb(gdb_program, args.sysroot, not args.no_symbols)
    gdb.keep = padded  # the padded copy lives as long as gdb has it open
    try:
        if truncated is not None:
            gdb.run(f"set heapwalk core-missing {format_ranges(truncated.missing)}")
        if getattr(args, "no_memory_check", False):
            gdb.run("set heapwalk memory-check off")
        resident_from = getattr(args, "resident_from", None)
        if resident_from is not None:
            gdb.run(f"set heapwalk resident-from {resident_from}")
        if exe is not None:
            gdb.run(f"file {gdb_argument(str(exe))}")
        _open_core(gdb, core)
    except CliError as exc:
        gdb.close()
        raise CliError(f"heapwalk: gdb cannot open {core}: {exc}") from None
    return gdb, notes


def _gdb_for(asked: str, cf: CoreFile) -> str:
    """The gdb to open CF with: the one asked for, but for the default gdb and a core of another architecture
    than this machine's, gdb-multiarch where it is installed (a distribution's plain gdb reads its own)."""
    if asked != "gdb" or cf.arch is host() or shutil.which("gdb-multiarch") is None:
        return asked
    return "gdb-multiarch"


def _open_core(gdb: Gdb, core: Path) -> None:
    """core-file CORE: gdb 10 to 13 take its argument as the file name, gdb 16 on splits it as 'file' does, and
    says "Junk after filename" for a path with a blank given plainly."""
    try:
        gdb.run(f"core-file {core}")
    except CliError as exc:
        if "Junk after filename" not in str(exc):
            raise
        gdb.run(f"core-file {gdb_argument(str(core))}")


def _truncation_note(core: Path, t) -> str:
    """One paragraph on a truncated core: how much is there and which memory is missing."""
    shown = ", ".join(f"{a:#x}-{b:#x}" for a, b in t.missing[:4]) + (", ..." if len(t.missing) > 4 else "")
    return (f"{core} is truncated: {t.size} of {t.expected} bytes ({100 * t.size // t.expected}%); "
            f"{len(t.missing)} memory region(s), {t.missing_bytes} bytes, are missing ({shown}). The report "
            "covers what the core holds and names what lies in the missing regions as unreadable")


def _padded_copy(core: Path, size: int, directory: Path) -> Path:
    """A sparse copy of CORE padded with a hole to SIZE bytes and without section headers (gdb refuses a
    core whose headers describe more than the file holds, and gcore puts its section headers last; a core
    needs none, as the kernel's have none), which gdb opens."""
    copy = directory / core.name
    result = subprocess.run(["cp", "--sparse=always", str(core), str(copy)], capture_output=True, text=True)
    if result.returncode != 0:
        raise CliError(f"heapwalk: cannot copy {core} to pad it: {result.stderr.strip()}")
    os.truncate(copy, size)
    with open(copy, "r+b") as f:
        f.seek(_E_SHOFF)
        f.write(bytes(8))
        f.seek(_E_SHNUM)
        f.write(bytes(4))  # e_shnum and e_shstrndx
        _restore_lost_notes(f, size)
    return copy


def _restore_lost_notes(f, size: int) -> None:
    """gcore writes a core's notes last, so a truncated gcore core has lost them, and gdb takes a core
    without a thread for no core at all: a PT_NOTE whose bytes are gone is pointed at one NT_PRSTATUS with
    no registers, appended at SIZE (the threads' registers, and so their TLS, are unknown)."""
    f.seek(0)
    head = f.read(64)
    phoff, = struct.unpack_from("<Q", head, 32)
    phentsize, phnum = struct.unpack_from("<HH", head, 54)
    note = struct.pack("<III", 5, _PRSTATUS_SIZE, _NT_PRSTATUS) + b"CORE\0\0\0\0" + bytes(_PRSTATUS_SIZE)
    for i in range(phnum):
        f.seek(phoff + i * phentsize)
        p_type, _, p_offset, _, _, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
        f.seek(p_offset)
        if p_type == _PT_NOTE and (p_offset + p_filesz > size or not any(f.read(min(p_filesz, 64)))):
            f.seek(size)
            f.write(note)
            f.seek(phoff + i * phentsize + 8)
            f.write(struct.pack("<Q", size))
            f.seek(phoff + i * phentsize + 32)
            f.write(struct.pack("<QQ", len(note), 0))
            return


def report_command(json_file: Path | None, xml_file: Path | None, leaks: bool = True,
                   html_file: Path | None = None) -> str:
    """The gdb command of a report (with its leak scan unless LEAKS is false), writing the files given."""
    command = "heapwalk report" + ("" if leaks else " --no-leaks")
    for option, path in (("--json", json_file), ("--xml", xml_file), ("--html", html_file)):
        if path is not None:
            command += f" {option} {gdb_argument(str(path))}"
    return command


def gdb_argument(text: str) -> str:
    """TEXT as one argument of a heapwalk gdb command, which gdb splits as a shell would (gdb.string_to_argv):
    a backslash before each blank, quote and backslash keeps paths with spaces or quotes whole."""
    return re.sub(r"""([\\\s"'])""", r"\\\1", text)
