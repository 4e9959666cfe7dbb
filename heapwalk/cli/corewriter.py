"""An ELF core of a stopped process, written from /proc/PID/mem: only the memory that holds anything.

gcore writes every readable mapping whole, so each thread arena's 64 MiB reservation goes into the core even
where it was never touched.  Here, with the process's threads stopped (`ptrace.Stopped`), each private
mapping is written page run by page run, only the pages whose bytes the process made (/proc/PID/pagemap):
- in an anonymous mapping (heaps, arenas, stacks, mmapped chunks), the pages resident or swapped out; the
  rest are zero-filled segments with no bytes in the file, as never-touched memory reads as zeros;
- in a mapping of a file (code, data, RELRO), the pages the process wrote (no longer the file's own), and the
  first page of an ELF image, as the kernel's cores have; gdb reads the rest from the file the NT_FILE note
  names.
Shared mappings and [vdso] are written whole.  PROT_NONE ranges (guard pages, the unused part of a heap's
reservation), [vvar] and [vsyscall] are left out.  While the process is stopped its pages are read into
memory made ready beforehand (`hold_for`), as far as it goes, and written to the file once it runs again:
writing the file while it is stopped would double the pause.

The notes are those of a kernel core: each thread's NT_PRSTATUS and NT_FPREGSET (the thread group leader
first, which gdb makes the current thread), NT_PRPSINFO, NT_AUXV and NT_FILE; and one of heapwalk's own,
"HEAPWALK", with what the capture knew beside the memory (the CPU counts the arena limit depends on, and
which pages were resident: those of private mappings the core holds, less the runs it lists as
"not_resident"), which `target.corefile.CoreFile.capture_facts` and `target.residency.of_core` read back.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heapwalk.cli.ptrace import Stopped
from heapwalk.target.residency import runs_of

__all__ = ["Mapping", "Segment", "CoreSummary", "PendingCore", "read_maps", "plan_segments", "hold_for",
           "write_core"]

PAGE = 4096
_READ = 8 << 20                          # bytes read from /proc/PID/mem at once
_MERGE_PAGES = 0                         # resident runs this close are written as one (fewer segments)
_MAX_SEGMENTS = 60000                    # under ELF's 65535 program headers, with room for the note
_HOLD_MAX = 8 << 30                      # the most memory made ready to read the process into (`hold_for`)
_NT_PRSTATUS, _NT_FPREGSET, _NT_PRPSINFO, _NT_AUXV, _NT_FILE = 1, 2, 3, 6, 0x46494C45
_PT_LOAD, _PT_NOTE = 1, 4
#: the note of what the capture knew of the process beside its memory (JSON; gdb skips notes it does not know)
HEAPWALK_NOTE, NT_HEAPWALK = b"HEAPWALK", 1
_SKIPPED = ("[vvar]", "[vvar_vclock]", "[vsyscall]")


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/PID/maps."""

    start: int
    end: int
    perms: str
    offset: int
    inode: int
    name: str

    @property
    def file_backed(self) -> bool:
        return self.inode != 0 and self.name.startswith("/")



@dataclass(frozen=True)
class Segment:
    """A PT_LOAD: [start, end) of memory with FLAGS (ELF's R=4, W=2, X=1), its first FILESZ bytes stored;
    MAYBE_ZEROS when some of its pages are not the process's alone (they may be the kernel's zero page)."""

    start: int
    end: int
    flags: int
    filesz: int
    maybe_zeros: bool


@dataclass(frozen=True)
class CoreSummary:
    """What was written: the core's size, the bytes of memory in it that are not zeros (what it takes on disk,
    besides its headers), and the segments."""

    size: int
    written: int
    segments: int


def read_maps(pid: int) -> list[Mapping]:
    """PID's mappings (/proc/PID/maps)."""
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text(errors="replace").splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5:
            continue
        start, _, end = fields[0].partition("-")
        out.append(Mapping(int(start, 16), int(end, 16), fields[1], int(fields[2], 16), int(fields[4]),
                           fields[5].strip() if len(fields) > 5 else ""))
    return out


def _flags(perms: str) -> int:
    return (4 if perms[0] == "r" else 0) | (2 if perms[1] == "w" else 0) | (1 if perms[2] == "x" else 0)


def _runs(pagemap: int, start: int, end: int, merge: int, private_file: bool,
          not_resident: list[tuple[int, int]] | None = None) -> list[tuple[int, int, bool]]:
    """(start, end, shared) runs of the pages of [START, END) whose bytes the core must hold, runs at most
    MERGE pages apart joined: pages resident or swapped out, or, in a private mapping of a file
    (PRIVATE_FILE), only those the process has written (resident but no longer the file's page, or swapped
    out).  SHARED says a page of the run is swapped out or not this process's alone (the kernel's zero page,
    mapped where untouched memory was only read, or a page shared with a parent since fork): it may be
    zeros.  The runs' pages that are not resident (swapped out, or joined across) go to NOT_RESIDENT."""
    runs: list[tuple[int, int, bool]] = []
    for lo in range(start, end, 1 << 30):
        hi = min(end, lo + (1 << 30))
        try:
            entries = np.frombuffer(os.pread(pagemap, (hi - lo) // PAGE * 8, lo // PAGE * 8), dtype=np.uint64)
        except OSError:
            return [(start, end, True)]  # cannot tell: keep it all
        if len(entries) * PAGE != hi - lo:
            return [(start, end, True)]
        bit = lambda n: ((entries >> np.uint64(n)) & np.uint64(1)).astype(bool)  # noqa: E731
        present = bit(63) & ~bit(61) if private_file else bit(63)
        keep = bit(62) | present
        edges = np.flatnonzero(np.diff(np.concatenate(([False], keep, [False])).view(np.int8)))
        firsts, lasts = edges[::2], edges[1::2]
        if not len(firsts):
            continue
        joined = np.concatenate(([True], firsts[1:] - lasts[:-1] > merge))
        starts, ends = firsts[joined], np.concatenate((lasts[:-1][joined[1:]], lasts[-1:]))
        alone = np.concatenate(([0], np.cumsum(keep & ~bit(56))))
        shared = alone[ends] > alone[starts]
        if not_resident is not None:
            not_resident += runs_of(_inside(starts, ends, len(keep)) & ~bit(63), lo)
        runs += [(lo + a * PAGE, lo + b * PAGE, bool(c)) for a, b, c in zip(starts.tolist(), ends.tolist(),
                                                                           shared.tolist())]
    return runs


def _inside(starts: np.ndarray, ends: np.ndarray, n: int) -> np.ndarray:
    """A mask of N pages, true inside the runs [STARTS[i], ENDS[i])."""
    steps = np.zeros(n + 1, dtype=np.int64)
    np.add.at(steps, starts, 1)
    np.add.at(steps, ends, -1)
    return np.cumsum(steps[:-1]) > 0


def plan_segments(pid: int, maps: list[Mapping], elf_start: dict[int, bool], merge: int = _MERGE_PAGES,
                  not_resident: list[tuple[int, int]] | None = None) -> list[Segment]:
    """The PT_LOAD segments of PID's core (see the module); ELF_START says which file mappings begin with an
    ELF header (by start address): their first page is kept whole.  The pages of private mappings the core
    holds that were not resident (swapped out, or joined across) go to NOT_RESIDENT."""
    out: list[Segment] = []
    if not_resident is not None:
        not_resident.clear()
    with open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap:
        for m in maps:
            if m.perms[0] != "r" or m.name in _SKIPPED:
                continue
            flags = _flags(m.perms)
            if m.perms[3] != "p" or m.name == "[vdso]":
                out.append(Segment(m.start, m.end, flags, m.end - m.start, True))
                continue
            runs = _runs(pagemap.fileno(), m.start, m.end, merge, m.file_backed, not_resident)
            if elf_start.get(m.start):
                runs = _joined([(m.start, m.start + PAGE, True)] + runs, merge)
            at = m.start
            for lo, hi, shared in runs:
                if lo > at:
                    out.append(Segment(at, lo, flags, 0, False))
                out.append(Segment(lo, hi, flags, hi - lo, shared))
                at = hi
            if at < m.end:
                out.append(Segment(at, m.end, flags, 0, False))
    if len(out) > _MAX_SEGMENTS:
        return plan_segments(pid, maps, elf_start, max(16, merge * 4), not_resident)
    return out


def _joined(runs: list[tuple[int, int, bool]], merge: int) -> list[tuple[int, int, bool]]:
    """Sorted RUNS with overlapping or close ones (fewer than MERGE pages apart) joined."""
    out: list[tuple[int, int, bool]] = []
    for lo, hi, shared in sorted(runs):
        if out and lo - out[-1][1] <= merge * PAGE:
            out[-1] = (out[-1][0], max(out[-1][1], hi), out[-1][2] or shared)
        else:
            out.append((lo, hi, shared))
    return out


def _note(kind: int, desc: bytes, name: bytes = b"CORE") -> bytes:
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


def _file_note(maps: list[Mapping]) -> bytes:
    files = [m for m in maps if m.file_backed]
    body = struct.pack("<QQ", len(files), PAGE)
    body += b"".join(struct.pack("<QQQ", m.start, m.end, m.offset // PAGE) for m in files)
    return body + b"".join(m.name.encode() + b"\0" for m in files)


def _notes(stopped: Stopped, maps: list[Mapping], facts: dict | None) -> bytes:
    pid = stopped.pid
    parts = [_note(NT_HEAPWALK, json.dumps(facts).encode(), HEAPWALK_NOTE)] if facts else []
    for i, thread in enumerate(stopped.threads):
        parts.append(_note(_NT_PRSTATUS, _prstatus(pid, thread.tid, thread.regs, bool(thread.fpregs))))
        if i == 0:
            parts.append(_note(_NT_PRPSINFO, _prpsinfo(pid)))
            parts.append(_note(_NT_AUXV, Path(f"/proc/{pid}/auxv").read_bytes()))
            parts.append(_note(_NT_FILE, _file_note(maps)))
        if thread.fpregs:
            parts.append(_note(_NT_FPREGSET, thread.fpregs))
    return b"".join(parts)


def _elf_starts(mem: int, maps: list[Mapping]) -> dict[int, bool]:
    """Which file mappings at offset 0 begin with an ELF header."""
    out = {}
    for m in maps:
        if m.file_backed and m.offset == 0 and m.perms[0] == "r":
            try:
                out[m.start] = os.pread(mem, 4, m.start) == b"\x7fELF"
            except OSError:
                out[m.start] = False
    return out


def hold_for(pid: int) -> mmap.mmap | None:
    """Memory made resident before PID is stopped, to read its pages into while it is stopped: reading into
    pages already there is as fast as reading can be, where writing the file meanwhile would double the
    pause.  Sized from the pages PID would have written now, and at most a quarter of the memory available
    (the rest is then written to the file while the process is stopped); None when that is too little."""
    try:
        planned = sum(s.filesz for s in plan_segments(pid, read_maps(pid), {}))
        available = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    size = min(planned + planned // 8 + (8 << 20), available // 4, _HOLD_MAX) // PAGE * PAGE
    if size < _READ:
        return None
    try:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))
    except OSError:
        return None


class PendingCore:
    """A core whose memory has been read (the process may go on) and whose file is not yet complete: what
    was read into the memory held for it is written by `finish`."""

    def __init__(self, out: int, hold: mmap.mmap | None, size: int, segments: int):
        self.out, self.hold, self.size, self.segments = out, hold, size, segments
        self.written = 0
        self.held: list[tuple[Segment, int, memoryview]] = []      # segment, file offset, its bytes

    def finish(self) -> CoreSummary:
        """Writes what was held into the file, closes it, and says what was written."""
        try:
            for segment, at, data in self.held:
                for done in range(0, len(data), _READ):
                    with data[done:done + _READ] as piece:
                        self.written += _write_nonzero(self.out, piece, at + done) if segment.maybe_zeros else \
                            os.pwrite(self.out, piece, at + done)
                data.release()
        finally:
            os.close(self.out)
            if self.hold is not None:
                self.hold.close()
        return CoreSummary(self.size, self.written, self.segments)


def write_core(stopped: Stopped, path: Path, facts: dict | None = None, hold: mmap.mmap | None = None
               ) -> PendingCore:
    """Reads the memory of the process STOPPED holds for its core at PATH (see the module), with FACTS (what
    the capture knows of the process that a core does not hold: its CPU counts) as a HEAPWALK note: into HOLD
    (`hold_for`) as far as it goes, the rest into the file.  `PendingCore.finish`, once the process goes on,
    completes the file."""
    pid = stopped.pid
    maps = read_maps(pid)
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        not_resident: list[tuple[int, int]] = []
        segments = plan_segments(pid, maps, _elf_starts(mem, maps), not_resident=not_resident)
        notes = _notes(stopped, maps, dict(facts or {}, residency="segments", not_resident=not_resident))
        phnum = len(segments) + 1
        notes_at = 64 + 56 * phnum
        data_at = -(-(notes_at + len(notes)) // PAGE) * PAGE
        header = struct.pack("<4sBBBB8xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 4, 62, 1, 0, 64, 0, 0, 64, 56,
                             phnum, 0, 0, 0)
        table = [struct.pack("<IIQQQQQQ", _PT_NOTE, 0, notes_at, 0, 0, len(notes), 0, 4)]
        offset = data_at
        for s in segments:
            table.append(struct.pack("<IIQQQQQQ", _PT_LOAD, s.flags, offset if s.filesz else 0, s.start, 0,
                                     s.filesz, s.end - s.start, PAGE))
            offset += s.filesz
        path.unlink(missing_ok=True)     # a new file: rewriting an old one makes some file systems flush it
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        pending = PendingCore(out, hold, offset, len(segments))
        try:
            os.pwrite(out, header + b"".join(table) + notes, 0)
            os.ftruncate(out, offset)
            _read_segments(mem, pending, segments, data_at)
        except BaseException:
            os.close(out)
            raise
    finally:
        os.close(mem)
    return pending


def _read_segments(mem: int, pending: PendingCore, segments: list[Segment], data_at: int) -> None:
    """Each segment's bytes from memory: into the memory PENDING holds while it has room, else into its file
    (from offset DATA_AT on)."""
    view = memoryview(pending.hold) if pending.hold is not None else None
    used, at, buffer = 0, data_at, None
    for s in segments:
        if view is not None and s.filesz and used + s.filesz <= len(view):
            data = view[used:used + s.filesz]
            for done in range(0, s.filesz, _READ):
                try:
                    os.preadv(mem, [data[done:done + min(_READ, s.filesz - done)]], s.start + done)
                except OSError:
                    pass            # unmapped meanwhile: zeros, as a hole would read
            pending.held.append((s, at, data))
            used += s.filesz
        elif s.filesz:
            buffer = buffer or memoryview(bytearray(_READ))
            pending.written += _copy(mem, pending.out, s, at, buffer)
        at += s.filesz
    if view is not None:
        view.release()


def _copy(mem: int, out: int, segment: Segment, at: int, buffer: memoryview) -> int:
    """SEGMENT's bytes from memory into file OUT at offset AT, read through BUFFER; what cannot be read (a
    page unmapped meanwhile) and, where the segment may hold the zero page, pages of zeros are left holes,
    which read as zeros and take no disk.  The bytes written."""
    written = 0
    for done in range(0, segment.filesz, len(buffer)):
        n = min(len(buffer), segment.filesz - done)
        try:
            got = os.preadv(mem, [buffer[:n]], segment.start + done)
        except OSError:
            got = 0
        if segment.maybe_zeros:
            written += _write_nonzero(out, buffer[:got], at + done)
        elif got:
            written += os.pwrite(out, buffer[:got], at + done)
    return written


def _write_nonzero(fd: int, data: memoryview, at: int) -> int:
    """Writes DATA at file offset AT but for its pages of zeros, which stay holes; the bytes written."""
    pages = len(data) // PAGE
    if not pages:
        return 0
    nonzero = np.frombuffer(data, dtype=np.uint64, count=pages * PAGE // 8).reshape(pages, -1).any(axis=1)
    written = 0
    for lo, hi in runs_of(nonzero, 0):
        written += os.pwrite(fd, data[lo:hi], at + lo)
    return written
