"""Where a process's addresses end, by architecture: x86-64's below 2**47, arm64's below 2**48 (a real arm64
kernel maps libraries near 0xffff_..., the heap near 0xaaaa_...: every pointer bound holds them), and how
jemalloc's one-word radix tree entries give back an address (sign-extended from bit 47 on x86-64, zero above
bit 48 on arm64)."""

from __future__ import annotations

import numpy as np

from heapwalk.arch import USER_SPACE_END
from heapwalk.arch.arm64 import ARM64
from heapwalk.arch.x86_64 import X86_64
from heapwalk.glibc.locate.mpshape import mp_plausible
from heapwalk.jemalloc.layout import LAYOUTS
from heapwalk.jemalloc.rtree import shape_for

HEAP = 0xAAAAEA5D5000       # where an arm64 kernel put a process's heap (its brk)


def _mp(sbrk_base: int) -> dict[str, int]:
    return {"arena_test": 8, "arena_max": 0, "mmap_threshold": 128 << 10, "n_mmaps": 0, "max_n_mmaps": 0,
            "no_dyn_threshold": 0, "mmapped_mem": 0, "max_mmapped_mem": 0, "sbrk_base": sbrk_base}


def test_each_architecture_bounds_its_processes_addresses():
    assert (X86_64.user_space_end, ARM64.user_space_end, USER_SPACE_END) == (1 << 47, 1 << 48, 1 << 48)
    assert mp_plausible(_mp(HEAP), ARM64.user_space_end) and not mp_plausible(_mp(HEAP), X86_64.user_space_end)
    assert mp_plausible(_mp(0x555555559000), X86_64.user_space_end)


def test_a_compact_radix_tree_entry_gives_back_its_architectures_address():
    layout = LAYOUTS[(5, 3, 0)]
    entry = np.array([0xFFFFB81A0000 | (7 << 48) | 1], dtype=np.uint64).tobytes()
    arm, x86 = shape_for(48, 16, ARM64.user_space_end), shape_for(48, 12, X86_64.user_space_end)
    assert int(arm.decode(entry, layout)[0][0]) == 0xFFFFB81A0000            # a user address on arm64
    assert int(x86.decode(entry, layout)[0][0]) == 0xFFFFFFFFB81A0000        # the kernel's half on x86-64
    assert int(arm.decode(entry, layout)[1][0]) == int(x86.decode(entry, layout)[1][0]) == 7
