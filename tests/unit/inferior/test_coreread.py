"""A core's memory read from its file (`inferior.coreread`): the bytes of the load segments as stored, nothing
the file does not hold (what gdb takes from elsewhere, a truncated tail, segments that overlap)."""

from __future__ import annotations

import struct

import numpy as np

from heapwalk.inferior.coreread import CoreReader

PAGE = 4096


def _core(tmp_path, segments, cut: int = 0):
    """A core file of SEGMENTS (vaddr, memsz, contents: the stored bytes, as many as filesz), its last CUT bytes
    cut off; its path."""
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<HH", header, 16, 4, 62)                  # ET_CORE, EM_X86_64
    struct.pack_into("<Q", header, 32, 64)
    struct.pack_into("<HH", header, 54, 56, len(segments))
    table, data = b"", b""
    offset = -(-(64 + 56 * len(segments)) // PAGE) * PAGE
    for vaddr, memsz, contents in segments:
        table += struct.pack("<IIQQQQQQ", 1, 6, offset + len(data), vaddr, 0, len(contents), memsz, PAGE)
        data += contents
    image = bytes(header) + table
    image += bytes(offset - len(image)) + data
    path = tmp_path / "core"
    path.write_bytes(image[:len(image) - cut])
    return str(path)


def _random(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_the_stored_bytes_are_read_and_nothing_else(tmp_path):
    heap, stub = _random(8 * PAGE, 1), _random(PAGE, 2)
    path = _core(tmp_path, [(0x10000, 8 * PAGE, heap), (0x40000, 4 * PAGE, stub),       # a file's: 3 pages not stored
                            (0x80000, 2 * PAGE, _random(2 * PAGE, 3)), (0x81000, PAGE, _random(PAGE, 4))])
    core = CoreReader.open(path)
    try:
        assert core.read(0x10000, 8 * PAGE) == heap and core.read(0x10008, 24) == heap[8:32]
        assert core.read(0x40000, PAGE) == stub
        assert core.read(0x40000, PAGE + 8) is None                # past what the file stores: gdb's to read
        assert core.read(0x10000 + 8 * PAGE - 8, 16) is None       # across two segments
        assert core.read(0x80000, 8) is None and core.read(0x81000, 8) is None   # overlapping: gdb picks
        assert core.read(0x5000, 8) is None
        assert core.samples() and all(core.read(a, 64) is not None for a in core.samples())
        room = bytearray(PAGE)                                     # read into room of the caller's: the same
        assert core.read_into(0x10008, room) and bytes(room) == heap[8:PAGE + 8]
        assert not core.read_into(0x40000 + 8, room) and not core.read_into(0x80000, room)
    finally:
        core.close()
    assert CoreReader.open("core") is None                         # a relative path: gdb's may differ
    assert CoreReader.open(str(tmp_path / "none")) is None


def test_a_truncated_core_is_read_only_as_far_as_it_goes(tmp_path):
    path = _core(tmp_path, [(0x10000, 4 * PAGE, _random(4 * PAGE, 5))], cut=PAGE + 16)
    core = CoreReader.open(path)
    try:
        assert core.read(0x10000, 3 * PAGE - 16) is not None
        assert core.read(0x10000, 3 * PAGE) is None
    finally:
        core.close()


def test_a_list_is_followed_through_the_file_in_c_as_in_python(tmp_path, monkeypatch):
    """`CoreReader.links`: the head, then each link read, to COUNT links, a null one, a node whose word the file
    does not hold, or a node met again (C stops within a few steps of it: the caller judges the nodes)."""
    from heapwalk.inferior import coreread
    base, words = 0x20000, np.zeros(2 * PAGE // 8, dtype=np.uint64)
    order = np.random.default_rng(7).permutation(np.arange(1, 200))
    for a, b in zip(order[:-1], order[1:]):
        words[a] = base + 8 * b                                  # a list through the page, in random order
    words[order[-1]] = 0
    words[300], words[301], words[302] = base + 8 * 301, base + 8 * 302, base + 8 * 300   # a loop of three
    words[400] = 0x90000                                         # out of the core
    path = _core(tmp_path, [(base, 2 * PAGE, words.tobytes())])
    head = base + 8 * int(order[0])
    expected = [head] + [base + 8 * int(b) for b in order[1:]] + [0]
    for native in (True, False):
        if not native:
            monkeypatch.setattr(coreread, "_LIB", None)
        core = CoreReader.open(path)
        try:
            assert core.links(head, 1000) == expected
            assert core.links(head, 5) == expected[:6]
            assert core.links(head, 0) == [head] == core.links(head, -7)
            looped = core.links(base + 8 * 300, 1000)
            assert looped[:4] == [base + 8 * 300, base + 8 * 301, base + 8 * 302, base + 8 * 300] and len(looped) < 12
            assert core.links(base + 8 * 400, 10) == [base + 8 * 400, 0x90000]
            assert core.links(0x90000, 10) == [0x90000]
        finally:
            core.close()
