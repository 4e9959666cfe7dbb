"""AArch64 (arm64) as heapwalk reads it: ``adrp``-paired code, ``tpidr`` and TLS variant I (the static TLS
blocks above the thread pointer, past a 16-byte control block), pages of 4, 16 or 64 KiB (the target's
AT_PAGESZ says which)."""

from __future__ import annotations

from heapwalk.arch.arm64 import code
from heapwalk.arch.base import Architecture

__all__ = ["ARM64"]


def _tcb_intact(word_at, tp: int) -> bool:
    """glibc's thread control block (tcbhead_t) starts with the thread's DTV pointer at tpidr: it points past
    the DTV's length, at its generation count, two small numbers."""
    dtv = word_at(tp)
    return bool(dtv) and dtv % 8 == 0 and word_at(dtv - 8) < (1 << 20) and word_at(dtv) < (1 << 32)


ARM64 = Architecture(
    name="arm64", multiarch="aarch64-linux-gnu", elf_machine=183, gdb_names=("aarch64", "aarch64:ilp32"),
    thread_pointer="tpidr", stack_pointer="sp", page_size=4096, tls_below_thread_pointer=False,
    reloc_tpoff64=1030, reloc_dtpmod64=1028, code=code.READER, tcb_intact=_tcb_intact,
    tcb_holds="a pointer to its DTV", tcb_size=16, mutex_size=48, dtv_at=0,
    thread_notes=((0x401, 8),),           # NT_ARM_TLS: tpidr_el0 (not the tpidr2 after it, which gdb 13 refuses)
    user_space_end=1 << 48,               # 48-bit virtual addresses: mappings near 0xffff..., the heap 0xaaaa...
    pointer_registers=tuple(f"x{n}" for n in (19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, *range(19), 30)))
