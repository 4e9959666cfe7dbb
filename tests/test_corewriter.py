"""The capture's core writer (`heapwalk.cli.corewriter`) without a process: which pages of a mapping go into
the core, read from a made-up /proc/PID/pagemap, and the ELF notes it writes."""

from __future__ import annotations

import os
import struct

from heapwalk.cli import corewriter
from heapwalk.cli.corewriter import PAGE, Mapping, _file_note, _note, _runs, _write_nonzero

PRESENT, SWAPPED, FILE_PAGE, EXCLUSIVE = 1 << 63, 1 << 62, 1 << 61, 1 << 56
BASE = 0x7F0000000000


def _pagemap(tmp_path, entries: list[int]) -> int:
    """A file laid out as /proc/PID/pagemap with ENTRIES for the pages from BASE."""
    path = tmp_path / "pagemap"
    with open(path, "wb") as f:
        f.seek(BASE // PAGE * 8)
        f.write(struct.pack(f"<{len(entries)}Q", *entries))
    return os.open(path, os.O_RDONLY)


def test_an_anonymous_mapping_keeps_its_resident_and_swapped_pages(tmp_path):
    own = PRESENT | EXCLUSIVE
    fd = _pagemap(tmp_path, [own, own, 0, SWAPPED, 0, 0, PRESENT, 0])
    try:
        assert _runs(fd, BASE, BASE + 8 * PAGE, 0, False) == [
            (BASE, BASE + 2 * PAGE, False), (BASE + 3 * PAGE, BASE + 4 * PAGE, True),
            (BASE + 6 * PAGE, BASE + 7 * PAGE, True)]  # swapped, or not the process's alone: may be zeros
        assert _runs(fd, BASE, BASE + 8 * PAGE, 2, False) == [(BASE, BASE + 7 * PAGE, True)]
    finally:
        os.close(fd)


def test_a_files_mapping_keeps_only_the_pages_the_process_wrote(tmp_path):
    fd = _pagemap(tmp_path, [PRESENT | FILE_PAGE, PRESENT | EXCLUSIVE, PRESENT | FILE_PAGE, SWAPPED])
    try:
        assert _runs(fd, BASE, BASE + 4 * PAGE, 0, True) == [(BASE + PAGE, BASE + 2 * PAGE, False),
                                                              (BASE + 3 * PAGE, BASE + 4 * PAGE, True)]
    finally:
        os.close(fd)


def test_pages_of_zeros_are_holes(tmp_path):
    path = tmp_path / "core"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        data = bytes(PAGE) + b"x" * PAGE + bytes(2 * PAGE) + b"y" * 10 + bytes(PAGE - 10)
        assert _write_nonzero(fd, memoryview(data), PAGE) == 2 * PAGE
        os.ftruncate(fd, 6 * PAGE)
        assert os.pread(fd, 6 * PAGE, 0) == bytes(PAGE) + data
    finally:
        os.close(fd)


def test_notes_are_as_the_kernel_writes_them():
    note = _note(1, b"abcde")
    namesz, descsz, kind = struct.unpack_from("<III", note)
    assert (namesz, descsz, kind) == (5, 5, 1) and note[12:20] == b"CORE\0\0\0\0" and note[20:28] == b"abcde\0\0\0"
    maps = [Mapping(0x1000, 0x3000, "r--p", 0x2000, 7, "/usr/lib/x.so"), Mapping(0x5000, 0x6000, "rw-p", 0, 0, "")]
    body = _file_note(maps)
    assert struct.unpack_from("<5Q", body) == (1, PAGE, 0x1000, 0x3000, 2) and body.endswith(b"/usr/lib/x.so\0")
    assert corewriter._flags("r-xp") == 5 and corewriter._flags("rw-p") == 6
