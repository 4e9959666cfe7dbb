"""What the debugger says of a target, in values the engine reads without gdb: its address space, and the
whole of what a decoder is given (memory, address space, threads, symbols, what a truncated core lacks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from heapwalk.arch import DEFAULT, Architecture
from heapwalk.common.findings import Finding, Kind, Severity
from heapwalk.inferior.elf import Mapping
from heapwalk.inferior.memory import Memory
from heapwalk.inferior.residency import Residency
from heapwalk.inferior.threads import ThreadRegs

__all__ = ["MemoryMap", "Target"]


@dataclass(frozen=True)
class MemoryMap:
    """The target's address space, asked of gdb once per command.

    ``mappings``: 'info proc mappings'.  ``regions``: where anonymous memory may hold chunks (a core's load
    segments, or a live process's mappings).  ``readable``: everything gdb can read (for a core, also the
    sections of the files it maps, which gdb reads from the files), None when gdb cannot say.  ``core``: the
    target is a core file.  ``writable``: the ranges the process could write (a core's writable load
    segments, a live process's writable mappings), None when unknown.
    """

    mappings: list[Mapping]
    regions: list[tuple[int, int]]
    readable: list[tuple[int, int]] | None
    core: bool = False
    writable: list[tuple[int, int]] | None = None


@dataclass(frozen=True)
class Target:
    """One target as the debugger shows it: what a decoder reads, and nothing it must ask gdb for."""

    mem: Memory
    space: MemoryMap
    threads: list[ThreadRegs]
    symbols: Any                # a SymbolSource of the allocator's discovery (debug symbols, or none)
    description: str            # "core file /x/core of /usr/bin/prog", for the header
    missing: list[tuple[int, int]]  # the address ranges a truncated core lacks
    cpus: tuple[int, int] | None = None  # the CPUs online and those the process may run on, when known
    residency: Residency | None = None   # which pages were in RAM, when known
    not_read: tuple = ()                 # (start, end, why) of the memory a capture did not read
    clock_ns: int | None = None          # CLOCK_MONOTONIC at the snapshot (None: a core that does not say)
    present: Any = None                  # (seen) -> what a core that does not say which pages were resident
    #                                      holds (`residency.in_core`; read only when asked: it reads the core,
    #                                      but not the pages SEEN says a walk judged)
    arch: Architecture = DEFAULT         # the processor architecture of its code, registers and TLS
    page_size: int = 4096                # its pages (AT_PAGESZ; some kernels use 16 or 64 KiB)

    def findings(self) -> tuple[Finding, ...]:
        """What the target says of itself: the memory a truncated core lacks, and what a capture left out."""
        out = [f for f in (self.truncation(), self.unread()) if f is not None]
        return tuple(out)

    def unread(self) -> Finding | None:
        """The finding that a capture's core holds no bytes of memory it did not read (None when it read all)."""
        if not self.not_read:
            return None
        total = sum(end - start for start, end, _ in self.not_read)
        why = self.not_read[0][2]
        return Finding(Severity.INFO, self.not_read[0][0], "core file", f"the capture did not read "
                       f"{len(self.not_read)} range(s) of the process's memory ({total} bytes, from "
                       f"{self.not_read[0][0]:#x}: {why}), as a read would have allocated or mapped pages in the "
                       "process; what lies there is reported as unreadable, never as empty", Kind.UNMAPPED)

    def truncation(self) -> Finding | None:
        """The finding that a core lacks part of the process's memory (None for a whole core or a process)."""
        missing = self.missing if self.space.core else []
        if not missing:
            return None
        return Finding(Severity.WARNING, missing[0][0], "core file", f"the core is truncated: {len(missing)} "
                       f"region(s) of the process's memory ({sum(b - a for a, b in missing)} bytes, from "
                       f"{missing[0][0]:#x}) are not in it; what lies there is reported as unreadable, never as "
                       "empty", Kind.UNMAPPED)
