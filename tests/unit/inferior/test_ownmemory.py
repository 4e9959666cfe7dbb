"""heapwalk's own memory while a command runs (heapwalk/inferior/ownmemory.py): big arrays come from malloc's
heap and stay there for the next ones, and numpy asks no huge pages for them; afterwards glibc's thresholds and
numpy's setting are back and the pages given back."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from heapwalk.inferior import ownmemory

_PROBE = textwrap.dedent("""
    import numpy as np
    from heapwalk.inferior.ownmemory import freed_memory_kept

    def in_heap(array):
        at = array.ctypes.data
        for line in open("/proc/self/maps"):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= at < hi:
                return line.rstrip().endswith("[heap]")
        raise AssertionError("not mapped")

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096

    before = in_heap(np.ones(8 << 20))
    with freed_memory_kept():
        first = np.ones(8 << 20)
        inside = in_heap(first)
        at = first.ctypes.data
        del first
        reused = np.ones(8 << 20).ctypes.data == at
        held = rss()
    after = in_heap(np.ones(8 << 20))
    print(before, inside, reused, after, held - rss() > (32 << 20))
""")


def test_arrays_come_from_the_heap_and_are_reused_only_while_a_command_runs():
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "True", "False", "True"]


def test_a_user_who_tuned_gdbs_malloc_keeps_the_tuning(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert ownmemory._libc() is None
    monkeypatch.delenv("GLIBC_TUNABLES")
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4096")
    assert ownmemory._libc() is None
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    assert ownmemory._libc() is not None


_HUGE_PROBE = textwrap.dedent("""
    import numpy as np
    from heapwalk.inferior.ownmemory import freed_memory_kept

    def advised(array):
        at, flags, inside = array.ctypes.data, {}, False
        for line in open("/proc/self/smaps"):
            head = line.split()
            if "-" in head[0] and len(head) >= 5:
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                inside = lo <= at + (8 << 20) < hi
            elif head[0] == "VmFlags:" and inside:
                return "hg" in head[1:]
        raise AssertionError("not mapped")

    outside = advised(np.ones(8 << 20))
    with freed_memory_kept():
        inside = advised(np.ones(8 << 20))
    print(outside, inside, advised(np.ones(8 << 20)))
""")


def test_numpy_asks_no_huge_pages_while_a_command_runs_unless_the_user_says(monkeypatch):
    asks = str(os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"))   # a kernel with huge pages
    run = [sys.executable, "-c", _HUGE_PROBE]
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.split() == [asks, "False", asks]
    monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
    assert subprocess.run(run, capture_output=True, text=True, check=True).stdout.split() == [asks, asks, asks]


_GIVE_BACK_PROBE = textwrap.dedent("""
    import numpy as np
    from heapwalk.inferior.ownmemory import freed_memory_kept, give_back

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096

    with freed_memory_kept():
        kept = [np.ones(4 << 20) for _ in range(8)]     # 256 MiB, then every other array freed: holes
        del kept[::2]
        before = rss()
        give_back()
        given = before - rss()
        more = np.ones(4 << 20)                          # the holes still serve the next arrays
        reused = any(abs(more.ctypes.data - k.ctypes.data) < (64 << 20) for k in kept)
    outside = rss()
    give_back()                                          # outside a command: nothing kept, nothing to do
    print(given > (96 << 20), reused, abs(rss() - outside) < (8 << 20))
""")


def test_give_back_returns_the_holes_a_phase_left_while_a_command_runs():
    out = subprocess.run([sys.executable, "-c", _GIVE_BACK_PROBE], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "True", "True"]
