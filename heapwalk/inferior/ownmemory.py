"""heapwalk's own memory, in gdb's process: what numpy frees while a command runs is kept for the next array,
and given back to the system when the command ends.

A decode makes and drops thousands of arrays of tens or hundreds of megabytes.  glibc's malloc maps each one
afresh and unmaps it when freed, so every array pays the kernel's page faults again (0.2 s a GiB on bare
metal, over 1 s in some virtual machines, where memory the guest gave back is faulted in from the host).
While a command runs, the thresholds above which malloc maps a block of its own and gives the top of its heap
back are raised, so a freed array's pages serve the next one; when it ends, they are set back and
`malloc_trim` returns every free page.  Kept pages also stay resident beside the arrays of the command's next
phase, whose sizes differ: between phases (the decode's end, the leak scan's start and end) `give_back` returns
them (80 MiB of 360 at the peak of `report` on the random large bench core).  Nothing changes where gdb's
malloc is not glibc's, or where the user tuned these thresholds for gdb (their environment says so).

numpy also asks the kernel for huge pages for every array of 4 MiB or more (madvise).  A huge page is a free
2 MiB block of the machine's memory, cleared whole at its first touch; in a virtual machine whose balloon
reports free 2 MiB blocks to the host (virtio's free page reporting, as on the bench's machine), the host must
provide each one again, page by page, where small pages come mostly from memory freed lately and still there:
`report`'s system time halved without huge pages (docs/performance.md).  While a command runs numpy does not
ask, unless the user's environment says whether it should (NUMPY_MADVISE_HUGEPAGE).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os

__all__ = ["freed_memory_kept", "give_back"]

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: the thresholds while a command runs: more than any array heapwalk makes
_HELD = 1 << 30
#: glibc's defaults, set back after the command
_DEFAULT = 128 << 10
_TUNED = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def _libc():
    """The C library's mallopt and malloc_trim, when gdb's malloc is glibc's and the user left it untuned."""
    if any(os.environ.get(name) for name in _TUNED) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return None
    try:
        lib = ctypes.CDLL(None)
        mallopt, trim = lib.mallopt, lib.malloc_trim
        lib.gnu_get_libc_version  # glibc's own, not a lookalike's
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return mallopt, trim


_LIBC = _libc()


def _hugepage_switch():
    """numpy's switch for asking huge pages for its arrays (it gives the setting before), or None where this numpy
    has none or the user set it in the environment."""
    if "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return None
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            return getattr(importlib.import_module(module), "_set_madvise_hugepage")
        except (ImportError, AttributeError):
            continue
    return None


_HUGEPAGES = _hugepage_switch()
#: whether the thresholds are held now (`freed_memory_kept`)
_HOLDING = [False]


@contextlib.contextmanager
def freed_memory_kept():
    """While it lasts, memory heapwalk frees stays in gdb's heap for its next arrays, and numpy asks no huge pages
    (see the module); at its end, the thresholds are glibc's defaults again, the free pages are given back, and
    numpy's setting is what it was."""
    before = _HUGEPAGES(False) if _HUGEPAGES is not None else None
    try:
        with _heap_kept():
            yield
    finally:
        if before is not None:
            _HUGEPAGES(before)


@contextlib.contextmanager
def _heap_kept():
    """freed_memory_kept's part in glibc's malloc."""
    if _LIBC is None:
        yield
        return
    mallopt, trim = _LIBC
    held = mallopt(_M_MMAP_THRESHOLD, _HELD) == 1 and mallopt(_M_TRIM_THRESHOLD, _HELD) == 1
    _HOLDING[0] = held
    try:
        yield
    finally:
        _HOLDING[0] = False
        mallopt(_M_MMAP_THRESHOLD, _DEFAULT)
        mallopt(_M_TRIM_THRESHOLD, _DEFAULT)
        if held:
            trim(0)


def give_back() -> None:
    """Gives the free pages of gdb's heap back to the system now, while `freed_memory_kept` keeps them: for a command
    between two phases whose arrays are of other sizes (the decode's and the leak scan's), where the holes the
    first left would otherwise stay resident beside the second's arrays (80 MiB of 360 at the peak of `report` on
    the large random bench core).  Nothing where nothing is kept."""
    if _HOLDING[0] and _LIBC is not None:
        _LIBC[1](0)
