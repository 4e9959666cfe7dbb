"""Reading a running process without faulting a page in (`heapwalk.inferior.pages`), on this very process: its
own untouched private, shared and file memory, read through the rules, stays untouched."""

from __future__ import annotations

import ctypes
import mmap
import os

import numpy as np
import pytest

from heapwalk.inferior.memory import ReadError
from heapwalk.inferior.pages import PAGE, LivePages, Page

MiB = 1 << 20


def _address(area: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(area))


def _present(address: int, size: int) -> int:
    with open("/proc/self/pagemap", "rb", buffering=0) as f:
        entries = np.frombuffer(os.pread(f.fileno(), size // PAGE * 8, address // PAGE * 8), dtype=np.uint64)
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum())


def _raw(address: int, size: int) -> bytes:
    fd = os.open("/proc/self/mem", os.O_RDONLY)
    try:
        return os.pread(fd, size, address)
    finally:
        os.close(fd)


@pytest.fixture
def areas(tmp_path):
    """Private anonymous, shared anonymous and private file memory of this process, 2 pages of each written
    or read in; and the file's bytes."""
    content = bytes(range(256)) * (3 * PAGE // 256) + b"tail"
    (tmp_path / "data").write_bytes(content)
    private = mmap.mmap(-1, 64 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    shared = mmap.mmap(-1, 64 * PAGE, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    with open(tmp_path / "data", "rb") as f:
        filemap = mmap.mmap(f.fileno(), len(content), flags=mmap.MAP_PRIVATE,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE)
    private[:2 * PAGE] = b"p" * 2 * PAGE
    shared[:2 * PAGE] = b"s" * 2 * PAGE
    filemap[:1] = b"X"                                    # one page written: the rest is still the file's
    for area in (private, shared):
        area.madvise(mmap.MADV_NOHUGEPAGE)
    yield {"private": private, "shared": shared, "file": filemap, "content": content}
    for area in (private, shared, filemap):
        area.close()


def test_reads_through_the_rules_fault_nothing_in(areas):
    private, shared, filemap = (areas[k] for k in ("private", "shared", "file"))
    before = {k: _present(_address(a), len(a) // PAGE * PAGE) for k, a in (("private", private),
                                                                              ("shared", shared))}
    with LivePages(os.getpid()) as pages:
        # private anonymous memory: the written pages read, the untouched ones zeros without a read
        data = pages.read(_address(private), 64 * PAGE, _raw)
        assert data == b"p" * 2 * PAGE + bytes(62 * PAGE)
        # shared memory: the touched pages read, the rest never (ReadError at its first byte)
        assert pages.read(_address(shared), 2 * PAGE, _raw) == b"s" * 2 * PAGE
        with pytest.raises(ReadError) as caught:
            pages.read(_address(shared), 4 * PAGE, _raw)
        assert caught.value.address == _address(shared) + 2 * PAGE and "shared memory" in caught.value.reason
        assert (_address(shared) + 2 * PAGE, _address(shared) + 64 * PAGE) in pages.absent()
        # a private file mapping: the written page from memory, the others from the file, zeros after its end
        content = areas["content"]
        got = pages.read(_address(filemap), len(content), _raw)
        assert got == b"X" + content[1:]
    after = {k: _present(_address(a), len(a) // PAGE * PAGE) for k, a in (("private", private),
                                                                            ("shared", shared))}
    assert before == after == {"private": 2, "shared": 2}


def test_pages_are_classified_from_the_page_map(areas):
    with LivePages(os.getpid()) as pages:
        m = pages.mapping_at(_address(areas["private"]))
        kinds = pages.pages(m, _address(areas["private"]), _address(areas["private"]) + 4 * PAGE)
        assert kinds.tolist() == [Page.OWN, Page.OWN, Page.ZEROS, Page.ZEROS]
        m = pages.mapping_at(_address(areas["file"]))
        assert pages.pages(m).tolist() == [Page.OWN, Page.FILE, Page.FILE, Page.FILE]


def test_the_zero_page_mapped_by_a_read_is_not_resident():
    """A page only ever read (by the process, or by a tool that faulted it in) maps the kernel's zero page:
    present in the page map, but no RAM of the process's (known from /proc/kpageflags: the tests run as
    root)."""
    from heapwalk.inferior.residency import present_runs
    from heapwalk.inferior.pages import ZeroPages

    area = mmap.mmap(-1, 8 * PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        area.madvise(mmap.MADV_NOHUGEPAGE)
        start = _address(area)
        area[0:1] = b"w"                                   # written: the process's own page
        assert area[PAGE * 3] == 0                          # read: the zero page
        assert _present(start, 8 * PAGE) == 2
        with LivePages(os.getpid()) as pages:
            kinds = pages.pages(pages.mapping_at(start), start, start + 4 * PAGE)
            assert kinds.tolist() == [Page.OWN, Page.ZEROS, Page.ZEROS, Page.ZERO_PAGE]
        zero = ZeroPages()
        with open("/proc/self/pagemap", "rb", buffering=0) as f:
            assert present_runs(f.fileno(), start, start + 8 * PAGE, zero) == [(start, start + PAGE)]
            assert present_runs(f.fileno(), start, start + 8 * PAGE) == [(start, start + PAGE),
                                                                      (start + 3 * PAGE, start + 4 * PAGE)]
        zero.close()
    finally:
        area.close()


def test_no_page_map_means_nothing_is_read():
    """Where the page map cannot be read (no such process here; a process this user may not read), nothing
    is read at all, and the reason is said."""
    from heapwalk.inferior.pages import PagesUnknown

    with pytest.raises(PagesUnknown, match=r"cannot read /proc/\d+/pagemap"):
        LivePages(2 ** 22 + 12345)
