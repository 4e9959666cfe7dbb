"""The one base of every error heapwalk raises on purpose, so that a front end can tell a failure heapwalk
understands (said in one line) from a bug (a traceback with 'set heapwalk debug on')."""

from __future__ import annotations

__all__ = ["HeapwalkError", "UsageError", "CannotDecode", "PARTIAL", "UNCHECKED"]

#: what ends a report that leaves out an allocator in the process (heapwalk cannot decode it): gdb's error line
#: then says so, and the command line's exit status (3)
PARTIAL = "the report is partial:"
#: what ends a check that left out an allocator in the process: never read as "the heap is consistent"
UNCHECKED = "not everything was checked:"


class HeapwalkError(Exception):
    """A failure heapwalk understands and can say in one line: memory it cannot read, a target it cannot
    decode, arguments it cannot use."""


class UsageError(HeapwalkError):
    """A mistake in the command line or in what it names (an arena, a thread, an address): one line."""


class CannotDecode(HeapwalkError):
    """An allocator is in the target but cannot be decoded there; the message says what is missing."""
