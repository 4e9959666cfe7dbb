"""A core of a program run under qemu-user, completed into what the target's kernel would have written.

qemu-user writes a core of the program it runs (when the program aborts) with each thread's NT_PRSTATUS,
NT_PRPSINFO and NT_AUXV and every mapping's bytes, but not what a kernel core also holds: each thread's
thread pointer (arm64's NT_ARM_TLS), the files mapped (NT_FILE), and the first page of each ELF file mapped
(the kernel dumps it so that a debugger finds the program headers and build ids; qemu leaves every
mapping of an ELF file out).  The reproducer writes what is missing at its snapshot (`process.txt`, from
hw.c: a line `thread TID POINTER` for each thread, then /proc/self/maps as qemu shows it to the program);
`complete` adds it, in the order the kernel writes its notes: the first thread's NT_PRSTATUS, NT_PRPSINFO,
NT_AUXV, NT_FILE, that thread's register sets, then each other thread's NT_PRSTATUS and register sets.  The
files are named as the program saw them: qemu's -L folder (SYSROOT) is taken off their paths, as gdb's
sysroot puts it back.

    python3 cores/scripts/qemucore.py QEMU_CORE PROCESS_TXT OUT [SYSROOT]
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import dataclasses  # noqa: E402

from heapwalk.capture.corenotes import file_note, note  # noqa: E402
from heapwalk.inferior.pages import parse_maps  # noqa: E402

__all__ = ["complete"]

NT_PRSTATUS, NT_PRPSINFO, NT_AUXV, NT_FILE, NT_ARM_TLS = 1, 3, 6, 0x46494C45, 0x401
PT_LOAD, PT_NOTE = 1, 4
PF_W, PF_R = 2, 4
#: offset of pr_pid in arm64's and x86-64's prstatus (after siginfo, cursig, sigpend, sighold)
PR_PID = 32
ELF_HEADER, PHDR = struct.Struct("<16sHHIQQQIHHHHHH"), struct.Struct("<IIQQQQQQ")


class CoreError(Exception):
    """The qemu core or the reproducer's process.txt is not what `complete` expects."""


def _notes(data: bytes) -> list[tuple[int, bytes, bytes]]:
    """(type, name, descriptor) of each note in DATA."""
    out, at = [], 0
    while at + 12 <= len(data):
        namesz, descsz, kind = struct.unpack_from("<III", data, at)
        at += 12
        name = data[at:at + namesz].rstrip(b"\0")
        at += (namesz + 3) & ~3
        out.append((kind, name, data[at:at + descsz]))
        at += (descsz + 3) & ~3
    return out


def _process(text: str) -> tuple[dict[int, int], list[tuple[int, int]], str]:
    """The thread pointers by thread id, the (start, length) of each page memory.bin holds in order, and the
    maps text, of a process.txt."""
    pointers, pages, maps = {}, [], []
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["thread"] and len(words) == 3:
            pointers[int(words[1])] = int(words[2], 16)
        elif words[:1] == ["memory"] and len(words) == 3:
            pages.append((int(words[1], 16), int(words[2], 16)))
        else:
            maps.append(line)
    return pointers, pages, "\n".join(maps) + "\n"


def _missing(pages: list[tuple[int, int]], memory: bytes, segments) -> list[tuple[int, int, bytes]]:
    """(flags, start, bytes) of the parts of PAGES (their bytes one after the other in MEMORY) that no segment
    of the core holds, each once: readable and writable, as the data they are."""
    held = sorted((vaddr, vaddr + len(body)) for _, vaddr, _, body in segments if body)
    out, done, offset = [], set(), 0
    for start, length in pages:
        body = memory[offset:offset + length]
        offset += length
        if start in done or len(body) < length:
            continue
        done.add(start)
        at, end = start, start + length
        for lo, hi in held:
            if hi <= at:
                continue
            if lo >= end:
                break
            if lo > at:
                out.append((PF_R | PF_W, at, body[at - start:lo - start]))
            at = max(at, hi)
        if at < end:
            out.append((PF_R | PF_W, at, body[at - start:]))
    return out


def _new_notes(old: list[tuple[int, bytes, bytes]], pointers: dict[int, int], maps) -> bytes:
    """The notes of the completed core: the kernel's order, each thread's NT_ARM_TLS after its registers."""
    statuses = [desc for kind, _, desc in old if kind == NT_PRSTATUS]
    process = [note(kind, desc, name) for kind, name, desc in old if kind in (NT_PRPSINFO, NT_AUXV)]
    if not statuses:
        raise CoreError("the core has no NT_PRSTATUS")
    parts = []
    for i, status in enumerate(statuses):
        tid = struct.unpack_from("<i", status, PR_PID)[0]
        if tid not in pointers:
            raise CoreError(f"process.txt has no thread pointer for thread {tid}")
        parts.append(note(NT_PRSTATUS, status))
        if i == 0:
            parts += [*process, note(NT_FILE, file_note(maps))]
        parts.append(note(NT_ARM_TLS, struct.pack("<Q", pointers[tid]), b"LINUX"))
    return b"".join(parts)


def _elf_header_page(start: int, maps, page: int) -> bytes | None:
    """The first page of the ELF file mapped from its start at START, as the kernel dumps it, or None."""
    for m in maps:
        if m.start == start and m.file_backed and m.offset == 0:
            try:
                with open(m.name, "rb") as f:
                    head = f.read(page)
            except OSError:
                return None
            return head.ljust(page, b"\0") if head[:4] == b"\x7fELF" else None
    return None


def _as_seen(maps, sysroot: str):
    """MAPS with SYSROOT taken off the paths of the files under it (as named, or with its links resolved, as
    qemu names the files it opens)."""
    roots = {r.rstrip("/") for r in (sysroot, str(Path(sysroot).resolve()) if sysroot else "") if r.rstrip("/")}
    out = []
    for m in maps:
        root = next((r for r in roots if m.name.startswith(r + "/")), None)
        out.append(dataclasses.replace(m, name=m.name[len(root):]) if root else m)
    return out


def complete(qemu_core: Path, process_txt: Path, out: Path, sysroot: str = "") -> None:
    """Writes OUT: QEMU_CORE with the notes and pages PROCESS_TXT supplies, the files named without SYSROOT
    (see the module's docstring)."""
    data = qemu_core.read_bytes()
    header = list(ELF_HEADER.unpack_from(data, 0))
    phoff, phentsize, phnum = header[5], header[9], header[10]
    if data[:4] != b"\x7fELF" or header[1] != 4:
        raise CoreError(f"{qemu_core} is not an ELF core")
    pointers, pages, maps_text = _process(process_txt.read_text())
    memory_bin = process_txt.with_name("memory.bin")
    memory = memory_bin.read_bytes() if memory_bin.exists() else b""
    maps = parse_maps(maps_text)
    page = 4096
    segments, notes = [], b""
    for i in range(phnum):
        kind, flags, offset, vaddr, paddr, filesz, memsz, align = PHDR.unpack_from(data, phoff + i * phentsize)
        if kind == PT_NOTE:
            notes = _new_notes(_notes(data[offset:offset + filesz]), pointers, _as_seen(maps, sysroot))
        elif kind == PT_LOAD:
            body = data[offset:offset + filesz]
            if not filesz:
                body = _elf_header_page(vaddr, maps, page) or b""
            segments.append((flags, vaddr, memsz, body))
    segments += [(flags, start, len(body), body) for flags, start, body in _missing(pages, memory, segments)]
    segments.sort(key=lambda s: s[1])
    count = 1 + len(segments)
    at = ELF_HEADER.size + count * PHDR.size
    notes_at = at
    at = (at + len(notes) + page - 1) & ~(page - 1)
    table, bodies = [PHDR.pack(PT_NOTE, 0, notes_at, 0, 0, len(notes), 0, 0)], []
    for flags, vaddr, memsz, body in segments:
        table.append(PHDR.pack(PT_LOAD, flags, at, vaddr, 0, len(body), memsz, page))
        bodies.append((at, body))
        at += (len(body) + page - 1) & ~(page - 1)
    header[5], header[10] = ELF_HEADER.size, count
    with open(out, "wb") as f:
        f.write(ELF_HEADER.pack(*header) + b"".join(table))
        f.seek(notes_at)
        f.write(notes)
        for where, body in bodies:
            f.seek(where)
            f.write(body)
        f.truncate(at)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__.rsplit("\n\n", 1)[1])
    complete(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), *sys.argv[4:])
