"""The plan of a capture's core (`heapwalk.capture.corewriter`): which pages of each mapping of a stopped process
it holds, page by page from /proc/PID/pagemap with the rules of `heapwalk.inferior.pages`, as PT_LOAD
segments whose pieces say where their bytes come from (the process's memory, its file, or known zeros).  The
rules are the core writer's module text."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

from heapwalk.inferior.memory import ReadError
from heapwalk.inferior.pages import PAGE, SPECIAL, LivePages, MapsLine, Page, absent_reason
from heapwalk.inferior.residency import runs_of

__all__ = ["Segment", "Piece", "plan_segments", "PAGE", "MAX_SEGMENTS"]

_MERGE_PAGES = 0                         # stored runs this close (across known zeros) are written as one
MAX_SEGMENTS = 60000                     # under ELF's 65535 program headers, with room for the note

#: what the core holds of a page: nothing (not read), a zero-filled segment (zeros, or the file's bytes
#: that gdb reads from the file), or bytes read from the process's memory, from its file, or known zeros
#: inside a stored segment
_NONE, _FILL, _MEM, _FROM_FILE, _ZEROS = 0, 1, 2, 3, 4
_SOURCES = {_MEM: "mem", _FROM_FILE: "file", _ZEROS: "zeros"}

#: a piece of a stored segment: [start, end) and where its bytes come from ("mem", "file" or "zeros")
Piece = Tuple[int, int, str]


@dataclass(frozen=True)
class Segment:
    """A PT_LOAD: [start, end) of MAPPING with FLAGS (ELF's R=4, W=2, X=1), its first FILESZ bytes stored
    (its pages of zeros left holes in the file), read piece by piece (PIECES; none for a zero-filled
    segment)."""

    start: int
    end: int
    flags: int
    filesz: int
    pieces: Tuple[Piece, ...] = ()
    mapping: Optional[MapsLine] = None


def _flags(perms: str) -> int:
    return (4 if perms[0] == "r" else 0) | (2 if perms[1] == "w" else 0) | (1 if perms[2] == "x" else 0)


def _is_elf(pages: LivePages, m: MapsLine, mem: int | None) -> bool:
    """Does the file mapping M begin with an ELF header (read without faulting anything in)?"""
    if not m.file_backed or m.offset != 0 or m.shared:
        return False
    try:
        return pages.read(m.start, 4, lambda at, n: os.pread(mem, n, at) if mem is not None else b"") == b"\x7fELF"
    except (ReadError, OSError):
        return False


def _codes(pages: LivePages, m: MapsLine, kinds: np.ndarray, elf: bool, whole_files: bool = False) -> np.ndarray:
    """What the core holds of each page of mapping M (the `_NONE`... codes) from its `Page` KINDS; WHOLE_FILES
    keeps every page of a private file mapping, as for the writable ones."""
    code = np.full(len(kinds), _NONE, dtype=np.int8)
    from_process = kinds <= int(Page.SWAPPED)
    if m.name == "[vdso]":        # whole: its pages the target has not touched from this process's own vDSO
        code[from_process] = _MEM
        code[kinds == int(Page.FILE)] = _FROM_FILE
    elif m.anonymous:
        code[from_process] = _MEM
        code[(kinds == int(Page.ZEROS)) | (kinds == int(Page.ZERO_PAGE))] = _FILL
    elif m.shared or pages.device(m):
        code[from_process] = _MEM
    else:
        written = (kinds == int(Page.OWN)) | (kinds == int(Page.SWAPPED))
        whole = whole_files or m.perms[1] == "w" or bool(written.any())
        code[written] = _MEM
        unwritten_in_ram, from_file = kinds == int(Page.FILE_PAGE), kinds == int(Page.FILE)
        if whole:
            code[unwritten_in_ram] = _MEM
            code[from_file] = _FROM_FILE
        else:
            code[unwritten_in_ram | from_file] = _FILL
            if elf and len(code):
                code[0] = _MEM if unwritten_in_ram[0] else _FROM_FILE if from_file[0] else code[0]
    return code


def _runs_of_codes(code: np.ndarray) -> list[tuple[int, int, int]]:
    """(first page, end page, code) runs of equal codes."""
    bounds = [0, *(np.flatnonzero(np.diff(code)) + 1).tolist(), len(code)]
    return [(a, b, int(code[a])) for a, b in zip(bounds[:-1], bounds[1:])]


def _mapping_segments(m: MapsLine, code: np.ndarray, kinds: np.ndarray, merge: int,
                      not_resident: list[tuple[int, int]], not_read: list[tuple[int, int, str]]) -> list[Segment]:
    """The segments of mapping M from its pages' CODES; stored runs at most MERGE pages of known zeros apart
    are joined; the stored pages that were not resident go to NOT_RESIDENT, the runs not read to NOT_READ."""
    if merge and m.anonymous and not m.shared:
        runs = _runs_of_codes(code)
        for i in range(1, len(runs) - 1):
            a, b, c = runs[i]
            if c == _FILL and b - a <= merge and runs[i - 1][2] >= _MEM and runs[i + 1][2] >= _MEM:
                code[a:b] = _ZEROS
    flags = _flags(m.perms)
    out: list[Segment] = []
    stored = code >= _MEM
    runs = _runs_of_codes(np.where(stored, _MEM, code).astype(np.int8))
    for a, b, c in runs:
        lo, hi = m.start + a * PAGE, m.start + b * PAGE
        if c == _NONE:
            not_read.append((lo, hi, absent_reason(m)))
        elif c == _FILL:
            out.append(Segment(lo, hi, flags, 0, (), m))
        else:
            pieces = tuple((m.start + pa * PAGE, m.start + pb * PAGE, _SOURCES[pc])
                           for pa, pb, pc in _runs_of_codes(code[a:b]) for pa, pb in [(pa + a, pb + a)])
            part = kinds[a:b]
            out.append(Segment(lo, hi, flags, hi - lo, pieces, m))
            away = (part == int(Page.SWAPPED)) | (part == int(Page.FILE)) | (code[a:b] == _ZEROS)
            not_resident += runs_of(away, lo)
    return out


def plan_segments(pages: LivePages, mem: int | None = None, merge: int = _MERGE_PAGES,
                  not_resident: list[tuple[int, int]] | None = None,
                  not_read: list[tuple[int, int, str]] | None = None, whole_files: bool = False,
                  most: int = MAX_SEGMENTS) -> list[Segment]:
    """The PT_LOAD segments of the core of the process PAGES reads (see the module), MEM an open
    /proc/PID/mem (to tell ELF images from their first bytes; None: from their files only); WHOLE_FILES keeps
    every page of the files it maps privately (code and read-only data too: a core that needs no files).  The pages of
    private mappings the core holds that were not resident go to NOT_RESIDENT, the runs not read, with why,
    to NOT_READ."""
    out: list[Segment] = []
    resident_out: list[tuple[int, int]] = []
    read_out: list[tuple[int, int, str]] = []
    for m in pages.maps:
        if m.perms[0] != "r" or m.name in SPECIAL:
            continue
        kinds = pages.pages(m)
        code = _codes(pages, m, kinds, _is_elf(pages, m, mem), whole_files)
        out += _mapping_segments(m, code, kinds, merge, resident_out, read_out)
    if len(out) > most:
        return plan_segments(pages, mem, max(16, merge * 4), not_resident, not_read, whole_files, most)
    if not_resident is not None:
        not_resident[:] = resident_out
    if not_read is not None:
        not_read[:] = read_out
    return out
