"""x86-64 (AMD64) as heapwalk reads it: RIP-relative code, $fs_base and TLS variant II, 4 KiB pages."""

from __future__ import annotations

from heapwalk.arch.base import Architecture
from heapwalk.arch.x86_64 import code

__all__ = ["X86_64"]


def _tcb_intact(word_at, tp: int) -> bool:
    """glibc's thread control block starts with a pointer to itself (tcbhead_t.tcb) at $fs_base."""
    return word_at(tp) == tp


X86_64 = Architecture(
    name="x86-64", multiarch="x86_64-linux-gnu", elf_machine=62, gdb_names=("i386:x86-64", "i386:x86-64:intel"), thread_pointer="fs_base",
    stack_pointer="rsp", page_size=4096, tls_below_thread_pointer=True, reloc_tpoff64=18, reloc_dtpmod64=16,
    code=code.READER, tcb_intact=_tcb_intact, tcb_holds="a pointer to itself", mutex_size=40, user_space_end=1 << 47,
    pointer_registers=("rbx", "rbp", "r12", "r13", "r14", "r15", "rdi", "rsi", "rdx", "rcx", "rax", "r8", "r9",
                       "r10", "r11"))
