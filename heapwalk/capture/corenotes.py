"""The notes of an ELF core as the kernel writes them, for the capture's core writer (`corewriter`): each
thread's NT_PRSTATUS, NT_FPREGSET and its architecture's other register sets (`Architecture.thread_notes`; the
thread group leader first, which gdb makes the current thread), NT_PRPSINFO, NT_AUXV and NT_FILE, read from
/proc while the process is stopped."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from heapwalk.capture.ptrace import Stopped
from heapwalk.inferior.pages import PAGE, MapsLine

__all__ = ["note", "file_note", "process_notes"]

_NT_PRSTATUS, _NT_FPREGSET, _NT_PRPSINFO, _NT_AUXV, _NT_FILE = 1, 2, 3, 6, 0x46494C45


def note(kind: int, desc: bytes, name: bytes = b"CORE") -> bytes:
    name0 = name + b"\0"
    pad = lambda b: b + bytes(-len(b) % 4)  # noqa: E731
    return struct.pack("<III", len(name0), len(desc), kind) + pad(name0) + pad(desc)


def _stat(pid: int, tid: int) -> tuple[str, int, int, int]:
    """(state, ppid, pgrp, session) of TID from /proc/PID/task/TID/stat."""
    text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[3])


def _prstatus(pid: int, tid: int, regs: bytes, fpvalid: bool) -> bytes:
    _, ppid, pgrp, sid = _stat(pid, tid)
    head = struct.pack("<3ih2xQQ4i", 0, 0, 0, 0, 0, 0, tid, ppid, pgrp, sid) + bytes(64)  # times left at zero
    return head + regs + struct.pack("<i4x", 1 if fpvalid else 0)


def _prpsinfo(pid: int) -> bytes:
    state, ppid, pgrp, sid = _stat(pid, pid)
    comm = Path(f"/proc/{pid}/comm").read_bytes().rstrip(b"\n")[:15]
    args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").strip()[:79]
    st = os.stat(f"/proc/{pid}")
    code = "RSDTZW".find(state) if state in "RSDTZW" else 0
    return struct.pack("<BcBB4xQII4i16s80s", code, state.encode()[:1] or b"R", 0, 0, 0, st.st_uid, st.st_gid,
                       pid, ppid, pgrp, sid, comm, args)


def file_note(maps: list[MapsLine]) -> bytes:
    files = [m for m in maps if m.file_backed]
    body = struct.pack("<QQ", len(files), PAGE)
    body += b"".join(struct.pack("<QQQ", m.start, m.end, m.offset // PAGE) for m in files)
    return body + b"".join(m.name.encode() + b"\0" for m in files)


def process_notes(stopped: Stopped, maps: list[MapsLine]) -> bytes:
    """The notes of a kernel core for the process STOPPED holds (read while it is stopped)."""
    pid = stopped.pid
    parts = []
    for i, thread in enumerate(stopped.threads):
        parts.append(note(_NT_PRSTATUS, _prstatus(pid, thread.tid, thread.regs, bool(thread.fpregs))))
        if i == 0:
            parts.append(note(_NT_PRPSINFO, _prpsinfo(pid)))
            parts.append(note(_NT_AUXV, Path(f"/proc/{pid}/auxv").read_bytes()))
            parts.append(note(_NT_FILE, file_note(maps)))
        if thread.fpregs:
            parts.append(note(_NT_FPREGSET, thread.fpregs))
        parts += [note(kind, data, b"LINUX") for kind, data in thread.more]    # the kernel's name for these
    return b"".join(parts)
