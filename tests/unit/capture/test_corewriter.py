"""The capture's core writer (`heapwalk.capture.corewriter`) and the page rules it shares with live reads
(`heapwalk.inferior.pages`), without a process: which pages of a mapping are read, filled or left out, from a
made-up page map, and the ELF notes it writes."""

from __future__ import annotations

import os
import struct

import numpy as np

from heapwalk.capture import coreplan
from heapwalk.capture.corenotes import file_note, note
from heapwalk.capture.coreplan import PAGE, _codes, _mapping_segments
from heapwalk.capture.corewriter import _write_nonzero
from heapwalk.inferior.pages import MapsLine, Page, classify

PRESENT, SWAPPED, FILE_PAGE, EXCLUSIVE = 1 << 63, 1 << 62, 1 << 61, 1 << 56
BASE = 0x7F0000000000
OWN = PRESENT | EXCLUSIVE


def _map(perms: str, name: str = "", inode: int = 0, pages: int = 8) -> MapsLine:
    return MapsLine(BASE, BASE + pages * PAGE, perms, 0, "fd:01" if inode else "00:00", inode, name)


def _entries(*words: int) -> np.ndarray:
    return np.array(words, dtype=np.uint64)


class _Pages:
    """What `_codes` asks of a `LivePages`: whether a mapping is a device's."""

    def device(self, m):
        return False


def test_untouched_anonymous_memory_is_zeros_and_never_read():
    m = _map("rw-p", pages=5)
    kinds = classify(_entries(OWN, 0, SWAPPED, PRESENT, 0), m, False)
    assert kinds.tolist() == [Page.OWN, Page.ZEROS, Page.SWAPPED, Page.OWN, Page.ZEROS]
    not_resident, not_read = [], []
    segments = _mapping_segments(m, _codes(_Pages(), m, kinds, False), kinds, 0, not_resident, not_read)
    # stored pages read from memory, untouched ones zero-filled segments with no bytes, never read
    assert [(s.start - BASE, s.end - BASE, s.filesz) for s in segments] == [
        (0, PAGE, PAGE), (PAGE, 2 * PAGE, 0), (2 * PAGE, 4 * PAGE, 2 * PAGE), (4 * PAGE, 5 * PAGE, 0)]
    assert all(source == "mem" for s in segments for _, _, source in s.pieces)
    assert not_resident == [(BASE + 2 * PAGE, BASE + 3 * PAGE)] and not_read == []


def test_joined_runs_fill_known_zeros_without_reading_them():
    m = _map("rw-p", pages=4)
    kinds = classify(_entries(OWN, 0, 0, OWN), m, False)
    segments = _mapping_segments(m, _codes(_Pages(), m, kinds, False), kinds, 2, [], [])
    assert len(segments) == 1 and segments[0].pieces == (
        (BASE, BASE + PAGE, "mem"), (BASE + PAGE, BASE + 3 * PAGE, "zeros"), (BASE + 3 * PAGE, BASE + 4 * PAGE, "mem"))


def test_untouched_shared_memory_is_not_read_and_is_no_segment():
    for m in (_map("rw-s", "/dev/zero (deleted)", 17, 4), _map("rw-s", "/memfd:x (deleted)", 18, 4)):
        kinds = classify(_entries(PRESENT, 0, 0, PRESENT | FILE_PAGE), m, True)
        assert kinds.tolist() == [Page.OWN, Page.ABSENT, Page.ABSENT, Page.FILE_PAGE]
        not_read = []
        segments = _mapping_segments(m, _codes(_Pages(), m, kinds, False), kinds, 0, [], not_read)
        assert [(s.start - BASE, s.end - BASE) for s in segments] == [(0, PAGE), (3 * PAGE, 4 * PAGE)]
        assert [(a - BASE, b - BASE) for a, b, _ in not_read] == [(PAGE, 3 * PAGE)]
        assert "shared memory the process has not touched" in not_read[0][2]


def test_a_writable_file_mapping_is_kept_whole_its_untouched_pages_from_the_file():
    m = _map("rw-p", "/usr/lib/libx.so", 5, 4)
    kinds = classify(_entries(OWN, PRESENT | FILE_PAGE, 0, 0), m, True, file_pages=3)
    assert kinds.tolist() == [Page.OWN, Page.FILE_PAGE, Page.FILE, Page.ABSENT]   # the last page: past the file
    not_resident, not_read = [], []
    segments = _mapping_segments(m, _codes(_Pages(), m, kinds, False), kinds, 0, not_resident, not_read)
    assert segments[0].pieces == ((BASE, BASE + 2 * PAGE, "mem"), (BASE + 2 * PAGE, BASE + 3 * PAGE, "file"))
    assert not_resident == [(BASE + 2 * PAGE, BASE + 3 * PAGE)] and [(a - BASE, b - BASE) for a, b, _ in not_read] \
        == [(3 * PAGE, 4 * PAGE)]


def test_read_only_file_pages_are_left_to_the_file_but_the_elf_header_is_kept():
    m = _map("r--p", "/usr/lib/libx.so", 5, 3)
    kinds = classify(_entries(PRESENT | FILE_PAGE, 0, PRESENT | FILE_PAGE), m, True)
    code = _codes(_Pages(), m, kinds, True)
    segments = _mapping_segments(m, code, kinds, 0, [], [])
    assert [(s.start - BASE, s.filesz) for s in segments] == [(0, PAGE), (PAGE, 0)]
    # with the files kept whole (capture --full), every page, those not in RAM from the file
    whole = _mapping_segments(m, _codes(_Pages(), m, kinds, True, True), kinds, 0, [], [])
    assert whole[0].pieces == ((BASE, BASE + PAGE, "mem"), (BASE + PAGE, BASE + 2 * PAGE, "file"),
                               (BASE + 2 * PAGE, BASE + 3 * PAGE, "mem"))


def test_a_file_that_cannot_be_read_leaves_its_untouched_pages_out():
    m = _map("rw-p", "/gone/libx.so", 5, 2)
    kinds = classify(_entries(OWN, 0), m, False)
    assert kinds.tolist() == [Page.OWN, Page.ABSENT]


def test_devices_and_the_kernels_mappings_are_never_read():
    m = _map("rw-s", "/dev/dri/card0", 9, 2)
    assert classify(_entries(PRESENT, 0), m, False, device=True).tolist() == [Page.ABSENT, Page.ABSENT]
    assert classify(_entries(PRESENT), _map("r--p", "[vvar]", 0, 1), False).tolist() == [Page.ABSENT]


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
    record = note(1, b"abcde")
    namesz, descsz, kind = struct.unpack_from("<III", record)
    assert (namesz, descsz, kind) == (5, 5, 1) and record[12:20] == b"CORE\0\0\0\0" and record[20:28] == b"abcde\0\0\0"
    maps = [MapsLine(0x1000, 0x3000, "r--p", 0x2000, "fd:01", 7, "/usr/lib/x.so"),
            MapsLine(0x5000, 0x6000, "rw-p", 0, "00:00", 0, "")]
    body = file_note(maps)
    assert struct.unpack_from("<5Q", body) == (1, PAGE, 0x1000, 0x3000, 2) and body.endswith(b"/usr/lib/x.so\0")
    assert coreplan._flags("r-xp") == 5 and coreplan._flags("rw-p") == 6
