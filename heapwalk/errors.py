"""The one base of every error heapwalk raises on purpose, so that a front end can tell a failure heapwalk
understands (said in one line) from a bug (a traceback with 'set heapwalk debug on')."""

from __future__ import annotations

__all__ = ["HeapwalkError", "UsageError", "CannotDecode"]


class HeapwalkError(Exception):
    """A failure heapwalk understands and can say in one line: memory it cannot read, a target it cannot
    decode, arguments it cannot use."""


class UsageError(HeapwalkError):
    """A mistake in the command line or in what it names (an arena, a thread, an address): one line."""


class CannotDecode(HeapwalkError):
    """An allocator is in the target but cannot be decoded there; the message says what is missing."""
