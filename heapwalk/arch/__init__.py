"""The processor architectures heapwalk reads, behind one seam: what differs between them (instruction shapes
in a library's code, the thread pointer and the TLS layout, register names, page size, relocation numbers) is
an `Architecture`, one module an architecture, chosen once per target (by the ELF machine of an image or a
core, or by the name gdb gives).  Nothing outside this folder names an architecture."""

from __future__ import annotations

import os

from heapwalk.arch.base import Architecture, CodeRef, CodeReader, UnknownArchitecture
from heapwalk.arch.arm64 import ARM64
from heapwalk.arch.x86_64 import X86_64

__all__ = ["Architecture", "CodeRef", "CodeReader", "UnknownArchitecture", "DEFAULT", "known", "register",
           "by_elf_machine", "by_gdb_name", "host", "USER_SPACE_END"]

_KNOWN: list[Architecture] = [X86_64, ARM64]
#: the architecture a target is read as when nothing says which it is (an address space without an ELF header)
DEFAULT = X86_64
#: where the address space of a process of any architecture heapwalk reads ends: a word at or above it points
#: to nothing of a program's (a search that does not know the target's architecture bounds pointers by it)
USER_SPACE_END = max(a.user_space_end for a in _KNOWN)


def known() -> tuple[Architecture, ...]:
    """Every architecture heapwalk reads."""
    return tuple(_KNOWN)


def register(arch: Architecture) -> None:
    """Adds ARCH to the known architectures (a test's toy architecture, or a new module of this folder)."""
    if arch not in _KNOWN:
        _KNOWN.append(arch)


def by_elf_machine(machine: int) -> Architecture:
    """The architecture of an ELF file whose header says e_machine MACHINE; UnknownArchitecture when none."""
    for arch in _KNOWN:
        if arch.elf_machine == machine:
            return arch
    raise UnknownArchitecture(f"ELF machine {machine}", _names())


def by_gdb_name(name: str) -> Architecture:
    """The architecture gdb calls NAME ('i386:x86-64'); UnknownArchitecture when none."""
    for arch in _KNOWN:
        if name in arch.gdb_names:
            return arch
    raise UnknownArchitecture(name, _names())


def host() -> Architecture | None:
    """The architecture of the machine heapwalk runs on (None when it reads none such)."""
    machine = os.uname().machine
    return next((a for a in _KNOWN if a.multiarch.split("-")[0] == machine), None)


def _names() -> str:
    return ", ".join(a.name for a in _KNOWN)
