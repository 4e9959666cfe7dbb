"""An ELF core of a stopped process, written from /proc/PID/mem: only the memory that holds anything, and
nothing read that would make the kernel allocate or map a page in the process.

gcore writes every readable mapping whole, so each thread arena's 64 MiB reservation goes into the core even
where it was never touched, and its reads fault in every page they touch: untouched shared memory gets RAM
allocated, untouched private memory the zero page.  Here, with the process's threads stopped
(`ptrace.Stopped`), each mapping is planned page by page from /proc/PID/pagemap with the rules of
`heapwalk.inferior.pages` (a page is read from the process only when present or swapped out; the plan:
`heapwalk.capture.coreplan`):
- anonymous memory (heaps, arenas, stacks, mmapped chunks): its present and swapped-out pages are written;
  the untouched ones are zero-filled segments with no bytes in the file, as they read as zeros;
- a private mapping of a file: the pages the process wrote; and where the mapping is writable or was
  written at all (a library's .data, .bss and relocated GOT: what decoders read), every page, those it did not
  write taken from the file itself; elsewhere (code, read-only data) zero-filled segments with no bytes, which
  gdb fills from the file the NT_FILE note names, as for the kernel's cores; the first page of an ELF image
  is kept whole, as the kernel's cores have it;
- shared memory (anonymous, memfd, tmpfs, System V): the pages the process has in its page tables;
- what no rule may read (shared memory the process never touched, devices, pages past a file's end, a file
  that cannot be opened): no segment at all, so that a reader of the core finds no bytes there rather than
  zeros, and the HEAPWALK note lists each such run with its reason ("not_read").
[vdso] is written whole (the pages the process has not touched read from heapwalk's own vDSO: the same
image); [vvar] and [vsyscall] and PROT_NONE ranges (guard pages, the unused part of a heap's
reservation) are left out.  While the process is stopped its pages are read into memory made ready
beforehand (`hold_for`), as far as it goes, and written to the file once it runs again: writing the file
while it is stopped would double the pause.  After a pre-copy (`heapwalk.capture.precopy`), the stop reads only the
pages the copies cannot give, and the rest is copied from them into the file once the process runs again.

The notes are those of a kernel core: each thread's NT_PRSTATUS and NT_FPREGSET (the thread group leader
first, which gdb makes the current thread), NT_PRPSINFO, NT_AUXV and NT_FILE; and one of heapwalk's own,
"HEAPWALK", with what the capture knew beside the memory (the CPU counts the arena limit depends on, which
pages were resident: those of private mappings the core holds, less the runs it lists as "not_resident", and
the runs it did not read, "not_read"), which `target.corefile.CoreFile.capture_facts` and
`target.residency.of_core` read back.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Tuple

import numpy as np

from heapwalk.capture.corenotes import note, process_notes
from heapwalk.capture.coreplan import MAX_SEGMENTS, PAGE, Piece, Segment, plan_segments
from heapwalk.capture.precopy import Precopy, copied_kinds
from heapwalk.capture.ptrace import Stopped
from heapwalk.inferior.memory import ReadError
from heapwalk.inferior.pages import LivePages, PagesUnknown
from heapwalk.inferior.residency import runs_of

__all__ = ["Segment", "CoreSummary", "PendingCore", "plan_segments", "hold_for", "write_core", "Piece"]

_READ = 8 << 20                          # bytes read from /proc/PID/mem at once
_COPY = 64 << 20                         # bytes copied from a pre-copy's scratch file at once, then let go
#: the most segments for a process whose program is the dynamic linker itself (ld.so PROGRAM): gdb 13's memory
#: grows with the square of the segments then (measured: 4,027 segments 0.55 GB, 10,027 3.2 GB, 36,803 over
#: 24 GB), where a program's own core of 36,028 takes 88 MB
_MAX_SEGMENTS_LD_SO = 2000
_LD_SO = re.compile(r"(?:^|/)ld(?:-linux[^/]*|-[\d.]+\.so|\.so[\d.]*)$")
_HOLD_MAX = 8 << 30                      # the most memory made ready to read the process into (`hold_for`)
_PT_LOAD, _PT_NOTE = 1, 4
#: the note of what the capture knew of the process beside its memory (JSON; gdb skips notes it does not know)
HEAPWALK_NOTE, NT_HEAPWALK = b"HEAPWALK", 1



@dataclass(frozen=True)
class CoreSummary:
    """What was written: the core's size, the bytes of memory in it that are not zeros (what it takes on disk,
    besides its headers), the segments, and the runs of the process's mappings it did not read, with why."""

    size: int
    written: int
    segments: int
    not_read: Tuple[Tuple[int, int, str], ...] = ()

    @property
    def not_read_bytes(self) -> int:
        return sum(hi - lo for lo, hi, _ in self.not_read)


def hold_for(pid: int, whole_files: bool = False, most: int | None = None) -> mmap.mmap | None:
    """Memory made resident before PID is stopped, to read its pages into while it is stopped: reading into
    pages already there is as fast as reading can be, where writing the file meanwhile would double the
    pause.  Sized from the pages PID would have written now, and at most a quarter of the memory available
    (the rest is then written to the file while the process is stopped) and MOST bytes (after a pre-copy: what
    the stop should read again); None when that is too little."""
    try:
        with LivePages(pid) as pages:
            planned = sum(s.filesz for s in plan_segments(pages, whole_files=whole_files))
        available = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, PagesUnknown):
        return None
    size = min(planned + planned // 8 + (8 << 20), available // 4, _HOLD_MAX, most or _HOLD_MAX) // PAGE * PAGE
    if size < _READ:
        return None
    try:
        return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))
    except OSError:
        return None


class PendingCore:
    """A core whose memory has been read (the process may go on) and whose file is not yet complete: what
    was read into the memory held for it, and the notes (which end the file), are written by `finish`."""

    def __init__(self, out: int, hold: mmap.mmap | None, size: int, segments: int, notes, not_read, copies=None):
        self.out, self.hold, self.size, self.segments = out, hold, size, segments
        self.written = 0
        self.held: list[tuple[Segment, int, memoryview]] = []      # segment, file offset, its bytes
        self.copies = copies           # the scratch file of a pre-copy (`heapwalk.capture.precopy`), or None
        self.deferred: list[tuple[int, int, int]] = []              # file offset, scratch offset, bytes
        self._notes = notes            # not_read -> the notes' bytes
        self.not_read: list[tuple[int, int, str]] = not_read

    def defer(self, at: int, source: int, size: int) -> None:
        """SIZE bytes at file offset AT are the pre-copy's at SOURCE in its scratch file: copied by `finish`."""
        if self.deferred and self.deferred[-1][0] + self.deferred[-1][2] == at and \
                self.deferred[-1][1] + self.deferred[-1][2] == source:
            self.deferred[-1] = (self.deferred[-1][0], self.deferred[-1][1], self.deferred[-1][2] + size)
        else:
            self.deferred.append((at, source, size))

    def unread(self, lo: int, hi: int, why: str) -> None:
        """[LO, HI) of a stored segment could not be read after all: the note says so (it stays zeros)."""
        self.not_read.append((lo, hi, why))

    def finish(self) -> CoreSummary:
        """Writes what was held and the notes into the file, closes it, and says what was written."""
        try:
            for segment, at, data in self.held:
                for done in range(0, len(data), _READ):
                    with data[done:done + _READ] as piece:
                        self.written += _write_nonzero(self.out, piece, at + done)
                data.release()
            for at, source, size in self.deferred:
                for done in range(0, size, _COPY):
                    n = min(_COPY, size - done)
                    self.written += _copy_range(self.copies.fd, self.out, source + done, at + done, n)
                    self.copies.release(source + done, n)
            notes = self._notes(self.not_read)
            os.pwrite(self.out, notes, self.size)
            os.pwrite(self.out, struct.pack("<IIQQQQQQ", _PT_NOTE, 0, self.size, 0, 0, len(notes), 0, 4), 64)
            self.size += len(notes)
        finally:
            os.close(self.out)
            if self.hold is not None:
                self.hold.close()
        return CoreSummary(self.size, self.written, self.segments, tuple(self.not_read))


def _copy_range(src: int, dst: int, at: int, to: int, size: int) -> int:
    """SIZE bytes of file SRC at AT into file DST at TO (in the kernel where it can); the bytes copied."""
    done = 0
    while done < size:
        try:
            n = os.copy_file_range(src, dst, size - done, at + done, to + done)
        except OSError:
            n = os.pwrite(dst, os.pread(src, min(size - done, _READ), at + done), to + done)
        if n <= 0:
            raise OSError(0, f"the pre-copy's scratch file ends before {at + done}")
        done += n
    return done


def _most_segments(pid: int) -> int:
    """The most segments the core of process PID may have for gdb to read it (fewer when its program is the
    dynamic linker, run as a command)."""
    try:
        program = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return MAX_SEGMENTS
    return _MAX_SEGMENTS_LD_SO if _LD_SO.search(program) else MAX_SEGMENTS


def write_core(stopped: Stopped, path: Path, facts: dict | None = None, hold: mmap.mmap | None = None,
               whole_files: bool = False, precopy: Precopy | None = None) -> PendingCore:
    """Reads the memory of the process STOPPED holds for its core at PATH (see the module), with FACTS (what
    the capture knows of the process that a core does not hold: its CPU counts) as a HEAPWALK note: into HOLD
    (`hold_for`) as far as it goes, the rest into the file.  `PendingCore.finish`, once the process goes on,
    completes the file; WHOLE_FILES stores the pages of its files too (see `plan_segments`).  With PRECOPY
    (`heapwalk.capture.precopy.run`), the pages it copied that were not written since are taken from its copies
    (by `finish`), the rest read now.  PagesUnknown when the process's page map cannot be read."""
    pid = stopped.pid
    mem = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        with LivePages(pid) as pages:
            if precopy is not None:
                precopy.at_stop(pages)
            not_resident: list[tuple[int, int]] = []
            not_read: list[tuple[int, int, str]] = []
            segments = plan_segments(pages, mem, not_resident=not_resident, not_read=not_read,
                                     whole_files=whole_files, most=_most_segments(pid))
            maps = pages.maps

            notes_of_process = process_notes(stopped, maps)

            def notes(unread: list[tuple[int, int, str]]) -> bytes:
                known = dict(facts or {}, residency="segments", not_resident=not_resident,
                             not_read=[list(r) for r in unread], mappings=[[m.start, m.end] for m in maps])
                return note(NT_HEAPWALK, json.dumps(known).encode(), HEAPWALK_NOTE) + notes_of_process

            phnum = len(segments) + 1
            data_at = -(-(64 + 56 * phnum) // PAGE) * PAGE
            header = struct.pack("<4sBBBB8xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 4, stopped.arch.elf_machine, 1,
                                 0, 64, 0, 0, 64, 56, phnum, 0, 0, 0)
            table = [struct.pack("<IIQQQQQQ", _PT_NOTE, 0, 0, 0, 0, 0, 0, 4)]     # written by `finish`
            offset = data_at
            for s in segments:
                table.append(struct.pack("<IIQQQQQQ", _PT_LOAD, s.flags, offset if s.filesz else 0, s.start, 0,
                                         s.filesz, s.end - s.start, PAGE))
                offset += s.filesz
            path.unlink(missing_ok=True)     # a new file: rewriting an old one makes some file systems flush it
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            pending = PendingCore(out, hold, offset, len(segments), notes, not_read,
                                  precopy.copies if precopy is not None else None)
            try:
                os.pwrite(out, header + b"".join(table), 0)
                os.ftruncate(out, offset)
                _read_segments(mem, pages, pending, segments, data_at, precopy)
            except BaseException:
                os.close(out)
                raise
    finally:
        os.close(mem)
    return pending


def _read_piece(mem: int, pages: LivePages, pending: PendingCore, segment: Segment, piece: Piece,
                into: memoryview) -> int:
    """PIECE of SEGMENT into INTO (its bytes from the piece's start on): from the process's memory, from the
    mapping's file, or nothing for known zeros; a read that fails is noted as not read.  The bytes got."""
    lo, hi, source = piece
    if source == "zeros":
        return 0
    try:
        if source == "file" and segment.mapping is not None:
            data = pages.read_file(segment.mapping, lo, hi - lo)
            into[:len(data)] = data
            return len(data)
        got = os.preadv(mem, [into[:hi - lo]], lo)
    except (OSError, ReadError) as exc:
        pending.unread(lo, hi, f"a read failed: {getattr(exc, 'strerror', None) or exc}")
        return 0
    if got < hi - lo:
        pending.unread(lo + got, hi, "a read came back short")
    return got


def _read_segments(mem: int, pages: LivePages, pending: PendingCore, segments: list[Segment],
                   data_at: int, precopy: Precopy | None = None) -> None:
    """Each stored segment's bytes, piece by piece: into the memory PENDING holds while it has room, else into
    its file (from offset DATA_AT on); the pages PRECOPY holds good copies of are left to `PendingCore.finish`."""
    view = memoryview(pending.hold) if pending.hold is not None else None
    used, at, buffer = 0, data_at, None
    for s in segments:
        if not s.filesz:
            continue
        for piece in _split(_without_copies(s, precopy, pending, at)):
            lo, hi, source = piece
            if source == "zeros":
                continue                 # a hole in the file
            if view is not None and used + hi - lo <= len(view):
                data = view[used:used + hi - lo]
                _read_piece(mem, pages, pending, s, piece, data)
                pending.held.append((s, at + lo - s.start, data))
                used += hi - lo
            else:
                buffer = buffer or memoryview(bytearray(_READ))
                got = _read_piece(mem, pages, pending, s, piece, buffer)
                pending.written += _write_nonzero(pending.out, buffer[:got], at + lo - s.start)
        at += s.filesz
    if view is not None:
        view.release()


def _without_copies(segment: Segment, precopy: Precopy | None, pending: PendingCore, at: int) -> Tuple[Piece, ...]:
    """The pieces of SEGMENT (at file offset AT) to read now: where PRECOPY holds good copies of its pages
    they are left to PENDING to copy (zeros need nothing), and only the rest is read from the process."""
    if precopy is None or segment.mapping is None or not copied_kinds(segment.mapping):
        return segment.pieces
    out: list[Piece] = []
    for lo, hi, source in segment.pieces:
        if source != "mem":
            out.append((lo, hi, source))
            continue
        for a, b, where in precopy.pieces(lo, hi):
            if where is None:
                out.append((a, b, "mem"))
            elif where >= 0:
                pending.defer(at + a - segment.start, where, b - a)
    return tuple(out)


def _split(pieces: Tuple[Piece, ...]):
    """PIECES cut to at most `_READ` bytes each."""
    for lo, hi, source in pieces:
        for at in range(lo, hi, _READ):
            yield at, min(hi, at + _READ), source


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
