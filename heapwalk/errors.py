"""The one base of every error heapwalk raises on purpose, so that a front end can tell a failure heapwalk
understands (said in one line) from a bug (a traceback with 'set heapwalk debug on')."""

from __future__ import annotations

__all__ = ["HeapwalkError"]


class HeapwalkError(Exception):
    """A failure heapwalk understands and can say in one line: memory it cannot read, a target it cannot
    decode, arguments it cannot use."""
