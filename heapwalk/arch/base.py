"""What an architecture module provides: the `Architecture` facts and the `CodeReader` that finds, in a
function's machine code, the few instruction shapes the allocators' discovery looks for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from heapwalk.common.errors import HeapwalkError

__all__ = ["Architecture", "CodeRef", "CodeReader", "UnknownArchitecture"]


class UnknownArchitecture(HeapwalkError):
    """The target is of an architecture (WHAT) heapwalk does not read; NAMES: those it reads."""

    def __init__(self, what: str, names: str):
        super().__init__(f"this target's architecture ({what}) is not one heapwalk reads ({names})")
        self.names = names


@dataclass(frozen=True)
class CodeRef:
    """An instruction at OFFSET of a piece of code that computes (COMPUTES) or reads the address TARGET, relative
    to the program counter; LENGTH bytes long.  ARGUMENT: the argument of a call its result is passed as (the
    register it lands in, or the one the next instruction copies it into), None for another register; END: the
    offset past it (and past that copy); INDIRECT: the word read is an address the code goes on to read or write
    through (a slot of the global offset table, as code reaches a global it does not know to be its own)."""

    offset: int
    target: int
    computes: bool
    length: int
    argument: int | None = None
    end: int = 0
    indirect: bool = False


class CodeReader(Protocol):
    """The instruction shapes discovery reads in code (bytes CODE that start at address AT), no disassembler."""

    def address_refs(self, code: bytes, at: int) -> list[CodeRef]:
        """Every 64-bit address computed or 64-bit word read relative to the program counter."""

    def loads32(self, code: bytes, at: int) -> list[CodeRef]:
        """Every 32-bit word read relative to the program counter (how a compiler reads an `unsigned`)."""

    def all_refs(self, code: bytes, at: int) -> list[CodeRef]:
        """Every address computed or read relative to the program counter, any width, in order."""

    def byte_stores(self, code: bytes, at: int) -> list[int]:
        """The globals whose byte the code stores a constant into."""

    def byte_loads(self, code: bytes, at: int) -> list[int]:
        """The globals the code reads one byte of, in order."""

    def calls(self, code: bytes, at: int) -> list[int]:
        """The targets of the direct calls, in order (a scan may find some inside other instructions)."""

    def first_shift_right(self, code: bytes) -> int | None:
        """The count of the first logical right shift of a 64-bit register by a constant."""

    def first_address(self, code: bytes, at: int) -> int | None:
        """The first address the code computes relative to the program counter."""

    def tls_slot(self, code: bytes, at: int) -> int | None:
        """The GOT slot of the first initial-exec TLS access (the slot holds the variable's TLS offset)."""

    def frame_body(self, code: bytes) -> int | None:
        """Where the body of an unoptimised function (one that sets up a frame pointer first) ends; None for
        other code."""

    def call_at(self, code: bytes, offset: int) -> bool:
        """Whether a direct call starts at OFFSET."""

    def first_load(self, code: bytes, at: int) -> int | None:
        """The global the function's first instruction (past a branch-target marker) reads, or None."""

    def returned_constant(self, code: bytes) -> int | None:
        """The 32-bit constant a function that does nothing else returns, or None."""

    def stored_constant(self, code: bytes) -> int | None:
        """The constant a function that reports one (as jemalloc's mallctl functions report their build's
        configuration) stores to its stack slot before copying it out, or None."""


@dataclass(frozen=True)
class Architecture:
    """One processor architecture as heapwalk reads it.

    ``multiarch``: the folder Debian's multiarch layout keeps its libraries in (lib/MULTIARCH);
    ``thread_pointer`` and ``stack_pointer`` are gdb's names of the registers; ``tls_below_thread_pointer``
    says the static TLS blocks lie below the thread pointer (TLS variant II, x86-64) rather than above it;
    ``tcb_size``: the bytes of the thread control block the static TLS blocks follow when they lie above it;
    ``tcb_intact(word_at, tp)`` whether a thread's control block at TP looks whole, WORD_AT reading a word,
    ``tcb_holds`` what its first word holds then, in words;
    ``pointer_registers``: the general registers that may hold a pointer, callee-saved first (they survive the
    calls into abort); ``mutex_size``: the bytes of a pthread_mutex_t in its C libraries' ABI (an allocator that
    embeds one is laid out by it); ``dtv_at``: where from the thread pointer the thread control block keeps the
    pointer to the thread's dynamic thread vector; ``thread_notes``: the register sets a kernel core holds for
    each thread after its NT_PRSTATUS and NT_FPREGSET, by note type (read with PTRACE_GETREGSET), and the most
    bytes each takes; ``user_space_end``: where a process's addresses end (a word at or above it is no pointer
    of the program's; below x86-64's, a set bit 47 is the kernel's half, which pointers packed into 48 bits
    sign-extend back)."""

    name: str
    multiarch: str
    elf_machine: int
    gdb_names: tuple[str, ...]
    thread_pointer: str
    stack_pointer: str
    page_size: int
    tls_below_thread_pointer: bool
    reloc_tpoff64: int
    reloc_dtpmod64: int
    code: CodeReader
    tcb_intact: Callable[[Callable[[int], int], int], bool]
    tcb_holds: str
    pointer_registers: tuple[str, ...] = ()
    tcb_size: int = 0
    mutex_size: int = 40
    dtv_at: int = 8
    thread_notes: tuple[tuple[int, int], ...] = ()
    user_space_end: int = 1 << 47

    def static_tls(self, thread_pointer: int, span: int) -> tuple[int, int]:
        """[start, end) of the SPAN bytes beside THREAD_POINTER where the static TLS blocks lie (the program's
        nearest to it)."""
        if self.tls_below_thread_pointer:
            return thread_pointer - span, thread_pointer
        return thread_pointer + self.tcb_size, thread_pointer + self.tcb_size + span
