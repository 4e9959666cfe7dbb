"""The target's threads as the debugger sees them: numbers, registers, the signal that stopped them."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ThreadRegs", "FATAL_SIGNALS"]


@dataclass(frozen=True)
class ThreadRegs:
    """A target thread as the debugger sees it: gdb's number, its LWP and thread pointer."""

    number: int
    lwp: int
    thread_pointer: int | None
    sp: int | None = None       # its stack pointer
    signal: int | None = None   # the signal that stopped the thread (a core's siginfo), if known
    registers: tuple[tuple[str, int], ...] = ()  # general registers (name, value) of its newest frame
    arguments: tuple[tuple[str, int], ...] = ()  # (where, user pointer) given to malloc's functions (symbols)
    name: str | None = None     # its name (/proc's comm: the debugger's, or what a capture recorded), if known


#: signals that end a process with a crash dump
FATAL_SIGNALS = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV"}
